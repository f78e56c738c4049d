"""The Talos secrets bundle: generate it like `talosctl gen secrets`, load and validate an existing one.

The bundle is a plain dict with exactly the shape talosctl writes to secrets.yaml:

    cluster:    {id, secret}                                  32 random bytes each: id URL-safe base64
                                                              (as v1.12/v1.13 write it), secret base64
    secrets:    {bootstraptoken, secretboxencryptionsecret}   "[a-z0-9]{6}.[a-z0-9]{16}", base64 of 32 bytes
                (aescbcencryptionsecret instead of secretbox for contracts <= v1.2)
    trustdinfo: {token}                                       "[a-z0-9]{6}.[a-z0-9]{16}"
    certs:      {etcd, k8s, k8saggregator, os: {crt, key}, k8sserviceaccount: {key}}  base64 PEM

Facts from siderolabs/talos pkg/machinery/config/generate/secrets: CAs are valid for 87600h;
etcd (O=etcd), k8s (O=kubernetes) and aggregator (CN=front-proxy) CAs use ECDSA P-256; the OS CA
(O=talos) uses ed25519; the service-account key is RSA-4096 for contracts > v1.6 (ECDSA P-256 before).

Validation errors name the field and what was expected, never the value.
"""

from __future__ import annotations

import base64
import datetime
import re
import secrets as _random
from typing import Any, Mapping

import yaml

from talos_proxmox.talos_config import go_yaml, pki, talos_yaml

CA_VALIDITY = datetime.timedelta(hours=87600)
CLUSTER_ID_SIZE = 32
CLUSTER_SECRET_SIZE = 32
ENCRYPTION_SECRET_SIZE = 32

_TOKEN_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
TOKEN_RE = re.compile(r"^[a-z0-9]{6}\.[a-z0-9]{16}$")
_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+][0-9A-Za-z.+-]*)?$")

# Which CA each certs entry is, and its expected key type (for validation of adopted bundles).
CA_SPECS = {
    "etcd": {"key_type": "ecdsa-p256", "organizations": ("etcd",), "common_name": None},
    "k8s": {"key_type": "ecdsa-p256", "organizations": ("kubernetes",), "common_name": None},
    "k8saggregator": {"key_type": "ecdsa-p256", "organizations": (), "common_name": "front-proxy"},
    "os": {"key_type": "ed25519", "organizations": ("talos",), "common_name": None},
}


class SecretsBundleError(ValueError):
    """The bundle is missing a field or a field does not hold what it must. Never carries secret values."""


def parse_contract(talos_version: str) -> tuple[int, int]:
    """(major, minor) of a Talos version such as "v1.13.7" or "1.12"."""
    match = _VERSION_RE.match(str(talos_version).strip())
    if not match:
        raise ValueError(f"talos_version {talos_version!r} is not a Talos version; expected e.g. 'v1.13.7' or 'v1.12'")
    return int(match.group(1)), int(match.group(2))


def _token(first: int = 6, second: int = 16) -> str:
    pick = lambda n: "".join(_random.choice(_TOKEN_ALPHABET) for _ in range(n))  # noqa: E731
    return f"{pick(first)}.{pick(second)}"


def _b64_random(size: int, *, urlsafe: bool = False) -> str:
    encode = base64.urlsafe_b64encode if urlsafe else base64.b64encode
    return encode(_random.token_bytes(size)).decode("ascii")


