"""Taking a node out of the cluster before its VM is destroyed: etcd membership first, then a reset.

Control plane, reachable: EtcdLeaveCluster on the node itself. If the node answers but cannot
leave (its etcd is failing), or does not answer at all, its member is removed through another
control plane with EtcdRemoveMemberByID (matched by the node's address in the member URLs). The
last etcd member is never removed: that would destroy the cluster's data; it is only reset.
Only one etcd membership change runs at a time per cluster (`membership_lock`): the engine deletes
independent resources in parallel, and two control planes leaving at once could take quorum with them.
Then, if the node answers: Reset (graceful: cordon and drain, wipe; no reboot, so it powers off)
and a wait until it has gone down. An unreachable node cannot be reset; its VM is about to be
destroyed, so that is reported, not an error. Workers: only the reset.

No Pulumi here; the steps taken are returned as short strings, for the resource's log and for tests.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence

from talos_proxmox.day_two.rolling import (
    CALL_TIMEOUT,
    DEFAULT_BACKOFF,
    Event,
    RollNode,
)
from talos_proxmox.day_two.talos_health import etcd_member_of
from talos_proxmox.talos_api import errors, operations
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.retry import Backoff, GaveUp, call_with_retry

REACH_TIMEOUT = 60.0  # how long an unanswering node is given before it counts as gone
PROBE_TIMEOUT = 5.0  # a first quick look at which peers answer, so a gone one is not waited on first


LOCK_DIR = Path(tempfile.gettempdir()) / "talos-proxmox-etcd-locks"


@contextlib.contextmanager
def membership_lock(cluster_key: Optional[str]) -> Iterator[None]:
    """Hold the cluster's etcd-membership lock: an exclusive flock on a file named after the cluster, so
    removals in other threads of the provider host, or other processes, wait their turn. None: no lock."""
    if cluster_key is None:
        yield
        return
    LOCK_DIR.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{cluster_key}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


class RemovalError(RuntimeError):
    """The node could not be taken out of etcd; the VM must not be destroyed yet."""


def _retrying(call, *, timeout: float, what: str, backoff: Backoff, sleep, clock):
    return call_with_retry(lambda remaining: call(min(CALL_TIMEOUT, remaining)), timeout=timeout, what=what,
                           backoff=backoff, retry_if=errors.transient_while_rebooting, sleep=sleep, clock=clock)


def _members(reply):
    return list(reply.messages[0].members) if reply.messages else []


def answering_first(peers: Sequence[RollNode], client_for: Callable[[RollNode], TalosClient],
                    probe_timeout: float = PROBE_TIMEOUT) -> list[RollNode]:
    """`peers` with those that answer Version within `probe_timeout` first, each group in its order. A
    removal's peers come from the state, which may still list a control plane removed since."""

    def answers(peer: RollNode) -> bool:
        try:
            with client_for(peer) as client:
                client.version(timeout=probe_timeout)
            return True
        except errors.TalosApiError:
            return False

    if len(peers) < 2:
        return list(peers)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(peers), thread_name_prefix="peer-probe") as pool:
        answering = list(pool.map(answers, peers))
    return [p for p, ok in zip(peers, answering) if ok] + [p for p, ok in zip(peers, answering) if not ok]


def _remove_via_peer(node: RollNode, peers: Sequence[RollNode], client_for: Callable[[RollNode], TalosClient], *,
                     reach_timeout: float, backoff: Backoff, sleep, clock) -> str:
    tried = []
    others = [peer for peer in peers if peer.address != node.address]
    for peer in answering_first(others, client_for, min(PROBE_TIMEOUT, reach_timeout)):
        try:
            with client_for(peer) as client:
                members = _members(_retrying(lambda t: client.etcd_member_list(timeout=t), timeout=reach_timeout,
                                             what=f"etcd members via {peer.name}", backoff=backoff, sleep=sleep,
                                             clock=clock))
                member = etcd_member_of(members, node.address)
                if member is None:
                    return f"etcd-member-already-gone via {peer.name}"
                _retrying(lambda t: client.etcd_remove_member_by_id(member.id, timeout=t), timeout=reach_timeout,
                          what=f"remove etcd member {member.id:x} via {peer.name}", backoff=backoff, sleep=sleep,
                          clock=clock)
                return f"etcd-remove-member via {peer.name}"
        except (GaveUp, errors.TalosApiError) as exc:
            tried.append(f"{peer.name}: {exc}")
    raise RemovalError(
        f"node {node.name} ({node.address}): its etcd member could not be removed; the node cannot leave by "
        f"itself and no other control plane removed it ({'; '.join(tried) or 'no other control plane known'}). "
        "Remove it by hand (talosctl etcd remove-member) before destroying the VM; if the whole cluster is "
        "gone, drop this node's lifecycle resource from the state (pulumi state delete) instead.")


