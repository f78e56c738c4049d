"""The secrets bundle and the PKI primitives: key types, CA flags, validity, issuers, adoption errors."""

import base64
import datetime
import ssl

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from talos_proxmox.talos_config import pki, secrets_bundle
from talos_proxmox.talos_config.secrets_bundle import SecretsBundleError, generate_secrets, load_secrets


@pytest.fixture(scope="module")
def bundle():
    return generate_secrets("v1.13.7")


def _cert(bundle, name):
    return x509.load_pem_x509_certificate(base64.b64decode(bundle["certs"][name]["crt"]))


def test_bundle_has_the_shape_talosctl_writes(bundle):
    assert list(bundle) == ["cluster", "secrets", "trustdinfo", "certs"]
    assert set(bundle["cluster"]) == {"id", "secret"}
    assert set(bundle["secrets"]) == {"bootstraptoken", "secretboxencryptionsecret"}
    assert set(bundle["trustdinfo"]) == {"token"}
    assert list(bundle["certs"]) == ["etcd", "k8s", "k8saggregator", "k8sserviceaccount", "os"]
    assert set(bundle["certs"]["k8sserviceaccount"]) == {"key"}
    assert len(base64.urlsafe_b64decode(bundle["cluster"]["id"])) == 32  # URL-safe, as v1.12/v1.13 write it
    assert len(base64.b64decode(bundle["cluster"]["secret"], validate=True)) == 32
    assert len(base64.b64decode(bundle["secrets"]["secretboxencryptionsecret"], validate=True)) == 32
    assert secrets_bundle.TOKEN_RE.match(bundle["secrets"]["bootstraptoken"])
    assert secrets_bundle.TOKEN_RE.match(bundle["trustdinfo"]["token"])


@pytest.mark.parametrize(
    "name, key_class, subject",
    [
        ("etcd", ec.EllipticCurvePrivateKey, [(NameOID.ORGANIZATION_NAME, "etcd")]),
        ("k8s", ec.EllipticCurvePrivateKey, [(NameOID.ORGANIZATION_NAME, "kubernetes")]),
        ("k8saggregator", ec.EllipticCurvePrivateKey, [(NameOID.COMMON_NAME, "front-proxy")]),
        ("os", ed25519.Ed25519PrivateKey, [(NameOID.ORGANIZATION_NAME, "talos")]),
    ],
)
def test_every_ca_has_talos_key_type_flag_validity_and_is_self_issued(bundle, name, key_class, subject):
    cert = _cert(bundle, name)
    key = pki.load_key(base64.b64decode(bundle["certs"][name]["key"]))
    assert isinstance(key, key_class)
    if isinstance(key, ec.EllipticCurvePrivateKey):
        assert isinstance(key.curve, ec.SECP256R1)
    assert [(a.oid, a.value) for a in cert.subject] == subject
    assert cert.issuer == cert.subject
    cert.verify_directly_issued_by(cert)  # self-signed with its own key
    pki.check_pair(base64.b64decode(bundle["certs"][name]["crt"]), base64.b64decode(bundle["certs"][name]["key"]))
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.value.ca is True and bc.critical
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.key_cert_sign and usage.digital_signature
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(hours=87600)
    now = datetime.datetime.now(datetime.timezone.utc)
    assert cert.not_valid_before_utc <= now < cert.not_valid_after_utc


def test_os_ca_key_uses_talos_ed25519_label(bundle):
    key_pem = base64.b64decode(bundle["certs"]["os"]["key"])
    assert key_pem.startswith(b"-----BEGIN ED25519 PRIVATE KEY-----")
    # The standard form is what OpenSSL-based consumers (grpcio, ssl) need.
    assert pki.standard_key_pem(key_pem).startswith(b"-----BEGIN PRIVATE KEY-----")


def test_service_account_key_is_rsa_4096_for_current_contracts_and_ecdsa_before_1_7(bundle):
    key = pki.load_key(base64.b64decode(bundle["certs"]["k8sserviceaccount"]["key"]))
    assert isinstance(key, rsa.RSAPrivateKey) and key.key_size == 4096
    assert base64.b64decode(bundle["certs"]["k8sserviceaccount"]["key"]).startswith(b"-----BEGIN RSA PRIVATE KEY")
    old = generate_secrets("v1.6.0")
    assert isinstance(pki.load_key(base64.b64decode(old["certs"]["k8sserviceaccount"]["key"])), ec.EllipticCurvePrivateKey)


def test_two_bundles_share_no_secret(bundle):
    other = generate_secrets("v1.12.0")
    assert not set(secrets_bundle.secret_strings(bundle)) & set(secrets_bundle.secret_strings(other))


def test_dump_and_load_round_trip(bundle):
    text = secrets_bundle.dump_secrets(bundle)
    assert text.startswith("cluster:\n    id: ")
    assert load_secrets(text) == bundle


def test_load_secrets_file_adopts_a_bundle(bundle, tmp_path):
    path = tmp_path / "secrets.yaml"
    path.write_text(secrets_bundle.dump_secrets(bundle))
    assert secrets_bundle.load_secrets_file(str(path)) == bundle
    with pytest.raises(SecretsBundleError, match="cannot be read"):
        secrets_bundle.load_secrets_file(str(tmp_path / "missing.yaml"))


