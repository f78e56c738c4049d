"""Rolling node operations: one node at a time, control planes first, each back healthy before the next.

A roll goes through `roll_order(nodes)` (control planes, then workers, stack order within each) and
runs one step per node (`upgrade_node`, or a Kubernetes-version configuration apply followed by
`wait_healthy`). The first node whose step fails stops the roll: `RollError` names it, says what
failed, which nodes were done and which were not touched.

Healthy means: the node answers Version (with the expected Talos tag, when one is given); the
services a node of its role needs (apid, kubelet; etcd on a control plane) are Running and not
failing their health check; and a control plane is a voting etcd member (its address is in a
member's peer or client URLs, and that member is not a learner).

No Pulumi here. Clients are `talos_proxmox.talos_api.client.TalosClient` (mTLS, targeting the node);
clock, sleep and backoff are injectable so tests run against stand-in nodes in well under a second.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from talos_proxmox.day_two import node_drain, talos_health
from talos_proxmox.day_two.cluster_health import KubeApi, KubeApiError, not_ready
from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.retry import Backoff, GaveUp, call_with_retry

REQUIRED_SERVICES = talos_health.REQUIRED_SERVICES
DEFAULT_BACKOFF = Backoff(initial=2.0, factor=1.5, maximum=10.0)
CALL_TIMEOUT = 30.0  # one RPC; the step's timeout bounds the whole wait
PREFLIGHT_TIMEOUT = 120.0

Event = Callable[[str, str], None]  # (what happened, node name), e.g. ("upgrade-requested", "master-1")


@dataclass(frozen=True)
class RollNode:
    """A node as the roll sees it: `address` is its IP (the `node` target and how etcd knows it),
    `endpoint` what we dial (defaults to the address, port 50000)."""

    name: str
    address: str
    role: str
    endpoint: Optional[str] = None

    @property
    def dial(self) -> str:
        return self.endpoint or self.address


class NodeNotHealthy(Exception):
    """Raised while waiting; retried until the deadline (`retryable` is read by retry.call_with_retry)."""

    retryable = True


class RollError(RuntimeError):
    """A roll stopped at `node` (a RollNode); `done` were finished, `untouched` were not started."""

    def __init__(self, node: RollNode, what: str, done: Sequence[str] = (), untouched: Sequence[str] = ()):
        self.node, self.what, self.done, self.untouched = node, what, tuple(done), tuple(untouched)
        message = f"node {node.name} ({node.address}): {what}"
        if done or untouched:
            message = (f"rolling operation stopped at {message}; finished: {', '.join(done) or 'none'}; "
                       f"not touched: {', '.join(untouched) or 'none'}")
        super().__init__(message)


def roll_order(nodes: Iterable[RollNode]) -> list[RollNode]:
    """Control planes first, then workers; stack order within each role."""
    nodes = list(nodes)
    unknown = [n.name for n in nodes if n.role not in REQUIRED_SERVICES]
    if unknown:
        raise ValueError(f"role of node(s) {', '.join(unknown)} is not one of {', '.join(REQUIRED_SERVICES)}")
    return [n for n in nodes if n.role == "controlplane"] + [n for n in nodes if n.role == "worker"]


def health_problems(client: TalosClient, node: RollNode, expected_tag: Optional[str] = None,
                    call_timeout: float = CALL_TIMEOUT) -> list[str]:
    """What keeps the node from being healthy right now (empty: healthy), as talos_health checks it;
    for a control plane also the whole etcd cluster. Transport errors propagate."""
    problems = talos_health.node_problems(client, node.name, node.address, node.role, expected_tag=expected_tag,
                                          timeout=call_timeout)
    if node.role == "controlplane":
        problems += talos_health.etcd_problems(client, node.name, node.address, timeout=call_timeout)
    return [str(p) for p in problems]


def _retry_while_waiting(error: BaseException) -> bool:
    return isinstance(error, NodeNotHealthy) or errors.transient_while_rebooting(error)


def wait_healthy(client: TalosClient, node: RollNode, *, expected_tag: Optional[str] = None, timeout: float,
                 backoff: Backoff = DEFAULT_BACKOFF, sleep=time.sleep, clock=time.monotonic) -> None:
    """Poll `health_problems` until there are none; raise RollError naming the last problem at the deadline."""

    seen: list[str] = []  # the last health finding: a later timeout of one call must not hide it

    def check(remaining: float) -> None:
        problems = health_problems(client, node, expected_tag, min(CALL_TIMEOUT, remaining))
        if problems:
            seen[:] = ["; ".join(problems)]
            raise NodeNotHealthy(seen[0])

    try:
        call_with_retry(check, timeout=timeout, what=f"wait for {node.name} to be healthy", backoff=backoff,
                        retry_if=_retry_while_waiting, sleep=sleep, clock=clock)
    except GaveUp as exc:
        last = str(exc.last_error)
        if seen and last != seen[0]:
            last = f"{seen[0]} (then: {last})"
        raise RollError(node, f"not healthy after {timeout:g}s: {last}") from None
    except errors.TalosApiError as exc:
        raise RollError(node, f"health check failed: {exc}") from None


def wait_others_ready(api: KubeApi, node: RollNode, *, timeout: float, backoff: Backoff = DEFAULT_BACKOFF,
                      on_event: Optional[Event] = None, sleep=time.sleep, clock=time.monotonic) -> None:
    """Before `node` goes down: every other Node Ready in the API server, so that a roll never has two nodes
    down at once (one stopped by hand or crashed, or one not yet back in Kubernetes after its own step).
    Waits up to `timeout`, then RollError naming the nodes that are not Ready."""
    seen: list[str] = []

    def check(_remaining: float) -> None:
        listed = api.get("/api/v1/nodes") or {}
        found = [problem for other in listed.get("items") or ()
                 if (other.get("metadata") or {}).get("name") != node.name
                 for problem in [not_ready(other)] if problem]
        if found:
            if found != seen and on_event is not None:
                on_event(f"waiting for the other nodes ({'; '.join(found)})", node.name)
            seen[:] = found
            raise NodeNotHealthy("; ".join(found))

    try:
        call_with_retry(check, timeout=timeout, what=f"wait for the nodes beside {node.name} to be Ready",
                        backoff=backoff, sleep=sleep, clock=clock,
                        retry_if=lambda error: isinstance(error, NodeNotHealthy) or (
                            isinstance(error, KubeApiError) and error.retryable))
    except GaveUp as exc:
        raise RollError(node, f"not taken down: {exc.last_error} after {timeout:g}s, and a roll takes one node "
                              "down at a time (bring it back, or take it out of `nodes`)") from None
    except KubeApiError as exc:
        raise RollError(node, f"not taken down: the other nodes' readiness cannot be read: {exc}") from None


def _wait_rebooted(client: TalosClient, node: RollNode, tag_before: str, expected_tag: Optional[str], *,
                   timeout: float, backoff: Backoff, sleep, clock) -> None:
    """Wait until the node has gone down (or already reports the new tag): an upgrade ack only means
    the node accepted the request; it drains and installs before it reboots."""

    seen: list[str] = []

    def gone_down(remaining: float) -> None:
        call_timeout = min(CALL_TIMEOUT, remaining)
        try:
            reply = talos_health.first_message(client.version(timeout=call_timeout))
        except errors.TalosApiError as exc:
            if seen and call_timeout < CALL_TIMEOUT and isinstance(exc, errors.TalosDeadlineExceeded):
                # only our own deadline cut this call short: no sign the node that just answered went down
                raise NodeNotHealthy(f"still running Talos {seen[-1] or '?'}; waiting for it to reboot") from None
            if errors.transient_while_rebooting(exc):
                return  # unreachable: it is rebooting
            raise
        tag = reply.version.tag if reply is not None else ""
        seen.append(tag)
        if expected_tag and tag == expected_tag and tag != tag_before:
            return  # already back on the new version
        raise NodeNotHealthy(f"still running Talos {tag or '?'}; waiting for it to reboot")

    try:
        call_with_retry(gone_down, timeout=timeout, what=f"wait for {node.name} to reboot", backoff=backoff,
                        retry_if=lambda e: isinstance(e, NodeNotHealthy), sleep=sleep, clock=clock)
    except GaveUp as exc:
        raise RollError(node, f"did not reboot into the upgrade within {timeout:g}s: {exc.last_error}") from None
    except errors.TalosApiError as exc:  # e.g. PERMISSION_DENIED: an answer, not a node going down
        raise RollError(node, f"failed while waiting for it to reboot into the upgrade: {exc}") from None


def uses_lifecycle_api(tag: str) -> bool:
    """Whether a node running Talos `tag` is upgraded through ImageService.Pull and LifecycleService.Upgrade,
    as talosctl 1.13 does for nodes in its range ">1.13.0-alpha.2 <2.0.0"; older nodes (and a tag that
    is not a version) take MachineService.Upgrade, which Talos serves until 1.18."""
    match = re.fullmatch(r"v?(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?", tag or "")
    if match is None:
        return False
    major, minor, patch = (int(part) for part in match.groups()[:3])
    if major != 1 or (minor, patch) < (13, 0):
        return False
    if (minor, patch) > (13, 0) or match.group(4) is None:
        return True
    return _prerelease_order(match.group(4)) > _prerelease_order("alpha.2")


def _prerelease_order(prerelease: str) -> tuple:
    """Semantic-version precedence of a pre-release: numbers numerically, below words, which sort as text."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in prerelease.split("."))


