"""A node's VM on day two: how a change of its cores, memory or CPU type rolls in.

The VM is created with `reboot_after_update: false`, so a change of cores, memory or CPU type on a
running VM waits in Proxmox as pending config instead of rebooting every VM at once (three control
planes rebooting together lose etcd quorum). The node's NodeLifecycle then brings the change in, one
node at a time in roll order: healthy first, a Talos shutdown (which cordons and drains the node, then
powers it off), a Proxmox start (which applies pending config), healthy again. What Proxmox can only
change by re-creating the VM, and what would lose data, is for `node_changes` to decide.

`vm` is the NodeLifecycle's record of the VM as the stack says it (`vm_facts` in the component):
host, vm_id (None: Proxmox picks), mac, cores, memory_mib, cpu_type, disk_gb, data_disk_gb (or None).
No Pulumi here.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Optional

from talos_proxmox.day_two import rolling
from talos_proxmox.day_two.cluster_health import KubeApi
from talos_proxmox.engine_values import with_integers
from talos_proxmox.proxmox_api import vms
from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.retry import Backoff

HARDWARE = {"cores": "cpu", "memory_mib": "memory", "cpu_type": "proxmox.cpuType"}  # fact -> stack key
POWER_OFF_SECONDS = 600  # Talos drains the node (pods have their grace periods) before it powers off
START_SECONDS = 120


def hardware_changes(old: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> dict[str, tuple]:
    """fact -> (old, new) for the hardware that changed. A VM recorded before this was tracked has none."""
    if not old:
        return {}
    old, new = with_integers(old), with_integers(new)  # through the engine every number is a float
    return {fact: (old.get(fact), new.get(fact)) for fact in HARDWARE if old.get(fact) != new.get(fact)}


def apply_hardware(client, api, node: rolling.RollNode, vm: vms.VmRef, changes: Mapping[str, tuple], *,
                   timeout: float, backoff: Backoff = rolling.DEFAULT_BACKOFF,
                   preflight_timeout: float = rolling.PREFLIGHT_TIMEOUT,
                   kube: Optional[Callable[[], Optional[KubeApi]]] = None,
                   on_event: Optional[rolling.Event] = None, sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> None:
    """Bring the VM's pending hardware in: node healthy, every other Node Ready (when `kube()` gives the
    Kubernetes API; a cluster whose API is down may need this very change), Talos shutdown, Proxmox start,
    node healthy again. A VM found stopped (a roll cut short after its shutdown) is started and must come
    back healthy.

    `client` is the node's Talos client, `api` a Proxmox client (proxmoxer). With nothing pending
    (Proxmox hot-plugged the change) the node is not touched. RollError names the node on failure.
    """
    event = on_event or (lambda _what, _name: None)
    deadline = clock() + timeout

    def left() -> float:
        return max(deadline - clock(), 1.0)

    what = ", ".join(f"{HARDWARE[fact]} {before} -> {after}" for fact, (before, after) in changes.items())
    try:
        stopped = vms.is_stopped(api, vm)
    except Exception as exc:  # noqa: BLE001 - proxmoxer raises its own and requests' errors
        raise rolling.RollError(node, f"reading the power state of {vm} failed: {exc}") from None
    if stopped:
        # An earlier roll stopped here (its up was cut short, or PVE's start failed) after Talos had drained
        # and powered off the node, or someone stopped the VM: the node is down already, so no health gate
        # first and no shutdown; the start applies what is pending, and the node must come back healthy.
        event(f"vm-found-stopped (starting it to apply {what})", node.name)
    else:
        rolling.wait_healthy(client, node, timeout=min(preflight_timeout, timeout), backoff=backoff, sleep=sleep,
                             clock=clock)
        event("healthy-before", node.name)
        try:
            pending = vms.pending_changes(api, vm)
        except Exception as exc:  # noqa: BLE001 - proxmoxer raises its own and requests' errors
            raise rolling.RollError(node, f"reading the pending config of {vm} failed: {exc}") from None
        if not pending:
            event(f"hardware-applied-live ({what})", node.name)
            return
        cluster = kube() if kube is not None else None
        if cluster is not None:
            rolling.wait_others_ready(cluster, node, timeout=min(preflight_timeout, left()), backoff=backoff,
                                      on_event=event, sleep=sleep, clock=clock)
        event(f"shutdown-requested ({what}; pending: {', '.join(sorted(pending))})", node.name)
        try:
            client.shutdown(force=False, timeout=rolling.CALL_TIMEOUT)
        except errors.TalosApiError as exc:
            raise rolling.RollError(node, f"Talos refused to shut down to apply {what}: {exc}") from None
    try:
        if not stopped:
            vms.wait_stopped(api, vm, timeout=min(POWER_OFF_SECONDS, left()), sleep=sleep, clock=clock,
                             still_running=lambda: event("draining (the VM is still running)", node.name))
            event("vm-stopped", node.name)
        vms.start(api, vm, timeout=min(START_SECONDS, left()), sleep=sleep, clock=clock)
    except Exception as exc:  # noqa: BLE001 - the task's failure, named by node
        raise rolling.RollError(node, f"power-cycling {vm} to apply {what} failed: {exc}") from None
    event("vm-started", node.name)
    rolling.wait_healthy(client, node, timeout=max(deadline - clock(), 0.001), backoff=backoff, sleep=sleep,
                         clock=clock)
    remaining = vms.pending_changes(api, vm)
    if remaining:
        raise rolling.RollError(node, f"{vm} started but still has pending config: {', '.join(sorted(remaining))}")
    event("healthy", node.name)