def generate_secrets(talos_version: str) -> dict:
    """A fresh bundle for the given Talos version's contract, same shape as `talosctl gen secrets`."""
    contract = parse_contract(talos_version)
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)

    certs: dict[str, dict[str, str]] = {}
    for name, spec in CA_SPECS.items():
        crt, key = pki.new_ca(
            organizations=spec["organizations"],
            common_name=spec["common_name"],
            key_type=spec["key_type"],
            validity=CA_VALIDITY,
            not_before=now,
        )
        certs[name] = {"crt": pki.b64_pem(crt), "key": pki.b64_pem(pki.talos_key_pem(key))}

    sa_key_type = "rsa-4096" if contract > (1, 6) else "ecdsa-p256"
    sa_key = pki.encode_private_key(pki.new_private_key(sa_key_type))

    encryption_field = "secretboxencryptionsecret" if contract > (1, 2) else "aescbcencryptionsecret"
    return {
        "cluster": {"id": _b64_random(CLUSTER_ID_SIZE, urlsafe=True), "secret": _b64_random(CLUSTER_SECRET_SIZE)},
        "secrets": {"bootstraptoken": _token(), encryption_field: _b64_random(ENCRYPTION_SECRET_SIZE)},
        "trustdinfo": {"token": _token()},
        "certs": {
            "etcd": certs["etcd"],
            "k8s": certs["k8s"],
            "k8saggregator": certs["k8saggregator"],
            "k8sserviceaccount": {"key": pki.b64_pem(sa_key)},
            "os": certs["os"],
        },
    }


def dump_secrets(bundle: Mapping[str, Any]) -> str:
    """YAML text of a bundle as talosctl writes secrets.yaml (a secret: handle it as such)."""
    return go_yaml.marshal(dict(bundle))


def load_secrets(source: str | Mapping[str, Any]) -> dict:
    """Adopt an existing bundle: YAML text (e.g. the contents of secrets.yaml) or an already parsed mapping.

    The result is validated (see `validate_secrets`) and normalised to plain dicts and strings.
    To read a file, pass its text: `load_secrets(Path(p).read_text())`, or use `load_secrets_file`.
    """
    if isinstance(source, str):
        try:
            documents = talos_yaml.load_documents(source)
        except yaml.YAMLError as exc:
            # Show only where parsing failed; the problem text can quote secret material.
            raise SecretsBundleError(f"secrets bundle is not valid YAML{talos_yaml.yaml_error_location(exc)}") from None
        if len(documents) > 1:
            raise SecretsBundleError(f"secrets bundle: expected one YAML document, got {len(documents)}")
        data = documents[0] if documents else None
    else:
        data = source
    if not isinstance(data, Mapping):
        raise SecretsBundleError(f"secrets bundle: expected a mapping at the top level, got {type(data).__name__}")
    bundle = _plain(data)
    validate_secrets(bundle)
    return bundle