def etcd_quorum_problem(client: TalosClient, node: RollNode, call_timeout: float = CALL_TIMEOUT) -> Optional[str]:
    """Why taking this control plane down would lose etcd quorum, as Talos's own pre-upgrade check
    (ValidateForUpgrade) refuses it: with two members, the other one alone has no majority."""
    reply = talos_health.first_message(client.etcd_member_list(timeout=call_timeout, node=node.address))
    members = list(reply.members) if reply is not None else []
    if len(members) == 2:
        return ("etcd has 2 members, so the other one alone loses quorum while this one is down; "
                "add a third control plane first (or remove one)")
    return None


def _install_with_lifecycle_api(client: TalosClient, node: RollNode, image: str, *, remaining: Callable[[], float],
                                backoff: Backoff, event: Event, sleep, clock) -> None:
    """Pull the installer, then install it (the node keeps running the old version until it reboots)."""

    def attempt(call, what: str):
        try:
            return call_with_retry(call, timeout=remaining(), what=f"{what} on {node.name}", backoff=backoff,
                                   retry_if=errors.transient_while_rebooting, sleep=sleep, clock=clock)
        except (GaveUp, errors.TalosApiError) as exc:
            raise RollError(node, f"{what} failed: {exc}") from None

    pulled = attempt(lambda left: client.pull_image(image, timeout=left), f"pulling the installer {image}")
    event("installer-pulled", node.name)
    exit_code, lines = attempt(lambda left: client.lifecycle_upgrade(pulled, timeout=left),
                               f"installing {image}")
    if exit_code != 0:
        said = f"; it said: {' | '.join(lines[-3:])}" if lines else ""
        how = "ended without an exit code" if exit_code is None else f"exited with code {exit_code}"
        raise RollError(node, f"the installer {image} {how}; the node still runs its old version{said}")
    event("installed", node.name)


