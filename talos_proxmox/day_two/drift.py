"""What a refresh finds on a node: the machine configuration it runs, or that it is back in maintenance
mode, or that it does not answer; and how that differs from what was applied.

A configuration changed by hand (`talosctl apply-config`, `edit`, `patch`) shows as drift: the running
config (the COSI MachineConfig resource, read over mTLS with the stack's talosconfig) compared, document
by document, with the one the stack applied. A node reset to maintenance mode refuses our client
certificate and answers without one. Neither reading nor report ever carries a secret: the report's
lines are the redacted configs' diff. No Pulumi here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import yaml

from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.client import TalosClient, read_talosconfig
from talos_proxmox.talos_config import talos_yaml
from talos_proxmox.talos_config.redaction import config_diff

MACHINE_CONFIG = ("config", "MachineConfigs.config.talos.dev", "v1alpha1")
READ_TIMEOUT = 10.0

CONFIGURED, MAINTENANCE, UNREACHABLE = "configured", "maintenance", "unreachable"


@dataclass(frozen=True)
class NodeReading:
    state: str  # CONFIGURED, MAINTENANCE or UNREACHABLE
    running_config: Optional[str] = None  # CONFIGURED: the configuration the node runs
    detail: str = ""  # UNREACHABLE: why, without secrets


def read_node(node: str, talosconfig: str | Mapping, endpoint: Optional[str] = None,
              timeout: float = READ_TIMEOUT) -> NodeReading:
    """Read `node` as a refresh does: its running configuration over mTLS; if it refuses the stack's
    client certificate but answers without one, it is in maintenance mode."""
    endpoint = endpoint or node
    credentials = read_talosconfig(talosconfig).credentials
    try:
        with TalosClient([endpoint], credentials=credentials, node=node) as client:
            resource = client.get_resource(*MACHINE_CONFIG, timeout=timeout)
        return NodeReading(CONFIGURED, running_config=resource.spec.yaml_spec)
    except errors.TalosTlsError as exc:
        mtls_error = exc
    except errors.TalosApiError as exc:
        return NodeReading(UNREACHABLE, detail=str(exc))
    try:
        with TalosClient([endpoint]) as insecure:
            insecure.version(timeout=timeout)
    except errors.TalosApiError:
        return NodeReading(UNREACHABLE, detail=str(mtls_error))
    return NodeReading(MAINTENANCE)


def _documents(config: str) -> list[Any]:
    return [document for document in talos_yaml.load_documents(config) if document is not None]


def same_configuration(applied: str, running: str) -> bool:
    """The same documents, whatever their layout or comments (Talos re-encodes what it stores)."""
    try:
        return _documents(applied) == _documents(running)
    except yaml.YAMLError:
        return False


def drift_report(name: str, applied: str, running: str) -> list[str]:
    """A summary line for the node, then the changed lines of its config (running -> applied, secrets
    masked): what an up --refresh will apply back."""
    diff = config_diff(running, applied, label=f"{name} machine config")
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    added = sum(line.startswith("+") for line in changed)
    summary = (f"{name}: its running config differs from the stack's ({len(changed) - added} line(s) set by hand, "
               f"{added} to apply back; secrets masked)")
    return [summary, *diff.splitlines()]


@dataclass(frozen=True)
class NodeState:
    """What a refresh reads of a node's lifecycle: the Talos version it runs, and for a control plane
    whether it is an etcd member. `unreachable`: why it could not be read (nothing else is known)."""
    talos_version: Optional[str] = None
    etcd_member: Optional[bool] = None
    unreachable: str = ""


def read_node_state(node: str, hostname: str, talosconfig: str | Mapping, endpoint: Optional[str] = None, *,
                    control_plane: bool, timeout: float = READ_TIMEOUT) -> NodeState:
    """Read `node`'s running Talos version, and for a control plane its etcd membership, over mTLS."""
    credentials = read_talosconfig(talosconfig).credentials
    try:
        with TalosClient([endpoint or node], credentials=credentials, node=node) as client:
            version = client.version(timeout=timeout).messages[0].version.tag
            member = None
            if control_plane:
                reply = client.etcd_member_list(timeout=timeout)
                member = any(m.hostname == hostname for message in reply.messages for m in message.members)
        return NodeState(talos_version=version, etcd_member=member)
    except errors.TalosApiError as exc:
        return NodeState(unreachable=str(exc))


def version_drift(name: str, running: Optional[str], wanted: Optional[str]) -> Optional[str]:
    """A line when the node runs another Talos than the stack says (upgraded or rolled back by hand, or by
    Talos's own fallback after a failed boot); None when they agree or either is unknown."""
    if not running or not wanted or running.lstrip("v") == str(wanted).lstrip("v"):
        return None
    return (f"{name}: runs Talos {running}, the stack says {wanted}: the next up rolls it to {wanted}, one node at a "
            f"time as upgrades go")


def missing_member(name: str) -> str:
    return (f"{name}: a control plane that is not an etcd member (removed by hand?); `pulumi up` does not guess: "
            f"take it out of nodes and `pulumi up` (it is reset), then add it back and `pulumi up` (it joins etcd "
            f"anew)")
