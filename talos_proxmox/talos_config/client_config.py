"""talosconfig: the talosctl client configuration with an admin client certificate.

Facts from siderolabs/talos (v1.13.7): pkg/machinery/client/config (the file format: `context`,
`contexts.<name>.{endpoints, nodes, ca, crt, key}` with base64 PEM) and
pkg/machinery/config/generate/secrets (the admin certificate: signed by the OS CA, Organization =
the role, here `os:admin`, key type of the CA (ed25519), digital-signature key usage, client-auth
extended usage, valid for one year).

Pure functions, no Pulumi. `talosconfig` issues a new certificate on every call; callers that must
be stable across runs (the Talosconfig dynamic resource) issue once with `issue_admin_certificate`
and then build the file with `talosconfig_with_certificate`.
"""

from __future__ import annotations

import datetime
from typing import Mapping, Optional, Sequence

from talos_proxmox.talos_config import go_yaml, pki
from talos_proxmox.talos_config.secrets_bundle import SecretsBundleError, ca_pair

ADMIN_ROLE = "os:admin"
ROLES = ("os:admin", "os:operator", "os:reader", "os:etcd:backup")
CLIENT_CERT_VALIDITY = datetime.timedelta(days=365)


class TalosconfigError(ValueError):
    """Inputs that cannot make a talosconfig; never carries key material."""


def issue_admin_certificate(secrets: Mapping, *, roles: Sequence[str] = (ADMIN_ROLE,),
                            validity: datetime.timedelta = CLIENT_CERT_VALIDITY,
                            not_before: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    """(cert_pem, key_pem) of a Talos API client certificate for `roles`, signed by the bundle's OS CA.

    The key PEM is labelled the way talosctl writes it ("ED25519 PRIVATE KEY").
    """
    unknown = [r for r in roles if r not in ROLES]
    if unknown or not roles:
        raise TalosconfigError(f"roles {list(roles)!r}: expected one or more of {', '.join(ROLES)}")
    ca_crt, ca_key = ca_pair(secrets, "os")
    try:
        cert, key = pki.issue_certificate(
            ca_crt, ca_key, organizations=tuple(roles), key_type=pki.key_type_of(pki.load_key(ca_key)),
            validity=validity, client=True, not_before=not_before,
        )
    except pki.PKIError as exc:
        raise SecretsBundleError(f"certs.os: {exc}") from None
    return cert, pki.talos_key_pem(key)


def _strings(value, name: str, *, required: bool) -> list[str]:
    if isinstance(value, str):
        value = [value]
    items = list(value or [])
    if required and not items:
        raise TalosconfigError(f"{name}: expected at least one address, e.g. ['10.255.200.201']")
    for item in items:
        if not isinstance(item, str) or not item.strip() or any(c.isspace() for c in item):
            raise TalosconfigError(f"{name}: {item!r} is not a host or host:port")
    return items


def talosconfig_with_certificate(secrets: Mapping, context: str, endpoints: Sequence[str],
                                 nodes: Sequence[str], cert_pem: bytes, key_pem: bytes) -> str:
    """talosconfig YAML for a client certificate issued earlier (see `issue_admin_certificate`)."""
    if not isinstance(context, str) or not context.strip():
        raise TalosconfigError("context: expected a non-empty name, e.g. the cluster name")
    endpoint_list = _strings(endpoints, "endpoints", required=True)
    node_list = _strings(nodes, "nodes", required=False)
    ca_crt, _ = ca_pair(secrets, "os")
    try:
        pki.verify_issued_by(cert_pem, ca_crt)
    except pki.PKIError:
        raise TalosconfigError("client certificate is not signed by the bundle's OS CA (certs.os)") from None
    entry: dict = {"endpoints": endpoint_list}
    if node_list:
        entry["nodes"] = node_list
    entry.update(ca=pki.b64_pem(ca_crt), crt=pki.b64_pem(cert_pem), key=pki.b64_pem(key_pem))
    return go_yaml.marshal({"context": context, "contexts": {context: entry}})


def talosconfig(secrets: Mapping, context: str, endpoints: Sequence[str], nodes: Sequence[str] = ()) -> str:
    """A talosctl config with a fresh `os:admin` client certificate, as `talosctl gen config` writes it
    (plus `nodes`, which talosctl sets with `talosctl config node`)."""
    cert, key = issue_admin_certificate(secrets)
    return talosconfig_with_certificate(secrets, context, endpoints, nodes, cert, key)


def certificate_expires(cert_pem: bytes | str) -> datetime.datetime:
    """When a client certificate stops being valid (UTC)."""
    return pki.load_cert(cert_pem).not_valid_after_utc


# Renew a client certificate this long before it expires: an expired one locks the program out of the
# cluster, and a renewal needs a working one (Talos) or the CA in the state (talosconfig).
DEFAULT_RENEW_BEFORE_DAYS = 30


def renewal_due(expires: datetime.datetime, renew_before_days: float = DEFAULT_RENEW_BEFORE_DAYS,
                now: Optional[datetime.datetime] = None) -> bool:
    """Whether a certificate expiring at `expires` is within `renew_before_days` of it, or past it."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return expires - datetime.timedelta(days=float(renew_before_days)) <= now


def expiry_warning(what: str, expires: datetime.datetime, now: Optional[datetime.datetime] = None) -> str:
    """The refresh's line for a certificate due for renewal; `what` names it and says how it is renewed."""
    left = expires - (now or datetime.datetime.now(datetime.timezone.utc))
    state = f"expired {expires.isoformat()}" if left.total_seconds() <= 0 else \
        f"expires {expires.isoformat()} ({left.days} days left)"
    return f"{what} {state}"