def _request_upgrade(client: TalosClient, node: RollNode, image: str, *, remaining: Callable[[], float],
                     deadline_passed: Callable[[], bool], backoff: Backoff, event: Event, sleep,
                     clock) -> Optional[errors.TalosApiError]:
    """MachineService.Upgrade, asked again only while nothing answers (the request never reached the
    node). A call that ran out of time may have been delivered, and the node may be draining and
    installing already: asking again would upgrade it twice, so the reboot wait after this decides.
    Returns that timeout, or None once the node acknowledged the request."""

    def not_delivered(error: BaseException) -> bool:
        return errors.transient_while_rebooting(error) and not isinstance(error, errors.TalosDeadlineExceeded)

    try:
        call_with_retry(lambda left: client.upgrade(image, timeout=min(CALL_TIMEOUT, left)),
                        timeout=remaining(), what=f"upgrade {node.name}", backoff=backoff, retry_if=not_delivered,
                        sleep=sleep, clock=clock)
    except errors.TalosDeadlineExceeded as exc:
        if deadline_passed():
            raise RollError(node, f"upgrade to {image} got no answer before the roll's deadline ({exc}); the node "
                                  f"may still reboot into it") from None
        event("upgrade-request-unanswered", node.name)
        return exc
    except (GaveUp, errors.TalosApiError) as exc:
        raise RollError(node, f"upgrade to {image} was refused: {exc}") from None
    event("upgrade-requested", node.name)
    return None


