"""The talosctl config as a Pulumi resource (Talosconfig).

It keeps its os:admin client certificate in state and reuses it; endpoint/node changes only rewrite the
YAML. A new certificate is issued when the OS CA changed or the certificate is within
`renew_before_days` of expiring.
"""

from __future__ import annotations

import datetime
import uuid
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi.dynamic as dynamic

from providers import check_result, has_unknowns
from talos_proxmox.day_two.progress import note
from talos_proxmox.talos_config import client_config, pki, secrets_bundle

DEFAULT_RENEW_BEFORE_DAYS = client_config.DEFAULT_RENEW_BEFORE_DAYS

TALOSCONFIG_INPUTS = ("secrets", "context", "endpoints", "nodes", "renew_before_days")


def _certificate_usable(props: Mapping[str, Any], olds: Mapping[str, Any]) -> bool:
    """Whether the certificate in state is signed by the bundle's OS CA and is not due for renewal."""
    cert = olds.get("client_certificate")
    if not cert:
        return False
    try:
        os_ca, _ = secrets_bundle.ca_pair(props["secrets"], "os")
        pki.verify_issued_by(cert.encode(), os_ca)
    except (pki.PKIError, secrets_bundle.SecretsBundleError):
        return False
    return not client_config.renewal_due(client_config.certificate_expires(cert.encode()),
                                         props.get("renew_before_days") or DEFAULT_RENEW_BEFORE_DAYS)


def talosconfig_outputs(props: Mapping[str, Any], olds: Mapping[str, Any]) -> dict[str, Any]:
    """State of a Talosconfig: reuse the certificate in `olds` when usable, else issue one."""
    if _certificate_usable(props, olds):
        cert, key = olds["client_certificate"].encode(), olds["client_key"].encode()
    else:
        cert, key = client_config.issue_admin_certificate(props["secrets"])
    text = client_config.talosconfig_with_certificate(
        props["secrets"], props["context"], props["endpoints"], props.get("nodes") or [], cert, key)
    return {
        "context": props["context"],
        "endpoints": list(props["endpoints"]),
        "nodes": list(props.get("nodes") or []),
        "renew_before_days": props.get("renew_before_days"),
        "client_certificate": cert.decode(),
        "client_key": key.decode(),
        "expires": client_config.certificate_expires(cert).isoformat(),
        "talosconfig": text,
    }


class TalosconfigProvider(dynamic.ResourceProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        if any(has_unknowns(news.get(k)) for k in TALOSCONFIG_INPUTS):
            return check_result(news, "", None)
        try:
            cert, key = client_config.issue_admin_certificate(news["secrets"])
            client_config.talosconfig_with_certificate(news["secrets"], news.get("context"), news.get("endpoints"),
                                                      news.get("nodes") or [], cert, key)
        except secrets_bundle.SecretsBundleError as exc:
            return check_result(news, "secrets", exc)
        except client_config.TalosconfigError as exc:
            return check_result(news, str(exc).split(":", 1)[0], exc)
        return check_result(news, "", None)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=uuid.uuid4().hex, outs=talosconfig_outputs(props, {}))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        if any(has_unknowns(news.get(k)) for k in TALOSCONFIG_INPUTS):
            return dynamic.DiffResult(changes=True, replaces=[], stables=[], delete_before_replace=False)
        inputs_changed = (news.get("context") != olds.get("context")
                          or list(news.get("endpoints") or []) != olds.get("endpoints")
                          or list(news.get("nodes") or []) != olds.get("nodes")
                          or news.get("renew_before_days") != olds.get("renew_before_days"))
        return dynamic.DiffResult(changes=inputs_changed or not _certificate_usable(news, olds), replaces=[],
                                  stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=talosconfig_outputs(news, olds))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        """Refresh: a warning when the client certificate is due for renewal (the next up renews it)."""
        expires = datetime.datetime.fromisoformat(props["expires"]) if props.get("expires") else None
        if expires and client_config.renewal_due(expires, props.get("renew_before_days") or DEFAULT_RENEW_BEFORE_DAYS):
            note("refresh", client_config.expiry_warning("the talosconfig's client certificate", expires) +
                 ": the next `pulumi up` issues a new one, and `pulumi stack output talosconfig` gives it")
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # Talos has no revocation; the certificate simply expires


class Talosconfig(dynamic.Resource):
    """A talosctl config for the cluster (`talosconfig`, a secret) with a long-lived os:admin certificate."""

    talosconfig: pulumi.Output[str]
    client_certificate: pulumi.Output[str]
    client_key: pulumi.Output[str]
    expires: pulumi.Output[str]

    def __init__(self, name: str, *, secrets: pulumi.Input[dict], context: pulumi.Input[str],
                 endpoints: pulumi.Input[Sequence[str]], nodes: pulumi.Input[Sequence[str]] = (),
                 renew_before_days: int = DEFAULT_RENEW_BEFORE_DAYS,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {
            "secrets": pulumi.Output.secret(secrets), "context": context, "endpoints": endpoints,
            "nodes": nodes, "renew_before_days": renew_before_days,
            "talosconfig": None, "client_certificate": None, "client_key": None, "expires": None,
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["talosconfig", "client_key", "secrets"]))
        super().__init__(TalosconfigProvider(), name, props, opts)
