"""Machine configurations with their secrets masked, and diffs of them, for previews and logs.

`redact_config(text, secrets_bundle=None)` re-renders a Talos machine configuration (every document)
with each secret value replaced by MASK, in the same Go-yaml layout the renderer writes, so that a
diff of two redacted configs is exactly the changed lines. `config_diff(old, new)` is that diff.

What counts as secret:
  - the fields Talos itself blanks in `RedactSecrets` (siderolabs/talos v1alpha1 `Config.Redact`):
    machine.token, machine.ca.key, cluster.secret, cluster.token (the bootstrap token),
    cluster.aescbcEncryptionSecret, cluster.secretboxEncryptionSecret, cluster.serviceAccount.key,
    cluster.ca.key, cluster.aggregatorCA.key, cluster.etcd.ca.key; plus cluster.id, which Talos
    leaves visible but which comes from the secrets bundle (it keys the discovery service);
  - in any document, string values under keys that hold credentials in Talos documents (registry
    auth password/auth/identityToken, wireguard privateKey, disk-encryption passphrase, VIP
    apiToken, any key/token/secret);
  - any string containing a value of the secrets bundle (e.g. a token pasted into an inline
    manifest), when the bundle is given.
Certificates (`crt`) are public but long and base64; they are shown as a short SHA-256
fingerprint so that a CA change still shows as a changed line without filling the preview.
Empty values stay empty: a worker's blank `machine.ca.key` is not a secret.

No Pulumi import; errors never quote the configuration.
"""

from __future__ import annotations

import difflib
import hashlib
from typing import Any, Iterable, Mapping, Optional

import yaml

from talos_proxmox.talos_config import talos_yaml
from talos_proxmox.talos_config.secrets_bundle import secret_strings

MASK = "***"

# Paths in the v1alpha1 document (the one without apiVersion/kind), as Talos's Redact lists them.
SECRET_PATHS = frozenset({
    ("machine", "token"),
    ("machine", "ca", "key"),
    ("cluster", "id"),
    ("cluster", "secret"),
    ("cluster", "token"),
    ("cluster", "aescbcEncryptionSecret"),
    ("cluster", "secretboxEncryptionSecret"),
    ("cluster", "serviceAccount", "key"),
    ("cluster", "ca", "key"),
    ("cluster", "aggregatorCA", "key"),
    ("cluster", "etcd", "ca", "key"),
})

# Keys whose string values are credentials wherever they appear, in any document.
SECRET_KEY_NAMES = frozenset({
    "key", "token", "secret", "password", "passphrase", "privateKey", "identityToken", "apiToken", "auth",
    "aescbcEncryptionSecret", "secretboxEncryptionSecret", "bootstrapToken",
    "clusterID", "clusterSecret",  # DiscoveryIdentityConfig (v1.14; cluster.id and cluster.secret before)
})

# v1alpha1's certificates (base64 PEM) and the v1.14 Kubernetes CA documents' (PEM).
CERTIFICATE_KEYS = frozenset({"crt", "cert"})
_MIN_BUNDLE_VALUE = 8  # shorter strings would mask unrelated text; every bundle secret is far longer


class RedactionError(ValueError):
    """The text is not a YAML machine configuration. Carries the location only, never content."""


def certificate_fingerprint(value: str) -> str:
    """How a certificate shows in a redacted config: stable, short, and different for another CA."""
    return f"<certificate sha256:{hashlib.sha256(value.encode()).hexdigest()[:16]}>"


def bundle_values(secrets_bundle: Optional[Mapping[str, Any]]) -> tuple[str, ...]:
    """The bundle's secret strings (longest first, so a value never leaves part of a longer one)."""
    if not secrets_bundle:
        return ()
    values = {v for v in secret_strings(secrets_bundle) if len(v) >= _MIN_BUNDLE_VALUE}
    return tuple(sorted(values, key=len, reverse=True))


def _mask_string(value: str, known: Iterable[str]) -> str:
    for secret in known:
        if secret in value:
            value = value.replace(secret, MASK)
    return value


def _redact(node: Any, path: tuple, in_v1alpha1: bool, known: tuple[str, ...]) -> Any:
    if isinstance(node, Mapping):
        result = {}
        for key, value in node.items():
            child = path + (key,)
            if isinstance(value, str) and value:
                if (in_v1alpha1 and child in SECRET_PATHS) or key in SECRET_KEY_NAMES:
                    result[key] = MASK
                    continue
                if key in CERTIFICATE_KEYS:
                    result[key] = certificate_fingerprint(value)
                    continue
            result[key] = _redact(value, child, in_v1alpha1, known)
        return result
    if isinstance(node, list):
        return [_redact(item, path + (i,), in_v1alpha1, known) for i, item in enumerate(node)]
    if isinstance(node, str):
        return _mask_string(node, known)
    return node


def redact_documents(documents: Iterable[Mapping[str, Any]],
                     secrets_bundle: Optional[Mapping[str, Any]] = None) -> list[dict]:
    """Copies of parsed config documents with every secret value masked (see the module docstring)."""
    known = bundle_values(secrets_bundle)
    redacted = []
    for document in documents:
        is_v1alpha1 = "apiVersion" not in document and "kind" not in document
        redacted.append(_redact(document, (), is_v1alpha1, known))
    return redacted


def redact_config(config_yaml: str, secrets_bundle: Optional[Mapping[str, Any]] = None) -> str:
    """The machine configuration YAML with every secret value replaced by MASK, same layout."""
    if not config_yaml:
        return ""
    try:
        documents = talos_yaml.load_documents(config_yaml)
    except yaml.YAMLError as exc:
        raise RedactionError(f"machine configuration is not valid YAML{talos_yaml.yaml_error_location(exc)}") from None
    for index, document in enumerate(documents):
        if not isinstance(document, Mapping):
            raise RedactionError(f"machine configuration document {index + 1} is a {type(document).__name__}; "
                                 "expected a mapping")
    return talos_yaml.dump_documents(redact_documents(documents, secrets_bundle))


def config_diff(old: Optional[str], new: Optional[str], secrets_bundle: Optional[Mapping[str, Any]] = None,
                *, context: int = 3, label: str = "machine config") -> str:
    """Unified diff of the redacted texts ('' when they are the same); None/'' stands for no config."""
    before = redact_config(old or "", secrets_bundle).splitlines(keepends=True)
    after = redact_config(new or "", secrets_bundle).splitlines(keepends=True)
    lines = difflib.unified_diff(before, after, fromfile=f"{label} (current)", tofile=f"{label} (planned)",
                                 n=context)
    return "".join(lines)  # every line ends in a newline: the rendered texts always do