def _reboot(client: TalosClient, node: RollNode, event: Event) -> None:
    """One Reboot, never repeated: a reply lost to a node already going down is no reason to reboot it
    twice; whether it went down is what the wait after this sees."""
    try:
        client.reboot(mode="default", timeout=CALL_TIMEOUT)
    except errors.TalosApiError as exc:
        if not errors.transient_while_rebooting(exc):
            raise RollError(node, f"the reboot into the installed upgrade was refused: {exc}") from None
    event("reboot-requested", node.name)


def upgrade_node(client: TalosClient, node: RollNode, image: str, *, talos_version: Optional[str],
                 timeout: float, preflight_timeout: float = PREFLIGHT_TIMEOUT, backoff: Backoff = DEFAULT_BACKOFF,
                 on_event: Optional[Event] = None, before_upgrade: Optional[Callable[[], None]] = None,
                 kube: Optional[Callable[[], KubeApi]] = None, drain_timeout: float = node_drain.DEFAULT_DRAIN_TIMEOUT,
                 sleep=time.sleep, clock=time.monotonic) -> None:
    """Upgrade one node to the installer `image` and wait until it is back, healthy, on `talos_version`.

    The node must be healthy first (a node that is already failing is not made worse), a control
    plane must not be one of two etcd members, and (Talos 1.13 and later, through the Kubernetes API)
    every other Node must be Ready. A node that already runs `talos_version` (a rerun after a roll
    stopped part-way) is left alone. Then, as `talosctl upgrade` does for the node's version:
    - Talos 1.13 and later (`uses_lifecycle_api`): pull the installer, install it, drain the node through
      the Kubernetes API `kube()` gives (node_drain; Talos's Reboot does not drain), reboot, and
      uncordon once it is healthy again (unless it was cordoned before);
    - older: MachineService.Upgrade with preserve, stage and force off (Talos drains, installs and
      reboots; `preserve=true` would skip Talos's etcd checks before the upgrade).
    """
    event = on_event or (lambda _what, _name: None)
    deadline = clock() + timeout

    def remaining() -> float:
        return max(deadline - clock(), 0.001)

    wait_healthy(client, node, timeout=min(preflight_timeout, timeout), backoff=backoff, sleep=sleep, clock=clock)
    event("healthy-before", node.name)
    tag_before = talos_health.first_message(client.version(timeout=CALL_TIMEOUT)).version.tag
    if talos_version is not None and tag_before == talos_version:
        event("already-upgraded", node.name)
        return
    if node.role == "controlplane":
        problem = etcd_quorum_problem(client, node)
        if problem:
            raise RollError(node, f"not upgraded: {problem}")
    # before anything is done: a node that cannot be drained, or beside a node that is down, is left as it is
    api = kube() if kube is not None and uses_lifecycle_api(tag_before) else None
    if api is not None:
        wait_others_ready(api, node, timeout=min(preflight_timeout, remaining()), backoff=backoff, on_event=event,
                          sleep=sleep, clock=clock)
    if before_upgrade is not None:
        before_upgrade()  # e.g. the etcd snapshot, once it is certain the node is going down
    if not uses_lifecycle_api(tag_before):
        unanswered = _request_upgrade(client, node, image, remaining=remaining,
                                      deadline_passed=lambda: clock() >= deadline, backoff=backoff, event=event,
                                      sleep=sleep, clock=clock)
        try:
            _back_healthy(client, node, tag_before, talos_version, remaining=remaining, backoff=backoff,
                          event=event, sleep=sleep, clock=clock)
        except RollError as exc:
            if unanswered is None:
                raise
            raise RollError(node, f"the upgrade request to {image} got no answer ({unanswered}); then it "
                                  f"{exc.what}") from None
        return
    _install_with_lifecycle_api(client, node, image, remaining=remaining, backoff=backoff, event=event, sleep=sleep,
                                clock=clock)
    uncordon_after = False  # a node someone cordoned before stays cordoned
    if api is None:
        event("drain-skipped (no Kubernetes API)", node.name)
    else:
        try:
            uncordon_after = not node_drain.is_unschedulable(api, node.name)
            node_drain.drain(api, node.name, timeout=min(drain_timeout, remaining()),
                             on_event=lambda what: event(what, node.name), sleep=sleep, clock=clock)
        except (node_drain.DrainError, KubeApiError) as exc:
            if uncordon_after:
                _uncordon(api, node, event, strict=False)
            raise RollError(node, f"{exc}; not rebooted (the new version is installed and starts at its next "
                                  f"reboot)") from None
    try:
        _reboot(client, node, event)
        _back_healthy(client, node, tag_before, talos_version, remaining=remaining, backoff=backoff, event=event,
                      sleep=sleep, clock=clock)
    except BaseException:
        if uncordon_after:
            _uncordon(api, node, event, strict=False)  # as talosctl does; the roll's own error is what counts
        raise
    if uncordon_after:
        _uncordon(api, node, event, strict=True)
    elif api is not None:
        event("left cordoned (it was before the upgrade)", node.name)


