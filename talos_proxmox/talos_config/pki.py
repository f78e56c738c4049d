"""Small X.509 primitives for the Talos PKI: certificate authorities, issued certificates, PEM helpers.

Pure functions over PEM bytes, no Pulumi. The shapes follow what Talos itself produces
(siderolabs/crypto): CAs carry only an Organization (or only a CommonName), the CA flag,
key usage cert-sign + digital-signature and extended usage server+client auth; issued
certificates are leaves with the key type of the caller's choice.

Private keys come out as:
  - ed25519:    PKCS#8 DER under the standard "PRIVATE KEY" label (loadable by OpenSSL/BoringSSL,
                grpcio and Python's ssl); `talos_key_pem` relabels it "ED25519 PRIVATE KEY" the way
                talosctl writes it in secrets bundles and talosconfig;
  - ecdsa-p256: SEC1 under "EC PRIVATE KEY" (what Talos writes too);
  - rsa:        PKCS#1 under "RSA PRIVATE KEY" (what Talos writes too).
`load_key` accepts all of these labels.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from typing import Iterable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_TYPES = ("ed25519", "ecdsa-p256", "rsa-2048", "rsa-4096")

# Talos (siderolabs/crypto) labels PKCS#8 ed25519 keys with this non-standard PEM type.
TALOS_ED25519_KEY_LABEL = b"ED25519 PRIVATE KEY"
_PKCS8_LABEL = b"PRIVATE KEY"

PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class PKIError(ValueError):
    """A certificate or key could not be read or does not fit. Messages never include key material."""


# --- keys -------------------------------------------------------------------------------------


def new_private_key(key_type: str) -> PrivateKey:
    """A fresh private key of one of KEY_TYPES."""
    if key_type == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if key_type == "ecdsa-p256":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa-2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    if key_type == "rsa-4096":
        return rsa.generate_private_key(public_exponent=65537, key_size=4096)
    raise PKIError(f"key_type {key_type!r} is not supported; expected one of {', '.join(KEY_TYPES)}")


def key_type_of(key) -> str:
    """The KEY_TYPES name of a private or public key (rsa sizes other than 2048/4096 give 'rsa-<bits>')."""
    if isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        return "ed25519"
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        if isinstance(key.curve, ec.SECP256R1):
            return "ecdsa-p256"
        return f"ecdsa-{key.curve.name}"
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return f"rsa-{key.key_size}"
    raise PKIError(f"unsupported key algorithm {type(key).__name__}")


def encode_private_key(key: PrivateKey) -> bytes:
    """PEM of a private key in the encoding described in the module docstring."""
    if isinstance(key, ed25519.Ed25519PrivateKey):
        fmt = serialization.PrivateFormat.PKCS8
    elif isinstance(key, ec.EllipticCurvePrivateKey):
        fmt = serialization.PrivateFormat.TraditionalOpenSSL  # SEC1, "EC PRIVATE KEY"
    elif isinstance(key, rsa.RSAPrivateKey):
        fmt = serialization.PrivateFormat.TraditionalOpenSSL  # PKCS#1, "RSA PRIVATE KEY"
    else:
        raise PKIError(f"unsupported key algorithm {type(key).__name__}")
    return key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())


def talos_key_pem(key_pem: bytes) -> bytes:
    """The key PEM as talosctl writes it: PKCS#8 ed25519 keys get the "ED25519 PRIVATE KEY" label."""
    key = load_key(key_pem)
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return _relabel(encode_private_key(key), _PKCS8_LABEL, TALOS_ED25519_KEY_LABEL)
    return key_pem


def standard_key_pem(key_pem: bytes) -> bytes:
    """The key PEM with standard labels only (for OpenSSL/BoringSSL consumers such as grpcio)."""
    return encode_private_key(load_key(key_pem))


def _relabel(pem: bytes, old: bytes, new: bytes) -> bytes:
    return pem.replace(b"-----BEGIN " + old + b"-----", b"-----BEGIN " + new + b"-----").replace(
        b"-----END " + old + b"-----", b"-----END " + new + b"-----"
    )


def load_key(key_pem: bytes | str) -> PrivateKey:
    """Parse a private key PEM (PKCS#8, SEC1, PKCS#1, or Talos' "ED25519 PRIVATE KEY")."""
    data = _as_bytes(key_pem)
    if TALOS_ED25519_KEY_LABEL in data:
        data = _relabel(data, TALOS_ED25519_KEY_LABEL, _PKCS8_LABEL)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        # The library's message can quote parts of the input; keep only its class.
        raise PKIError(f"not a readable unencrypted PEM private key ({type(exc).__name__})") from None
    if not isinstance(key, (ed25519.Ed25519PrivateKey, ec.EllipticCurvePrivateKey, rsa.RSAPrivateKey)):
        raise PKIError(f"unsupported private key algorithm {type(key).__name__}")
    return key


def load_cert(cert_pem: bytes | str) -> x509.Certificate:
    """Parse one PEM certificate."""
    try:
        return x509.load_pem_x509_certificate(_as_bytes(cert_pem))
    except ValueError as exc:
        raise PKIError(f"not a readable PEM certificate ({type(exc).__name__})") from None


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else bytes(value)