def load_secrets_file(path: str) -> dict:
    """`load_secrets` on a file such as the secrets.yaml written by `talosctl gen secrets`."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise SecretsBundleError(f"secrets bundle file {path!r} cannot be read: {exc.strerror}") from None
    return load_secrets(text)


def _plain(value):
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _field(bundle: Mapping, path: str):
    node: Any = bundle
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node or node[part] in (None, ""):
            return None
        node = node[part]
    return node


def validate_secrets(bundle: Mapping[str, Any]) -> None:
    """Raise SecretsBundleError listing every problem; messages name fields, never values."""
    problems: list[str] = []
    known_top = {"cluster", "secrets", "trustdinfo", "certs"}
    for key in bundle:
        if key not in known_top:
            problems.append(f"unknown top-level key {key!r}; expected only {', '.join(sorted(known_top))}")

    for path in ("cluster.id", "cluster.secret"):
        value = _field(bundle, path)
        if value is None:
            problems.append(f"{path} is required")
        elif not _is_b64_of(value, 32):
            problems.append(f"{path}: expected base64 of 32 bytes")

    for path in ("secrets.bootstraptoken", "trustdinfo.token"):
        value = _field(bundle, path)
        if value is None:
            problems.append(f"{path} is required")
        elif not isinstance(value, str) or not TOKEN_RE.match(value):
            problems.append(f"{path}: expected a token of the form [a-z0-9]{{6}}.[a-z0-9]{{16}}")

    secretbox = _field(bundle, "secrets.secretboxencryptionsecret")
    aescbc = _field(bundle, "secrets.aescbcencryptionsecret")
    if secretbox is None and aescbc is None:
        problems.append("one of secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret is required")
    elif secretbox is not None and aescbc is not None:
        problems.append("only one of secrets.secretboxencryptionsecret, secrets.aescbcencryptionsecret is allowed")
    for path, value in (("secrets.secretboxencryptionsecret", secretbox), ("secrets.aescbcencryptionsecret", aescbc)):
        if value is not None and not _is_b64_of(value, 32):
            problems.append(f"{path}: expected base64 of 32 bytes")

    for name, spec in CA_SPECS.items():
        problems.extend(_check_ca(bundle, name, spec["key_type"]))

    sa_path = "certs.k8sserviceaccount.key"
    sa = _field(bundle, sa_path)
    if sa is None:
        problems.append(f"{sa_path} is required")
    else:
        try:
            key_type = pki.key_type_of(pki.load_key(pki.pem_from_b64(sa, field=sa_path)))
            if not (key_type.startswith("rsa-") or key_type == "ecdsa-p256"):
                problems.append(f"{sa_path}: key type {key_type} is not usable; expected RSA or ECDSA P-256")
        except pki.PKIError as exc:
            problems.append(f"{sa_path}: {exc}")

    if problems:
        raise SecretsBundleError("secrets bundle is invalid:\n  - " + "\n  - ".join(problems))


def _is_b64_of(value, size: int) -> bool:
    """Standard or URL-safe base64 of `size` bytes (Talos wrote cluster.id URL-safe up to v1.13)."""
    if not isinstance(value, str):
        return False
    try:
        return len(base64.b64decode(value.replace("-", "+").replace("_", "/"), validate=True)) == size
    except ValueError:
        return False


def _check_ca(bundle: Mapping, name: str, expected_key_type: str) -> list[str]:
    base = f"certs.{name}"
    crt_b64, key_b64 = _field(bundle, f"{base}.crt"), _field(bundle, f"{base}.key")
    problems = [f"{base}.{part} is required" for part, v in (("crt", crt_b64), ("key", key_b64)) if v is None]
    if problems:
        return problems
    try:
        crt = pki.pem_from_b64(crt_b64, field=f"{base}.crt")
        key = pki.pem_from_b64(key_b64, field=f"{base}.key")
        cert, private_key = pki.load_ca(crt, key)
    except pki.PKIError as exc:
        return [f"{base}: {exc}"]
    key_type = pki.key_type_of(private_key)
    # Kubernetes and etcd accept any CA key type (bundles adopted from kubeadm PKI are often RSA),
    # but Talos API client certificates are ed25519, so the OS CA must be ed25519.
    if name == "os" and key_type != expected_key_type:
        return [f"{base}: key type is {key_type}; expected {expected_key_type}"]
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc <= now:
        return [f"{base}.crt expired at {cert.not_valid_after_utc.isoformat()}"]
    return []


def ca_pair(bundle: Mapping[str, Any], name: str) -> tuple[bytes, bytes]:
    """(cert_pem, key_pem) of one of the bundle's CAs: 'etcd', 'k8s', 'k8saggregator' or 'os'."""
    if name not in CA_SPECS:
        raise SecretsBundleError(f"CA {name!r} is not in a secrets bundle; expected one of {', '.join(CA_SPECS)}")
    entry = _field(bundle, f"certs.{name}")
    if entry is None:
        raise SecretsBundleError(f"certs.{name} is required")
    try:
        return (
            pki.pem_from_b64(entry.get("crt"), field=f"certs.{name}.crt"),
            pki.pem_from_b64(entry.get("key"), field=f"certs.{name}.key"),
        )
    except pki.PKIError as exc:
        raise SecretsBundleError(str(exc)) from None


def secret_strings(bundle: Mapping[str, Any]) -> list[str]:
    """Every secret leaf value of a bundle (and the decoded PEM of keys), for redaction and leak tests."""
    found: list[str] = []

    def walk(node, path):
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, f"{path}.{k}" if path else str(k))
        elif isinstance(node, str) and node:
            # Public CA certificates are not secret; everything else is.
            if not path.endswith(".crt"):
                found.append(node)
                if path.endswith(".key"):
                    try:
                        decoded = base64.b64decode(node).decode("ascii", "replace")
                    except ValueError:
                        decoded = ""
                    if decoded:
                        found.append(decoded)

    walk(bundle, "")
    return found