def _back_healthy(client: TalosClient, node: RollNode, tag_before: str, talos_version: Optional[str], *,
                  remaining: Callable[[], float], backoff: Backoff, event: Event, sleep, clock) -> None:
    _wait_rebooted(client, node, tag_before, talos_version, timeout=remaining(), backoff=backoff, sleep=sleep,
                   clock=clock)
    event("rebooted", node.name)
    wait_healthy(client, node, expected_tag=talos_version, timeout=remaining(), backoff=backoff, sleep=sleep,
                 clock=clock)
    event("healthy", node.name)


def _uncordon(api: KubeApi, node: RollNode, event: Event, *, strict: bool) -> None:
    try:
        node_drain.set_unschedulable(api, node.name, False)
    except (node_drain.DrainError, KubeApiError) as exc:
        if strict:
            raise RollError(node, f"upgraded and healthy, but still cordoned: uncordon failed: {exc}") from None
        event(f"uncordon-failed ({exc})", node.name)
        return
    event("uncordoned", node.name)


def roll(nodes: Iterable[RollNode], step: Callable[[RollNode], None], *,
         on_event: Optional[Event] = None) -> list[str]:
    """Run `step` on each node in roll order; the first failure stops the roll with RollError.
    Returns the names of the nodes done, in order."""
    order = roll_order(nodes)
    done: list[str] = []
    for index, node in enumerate(order):
        if on_event:
            on_event("start", node.name)
        try:
            step(node)
        except Exception as exc:  # noqa: BLE001 - every failure stops the roll, named by node
            what = exc.what if isinstance(exc, RollError) else str(exc)
            raise RollError(node, what, done, [n.name for n in order[index + 1:]]) from exc
        done.append(node.name)
        if on_event:
            on_event("done", node.name)
    return done


def client_for(node: RollNode, talosconfig, *, timeout: float = CALL_TIMEOUT) -> TalosClient:
    """An mTLS client from the talosconfig that dials the node and targets it (talosctl -n X -e X)."""
    return TalosClient.from_talosconfig(talosconfig, endpoints=[node.dial], node=node.address, timeout=timeout)


def roll_predecessors(nodes: Iterable[RollNode]) -> dict[str, Optional[str]]:
    """For each node, the node before it in roll order (None for the first): what its NodeLifecycle
    depends on, so that Pulumi runs upgrades one at a time in this order."""
    order = roll_order(nodes)
    return {node.name: (order[i - 1].name if i else None) for i, node in enumerate(order)}
