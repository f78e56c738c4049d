"""Node and etcd health through the Talos API, at the bar `talosctl health` sets (pkg/cluster/check).

`node_problems(client, node)` is one node: apid answers (with the expected Talos version), its boot
sequence has finished (MachineStatus stage running and ready), and the services its role needs are
Running and passing their health checks (apid, kubelet; etcd on a control plane).

`etcd_problems(client, node)` is the cluster's etcd as seen from every member, asked through the same
apid: every control plane's member list is the same set, no member is a learner, every member is a
control plane that answers with a healthy etcd, and the node itself is a member. A roll checks it before
it leaves a control plane, so quorum is whole before the next one goes down.

Each problem names the check, the node and what was seen. No Pulumi here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.client import TalosClient

REQUIRED_SERVICES = {"controlplane": ("apid", "etcd", "kubelet"), "worker": ("apid", "kubelet")}

APID_READY = "apid ready"
TALOS_VERSION = "Talos version"
BOOT_FINISHED = "boot sequence finished"
SERVICE_HEALTHY = "service healthy"
ETCD_MEMBER = "etcd member"
ETCD_CONSISTENT = "etcd members consistent"
ETCD_CONTROL_PLANES = "etcd members are control planes"


@dataclass(frozen=True)
class Problem:
    check: str
    node: str
    seen: str

    def __str__(self) -> str:
        return f"{self.check} on {self.node}: {self.seen}"


def first_message(reply):
    return reply.messages[0] if reply.messages else None


def _hosts(urls) -> set[str]:
    return {urlsplit(url).hostname or "" for url in urls}


def member_host(member) -> str:
    """The address a member is known by: its first peer URL's host (client URLs as a fallback)."""
    hosts = sorted(_hosts(member.peer_urls) or _hosts(member.client_urls))
    return hosts[0] if hosts else ""


def etcd_member_of(members, address: str):
    """The etcd member whose peer or client URLs are on `address` (etcd names are not chosen by us)."""
    host = address.strip("[]")
    for member in members:
        if host in _hosts(member.peer_urls) | _hosts(member.client_urls):
            return member
    return None


def service_problems(services, required: tuple[str, ...], name: str) -> list[Problem]:
    by_id = {s.id: s for s in services}
    problems = []
    for service_id in required:
        service = by_id.get(service_id)
        if service is None:
            problems.append(Problem(SERVICE_HEALTHY, name, f"service {service_id} is not listed"))
        elif service.state != "Running":
            problems.append(Problem(SERVICE_HEALTHY, name, f"service {service_id} is {service.state or 'in no state'}"))
        elif not (service.health.healthy or service.health.unknown):
            detail = service.health.last_message
            problems.append(Problem(SERVICE_HEALTHY, name, f"service {service_id} is unhealthy"
                                    + (f" ({detail})" if detail else "")))
    return problems


def boot_problems(status: dict, name: str) -> list[Problem]:
    stage = status.get("stage") or "unknown"
    state = status.get("status") or {}
    if stage != "running":
        return [Problem(BOOT_FINISHED, name, f"stage is {stage}")]
    if not state.get("ready"):
        unmet = ", ".join(f"{c.get('name')}: {c.get('reason')}" for c in state.get("unmetConditions") or ())
        return [Problem(BOOT_FINISHED, name, "running but not ready" + (f" ({unmet})" if unmet else ""))]
    return []


def node_problems(client: TalosClient, name: str, address: str, role: str, *, expected_tag: Optional[str] = None,
                  timeout: float) -> list[Problem]:
    """What keeps one node from being healthy now (empty: healthy). Transport errors propagate."""
    problems = []
    version = first_message(client.version(timeout=timeout, node=address))
    tag = version.version.tag if version is not None else ""
    if version is None:
        problems.append(Problem(APID_READY, name, "Version answered with no message"))
    elif expected_tag and tag != expected_tag:
        problems.append(Problem(TALOS_VERSION, name, f"reports Talos {tag or 'no version'}, expected {expected_tag}"))
    problems += boot_problems(client.machine_status(timeout=timeout, node=address), name)
    listing = first_message(client.service_list(timeout=timeout, node=address))
    problems += service_problems(listing.services if listing is not None else (), REQUIRED_SERVICES[role], name)
    return problems


def etcd_problems(client: TalosClient, name: str, address: str, *, timeout: float) -> list[Problem]:
    """The cluster's etcd, asked of the node and then of every member it lists (see the module docstring)."""
    own = first_message(client.etcd_member_list(timeout=timeout, node=address))
    members = list(own.members) if own is not None else []
    problems = []
    me = etcd_member_of(members, address)
    if me is None:
        problems.append(Problem(ETCD_MEMBER, name, f"no member has a URL on {address}"))
    expected = sorted(m.id for m in members)
    for member in members:
        host = member_host(member)
        who = member.hostname or host
        if member.is_learner:
            problems.append(Problem(ETCD_MEMBER, who, "is still a learner"))
        try:
            theirs = first_message(client.etcd_member_list(timeout=timeout, node=host))
            listing = first_message(client.service_list(timeout=timeout, node=host))
        except errors.TalosApiError as exc:
            problems.append(Problem(ETCD_CONTROL_PLANES, who, f"member at {host} does not answer as a node: {exc}"))
            continue
        seen = sorted(m.id for m in theirs.members) if theirs is not None else []
        if seen != expected:
            problems.append(Problem(ETCD_CONSISTENT, who, f"lists members {_ids(seen)}, {name} lists {_ids(expected)}"))
        services = list(listing.services) if listing is not None else []
        if not any(s.id == "etcd" for s in services):
            problems.append(Problem(ETCD_CONTROL_PLANES, who, "runs no etcd service (not a control plane)"))
        else:
            problems += service_problems(services, ("etcd",), who)
    return problems


def _ids(ids) -> str:
    return "[" + ", ".join(f"{i:x}" for i in ids) + "]"