# --- base64 PEM (the way Talos stores PEM inside YAML) -----------------------------------------


def b64_pem(pem: bytes | str) -> str:
    """Standard base64 of PEM bytes, as Talos stores crt/key fields."""
    return base64.b64encode(_as_bytes(pem)).decode("ascii")


def pem_from_b64(value: str, *, field: str = "value") -> bytes:
    """PEM bytes from a base64 field; `field` names it in the error (the value itself is never shown)."""
    if not isinstance(value, str) or not value:
        raise PKIError(f"{field}: expected a non-empty base64 string")
    try:
        pem = base64.b64decode(value, validate=True)
    except ValueError:
        raise PKIError(f"{field}: not valid base64") from None
    if not pem.startswith(b"-----BEGIN "):
        raise PKIError(f"{field}: base64 does not decode to PEM")
    return pem


# --- certificates ------------------------------------------------------------------------------


def _public_key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return cert.public_key().public_bytes(*fmt) == key.public_key().public_bytes(*fmt)


def _signature_hash(key: PrivateKey):
    # Ed25519 signs the message itself; Talos signs ECDSA with SHA-256 and RSA CAs with SHA-512.
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return None
    if isinstance(key, rsa.RSAPrivateKey):
        return hashes.SHA512()
    return hashes.SHA256()


def _name(common_name: str | None, organizations: Iterable[str]) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    if common_name:
        attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def new_ca(
    *,
    organizations: Sequence[str] = (),
    common_name: str | None = None,
    key_type: str = "ed25519",
    validity: datetime.timedelta = datetime.timedelta(hours=87600),
    not_before: datetime.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A self-signed CA as Talos makes them: (cert_pem, key_pem)."""
    key = new_private_key(key_type)
    start = not_before or _now()
    subject = _name(common_name, organizations)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_cert_sign=True), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(ski, critical=False)
        .sign(key, _signature_hash(key))
    )
    return cert.public_bytes(serialization.Encoding.PEM), encode_private_key(key)


def _key_usage(*, digital_signature=False, key_encipherment=False, key_cert_sign=False) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=digital_signature,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


def load_ca(ca_cert_pem: bytes | str, ca_key_pem: bytes | str) -> tuple[x509.Certificate, PrivateKey]:
    """Parse a CA pair and check that it is a CA and that the key belongs to the certificate."""
    cert = load_cert(ca_cert_pem)
    key = load_key(ca_key_pem)
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise PKIError(f"certificate {cert.subject.rfc4514_string()!r} is not a CA (no basicConstraints CA:TRUE)")
    if not _public_key_matches(cert, key):
        raise PKIError(f"private key does not belong to CA certificate {cert.subject.rfc4514_string()!r}")
    return cert, key


def issue_certificate(
    ca_cert_pem: bytes | str,
    ca_key_pem: bytes | str,
    *,
    common_name: str | None = None,
    organizations: Sequence[str] = (),
    dns_names: Sequence[str] = (),
    ip_addresses: Sequence[str] = (),
    key_type: str = "ed25519",
    validity: datetime.timedelta = datetime.timedelta(days=365),
    server: bool = False,
    client: bool = False,
    not_before: datetime.datetime | None = None,
) -> tuple[bytes, bytes]:
    """A leaf certificate signed by the CA, with a fresh key: (cert_pem, key_pem).

    `server`/`client` set the extended key usages (at least one is required); subject alternative
    names come from `dns_names` and `ip_addresses`.
    """
    if not (server or client):
        raise PKIError("issue_certificate: set server=True and/or client=True")
    ca_cert, ca_key = load_ca(ca_cert_pem, ca_key_pem)
    key = new_private_key(key_type)
    start = not_before or _now()
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            # RSA key exchange needs keyEncipherment; ed25519/ECDSA only sign.
            _key_usage(digital_signature=True, key_encipherment=key_type.startswith("rsa")),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(_authority_key_id(ca_cert), critical=False)
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    try:
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in ip_addresses]
    except ValueError as exc:
        raise PKIError(f"ip_addresses: {exc}") from None
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, _signature_hash(ca_key))
    return cert.public_bytes(serialization.Encoding.PEM), encode_private_key(key)


def _authority_key_id(ca_cert: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:
        ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key())


def verify_issued_by(cert_pem: bytes | str, ca_cert_pem: bytes | str) -> None:
    """Raise PKIError unless `cert_pem` is signed by the CA in `ca_cert_pem` (signature and issuer name)."""
    cert, ca = load_cert(cert_pem), load_cert(ca_cert_pem)
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError) as exc:
        raise PKIError(f"certificate {cert.subject.rfc4514_string()!r} is not issued by "
                       f"{ca.subject.rfc4514_string()!r}: {exc}") from None
    except Exception as exc:  # InvalidSignature carries no message
        raise PKIError(f"certificate {cert.subject.rfc4514_string()!r}: signature does not verify against "
                       f"{ca.subject.rfc4514_string()!r} ({type(exc).__name__})") from None


def check_pair(cert_pem: bytes | str, key_pem: bytes | str) -> None:
    """Raise PKIError unless the key belongs to the certificate."""
    if not _public_key_matches(load_cert(cert_pem), load_key(key_pem)):
        raise PKIError("private key does not belong to the certificate")