def _broken(bundle, mutate):
    data = yaml.safe_load(secrets_bundle.dump_secrets(bundle))
    mutate(data)
    return data


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["cluster"].pop("secret"), "cluster.secret is required"),
        (lambda d: d["secrets"].__setitem__("bootstraptoken", "NOT-A-TOKEN"), "secrets.bootstraptoken: expected a token"),
        (lambda d: d["trustdinfo"].__setitem__("token", "abc"), "trustdinfo.token: expected a token"),
        (lambda d: d["secrets"].pop("secretboxencryptionsecret"), "one of secrets.secretboxencryptionsecret"),
        (lambda d: d["certs"]["os"].__setitem__("key", d["certs"]["k8s"]["key"]), "certs.os: private key does not belong"),
        (lambda d: d["certs"]["etcd"].__setitem__("crt", "bm90IHBlbQ=="), "certs.etcd: certs.etcd.crt: base64 does not decode to PEM"),
        (lambda d: d["certs"]["k8s"].__setitem__("key", "%%%"), "certs.k8s.key: not valid base64"),
        (lambda d: d.__setitem__("extra", 1), "unknown top-level key 'extra'"),
    ],
)
def test_invalid_bundles_are_refused_naming_the_field_not_the_value(bundle, mutate, expected):
    data = _broken(bundle, mutate)
    with pytest.raises(SecretsBundleError) as err:
        load_secrets(data)
    message = str(err.value)
    assert expected in message
    for secret in secrets_bundle.secret_strings(data):
        assert secret not in message


def test_bad_yaml_error_shows_position_but_no_content(bundle):
    text = secrets_bundle.dump_secrets(bundle).replace("trustdinfo:", "trustdinfo: [", 1)
    with pytest.raises(SecretsBundleError, match=r"not valid YAML at line \d+") as err:
        load_secrets(text)
    for secret in secrets_bundle.secret_strings(bundle):
        assert secret not in str(err.value)


def test_expired_ca_is_refused(bundle):
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    crt, key = pki.new_ca(organizations=("talos",), validity=datetime.timedelta(days=1), not_before=past)
    data = _broken(bundle, lambda d: d["certs"].__setitem__("os", {"crt": pki.b64_pem(crt), "key": pki.b64_pem(key)}))
    with pytest.raises(SecretsBundleError, match="certs.os.crt expired"):
        load_secrets(data)


def test_issue_certificate_server_and_client_certs_verify_against_the_ca(bundle):
    ca_crt, ca_key = secrets_bundle.ca_pair(bundle, "os")
    crt, key = pki.issue_certificate(
        ca_crt, ca_key, common_name="127.0.0.1", dns_names=["localhost"], ip_addresses=["127.0.0.1"],
        server=True, validity=datetime.timedelta(hours=1),
    )
    cert = pki.load_cert(crt)
    pki.verify_issued_by(crt, ca_crt)
    assert cert.issuer == pki.load_cert(ca_crt).subject
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == datetime.timedelta(hours=1)
    assert isinstance(pki.load_key(key), ed25519.Ed25519PrivateKey)
    # Standard PEM that Python's ssl (OpenSSL) loads as a server identity.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    import tempfile, os
    with tempfile.TemporaryDirectory() as d:
        cp, kp = os.path.join(d, "c.pem"), os.path.join(d, "k.pem")
        open(cp, "wb").write(crt)
        open(kp, "wb").write(key)
        ctx.load_cert_chain(cp, kp)


def test_issue_certificate_ecdsa_client_and_errors(bundle):
    ca_crt, ca_key = secrets_bundle.ca_pair(bundle, "k8s")
    crt, key = pki.issue_certificate(ca_crt, ca_key, organizations=["system:masters"], common_name="admin",
                                     key_type="ecdsa-p256", client=True)
    assert isinstance(pki.load_key(key), ec.EllipticCurvePrivateKey)
    pki.verify_issued_by(crt, ca_crt)
    with pytest.raises(pki.PKIError, match="not issued by|does not verify"):
        pki.verify_issued_by(crt, secrets_bundle.ca_pair(bundle, "os")[0])
    with pytest.raises(pki.PKIError, match="server=True and/or client=True"):
        pki.issue_certificate(ca_crt, ca_key, common_name="x")
    with pytest.raises(pki.PKIError, match="key_type 'dsa'"):
        pki.issue_certificate(ca_crt, ca_key, common_name="x", client=True, key_type="dsa")
    with pytest.raises(pki.PKIError, match="is not a CA"):
        pki.issue_certificate(crt, key, common_name="x", client=True)
    with pytest.raises(pki.PKIError, match="ip_addresses"):
        pki.issue_certificate(ca_crt, ca_key, common_name="x", client=True, ip_addresses=["not-an-ip"])


def test_parse_contract():
    assert secrets_bundle.parse_contract("v1.13.7") == (1, 13)
    assert secrets_bundle.parse_contract("1.12") == (1, 12)
    assert secrets_bundle.parse_contract("v1.13.0-beta.1") == (1, 13)
    with pytest.raises(ValueError, match="talos_version 'latest'"):
        secrets_bundle.parse_contract("latest")