def remove_node(node: RollNode, client_for: Callable[[RollNode], TalosClient], peers: Sequence[RollNode] = (), *,
                reset: bool = True, timeout: float = 600.0, reach_timeout: float = REACH_TIMEOUT,
                cluster_key: Optional[str] = None,
                backoff: Backoff = DEFAULT_BACKOFF, on_event: Optional[Event] = None,
                sleep=time.sleep, clock=time.monotonic) -> list[str]:
    """Take `node` out of etcd (control planes) and reset it; returns the steps taken, in order.

    `peers` are the other control planes, used when the node cannot leave etcd itself. `cluster_key`
    names the cluster's membership lock (see `membership_lock`).
    Raises RemovalError when a control plane's etcd member can be removed neither way.
    """
    steps: list[str] = []

    def step(what: str) -> None:
        steps.append(what)
        if on_event:
            on_event(what, node.name)

    opts = dict(backoff=backoff, sleep=sleep, clock=clock)
    with client_for(node) as client:
        reachable, last_member = True, False
        if node.role == "controlplane":
            with membership_lock(cluster_key):
                reachable, last_member = _leave_etcd(node, client, peers, client_for, step,
                                                     reach_timeout=reach_timeout, **opts)
        else:
            try:
                _retrying(lambda t: client.version(timeout=t), timeout=reach_timeout, what=f"reach {node.name}",
                          **opts)
            except (GaveUp, errors.TalosApiError):
                reachable = False

        if not reset:
            step("reset-disabled")
        elif not reachable:
            step("reset-skipped-unreachable")
        else:
            # A graceful reset of the last etcd member would try to leave etcd and fail.
            _retrying(lambda t: client.reset(graceful=not last_member, reboot=False, timeout=t),
                      timeout=reach_timeout, what=f"reset {node.name}", **opts)
            step("reset")
            step("down" if operations.went_down(client, node.name, timeout=timeout, **opts)
                 else "still-answering-after-reset")
    return steps


def leaves_a_cluster(steps: Sequence[str]) -> bool:
    """Whether a cluster remains after a removal that took `steps`: not when the node was the last etcd
    member (a `pulumi destroy` reaching the last control plane), so there is no Node object left to delete."""
    return "etcd-last-member-kept" not in steps


def _leave_etcd(node: RollNode, client: TalosClient, peers: Sequence[RollNode],
                client_for: Callable[[RollNode], TalosClient], step: Callable[[str], None], *,
                reach_timeout: float, **opts) -> tuple[bool, bool]:
    """The membership change itself: leave, or removal through a peer. Returns (reachable, last member)."""
    reachable, last_member = True, False
    try:
        members = _members(_retrying(lambda t: client.etcd_member_list(timeout=t), timeout=reach_timeout,
                                     what=f"etcd members of {node.name}", **opts))
    except GaveUp:
        reachable, members = False, None
    except errors.TalosApiError:
        members = None  # it answers, but its etcd does not: remove the member from elsewhere
    if members is None:
        step(_remove_via_peer(node, peers, client_for, reach_timeout=reach_timeout, **opts))
        return reachable, last_member
    member = etcd_member_of(members, node.address)
    last_member = member is not None and len(members) == 1
    if member is None:
        step("etcd-not-a-member")
    elif last_member:
        step("etcd-last-member-kept")
    else:
        try:
            _retrying(lambda t: client.etcd_leave_cluster(timeout=t), timeout=reach_timeout,
                      what=f"{node.name} leaves etcd", **opts)
            step("etcd-leave")
        except (GaveUp, errors.TalosApiError):
            step(_remove_via_peer(node, peers, client_for, reach_timeout=reach_timeout, **opts))
    return reachable, last_member
