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
