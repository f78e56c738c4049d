"""Multi-step Talos API operations the resources run: apply a machine configuration (insecure the
first time, mTLS afterwards) and wait for the node, wait for many installing nodes at once, bootstrap
etcd once, fetch the kubeconfig.

No Pulumi here; each function takes plain values, retries what a booting node makes transient,
and gives up with retry.GaveUp (naming the endpoint and the last error) after `timeout` seconds.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import time
from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import grpc

from . import errors
from .client import APPLY_MODES, TalosClient, read_talosconfig
from .kubeconfig import extract_kubeconfig
from .generated.machine import machine_pb2
from .retry import Backoff, GaveUp, call_with_retry, is_retryable

DEFAULT_BACKOFF = Backoff(initial=2.0, factor=2.0, maximum=15.0)  # read at call time (tests shorten it)
CALL_TIMEOUT = 60.0  # seconds for one RPC; the overall timeout bounds the whole operation


def config_sha256(machine_configuration: str | bytes) -> str:
    """What we remember of an applied configuration: its hash, never the text."""
    data = machine_configuration.encode() if isinstance(machine_configuration, str) else machine_configuration
    return hashlib.sha256(data).hexdigest()


def credentials_sha256(talosconfig: str | Mapping) -> str:
    """What a talosconfig authenticates with (OS CA, client certificate and key), hashed; not where it
    points: its endpoints change whenever a control plane is added or removed."""
    credentials = read_talosconfig(talosconfig).credentials
    return hashlib.sha256(b"\0".join((credentials.ca_pem, credentials.cert_pem, credentials.key_pem))).hexdigest()


def check_mode(mode: str) -> None:
    if mode not in APPLY_MODES:
        raise ValueError(f"mode {mode!r} is not supported; expected one of {', '.join(APPLY_MODES)}")


@dataclass(frozen=True)
class ApplyOutcome:
    via: str  # "insecure" (node was in maintenance) or "mtls"
    mode: str  # what the node reports it did, e.g. NO_REBOOT, STAGED
    mode_details: str
    warnings: tuple[str, ...]
    rebooted: bool


class _Deadline:
    def __init__(self, timeout: float, clock: Callable[[], float]):
        self._clock = clock
        self._end = clock() + timeout

    def remaining(self) -> float:
        return max(self._end - self._clock(), 0.0)


def _mtls_client(talosconfig: str | Mapping, endpoint: str, node: str) -> TalosClient:
    credentials = read_talosconfig(talosconfig).credentials
    return TalosClient([endpoint], credentials=credentials, node=node)


def _transient_apply(error: BaseException) -> bool:
    return is_retryable(error) or (
        getattr(error, "code", None) == grpc.StatusCode.FAILED_PRECONDITION
        and "already in progress" in getattr(error, "explanation", "")
    )


def _not_ready_yet(error: BaseException) -> bool:
    """Bootstrap and Kubeconfig answers of a control plane that is still starting."""
    if errors.transient_while_rebooting(error):
        return True
    code = getattr(error, "code", None)
    if code == grpc.StatusCode.FAILED_PRECONDITION:  # "bootstrap is not available yet", "time is not in sync yet"
        return True
    return code == grpc.StatusCode.UNIMPLEMENTED and "machine type is not set" in getattr(error, "explanation", "")


def wait_until_ready(client: TalosClient, *, timeout: float, what: str, backoff: Backoff | None = None,
                     sleep=time.sleep, clock=time.monotonic) -> str:
    """Wait for the node to answer Version over the client's connection; returns the Talos tag."""
    backoff = backoff or DEFAULT_BACKOFF
    reply = call_with_retry(
        lambda remaining: client.version(timeout=min(CALL_TIMEOUT, remaining)),
        timeout=timeout, what=what, backoff=backoff, retry_if=errors.transient_while_rebooting,
        sleep=sleep, clock=clock,
    )
    return reply.messages[0].version.tag if reply.messages else ""


class NodesNotReady(RuntimeError):
    """Some nodes did not answer over mTLS in time; `failed` maps each one's name to why."""

    def __init__(self, failed: Mapping[str, str], ready: tuple[str, ...]):
        self.failed, self.ready = dict(failed), ready
        named = "; ".join(f"node {name}: {why}" for name, why in self.failed.items())
        super().__init__(f"{len(self.failed)} of {len(self.failed) + len(ready)} nodes did not come up "
                         f"configured: {named}")


def wait_until_all_ready(nodes: Mapping[str, str], client_for: Callable[[str], TalosClient], *, timeout: float,
                         backoff: Backoff | None = None,
                         on_ready: Optional[Callable[[str, str], None]] = None) -> dict[str, str]:
    """Wait for every node (name -> address) at once, each until it answers Version over mTLS (it has
    installed and rebooted into its configuration); returns name -> Talos tag. The nodes install in
    parallel, so this takes as long as the slowest one, however many there are. `on_ready(name, tag)`
    hears of each as it comes up. Raises NodesNotReady naming every node that did not, after all
    the others are done."""
    tags, failed = {}, {}

    def wait(name: str) -> str:
        with client_for(nodes[name]) as client:
            tag = wait_until_ready(client, timeout=timeout, what=f"wait for {name} to install", backoff=backoff)
        if on_ready:
            on_ready(name, tag)
        return tag

    if not nodes:
        return {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(nodes), thread_name_prefix="install-wait") as pool:
        waits = {name: pool.submit(wait, name) for name in nodes}
        for name, future in waits.items():
            try:
                tags[name] = future.result()
            except (GaveUp, errors.TalosApiError) as exc:
                failed[name] = str(exc)
    if failed:
        raise NodesNotReady(failed, tuple(tags))
    return tags


PROBE_FLOOR = 1.0  # seconds at least for each "still up?" probe
REBOOT_START_TIMEOUT = 120.0  # a node that said it reboots and still answers after this did not


class _StillAnswering(Exception):
    retryable = True


def went_down(client: TalosClient, name: str, *, timeout: float, backoff: Backoff | None = None,
              sleep=time.sleep, clock=time.monotonic) -> bool:
    """Poll Version until the node stops answering (rebooting, reset or powered off): True once it has,
    False if it still answers at the deadline. Errors other than a node being away propagate."""

    def still_up(remaining: float) -> None:
        try:
            # at least PROBE_FLOOR: a probe cut to a sliver by the deadline would time out and read as "down"
            client.version(timeout=max(min(CALL_TIMEOUT, remaining), PROBE_FLOOR))
        except errors.TalosApiError as exc:
            if errors.transient_while_rebooting(exc):
                return
            raise
        raise _StillAnswering(f"{name} still answers")

    try:
        call_with_retry(still_up, timeout=timeout, what=f"wait for {name} to go down",
                        backoff=backoff or DEFAULT_BACKOFF, retry_if=lambda e: isinstance(e, _StillAnswering),
                        sleep=sleep, clock=clock)
        return True
    except GaveUp:
        return False


def wait_until_down(client: TalosClient, node: str, *, timeout: float, backoff: Backoff | None = None,
                    sleep=time.sleep, clock=time.monotonic) -> None:
    """`went_down`, for a node that said it reboots: TimeoutError if it never does."""
    if not went_down(client, node, timeout=timeout, backoff=backoff, sleep=sleep, clock=clock):
        raise TimeoutError(f"node {node} said the configuration needs a reboot but kept answering for "
                           f"{timeout:g}s without going down")


def apply_machine_configuration(
    node: str,
    machine_configuration: str | bytes,
    talosconfig: str | Mapping,
    *,
    endpoint: str | None = None,
    mode: str = "auto",
    try_timeout: float | None = None,
    insecure_first: bool = True,
    wait: bool = True,
    timeout: float = 600.0,
    backoff: Backoff | None = None,
    sleep=time.sleep,
    clock=time.monotonic,
) -> ApplyOutcome:
    """Apply a configuration to one node and wait for it to be back.

    insecure_first (creation): try without a client certificate, as a node in maintenance mode
    expects; such a node always gets AUTO (it installs and reboots into the configuration, whatever
    mode is asked for updates). A node that refuses because it needs a client certificate is already
    configured (a re-run, or adoption), so the same configuration goes over mTLS instead.
    mTLS modes: auto, no-reboot, staged, try (rolled back after try_timeout seconds) and reboot,
    which configured Talos no longer accepts as an apply mode: it is done as staged + Reboot.
    With wait, returns once the node answers over mTLS after any reboot.
    """
    check_mode(mode)
    backoff = backoff or DEFAULT_BACKOFF
    endpoint = endpoint or node
    data = machine_configuration.encode() if isinstance(machine_configuration, str) else machine_configuration
    deadline = _Deadline(timeout, clock)
    state = {"configured": not insecure_first}

    with TalosClient([endpoint]) as insecure, _mtls_client(talosconfig, endpoint, node) as mtls:

        def attempt(remaining: float):
            call_timeout = min(CALL_TIMEOUT, remaining)
            if not state["configured"]:
                try:
                    return "insecure", insecure.apply_configuration(data, mode="auto", timeout=call_timeout)
                except errors.TalosTlsError as exc:
                    if exc.reason != "client-cert-required":
                        raise
                    state["configured"] = True
            wire_mode = "staged" if mode == "reboot" else mode
            return "mtls", mtls.apply_configuration(data, mode=wire_mode, try_timeout=try_timeout,
                                                    timeout=call_timeout)

        via, reply = call_with_retry(attempt, timeout=deadline.remaining(), what=f"apply configuration to {node}",
                                     backoff=backoff, retry_if=_transient_apply, sleep=sleep, clock=clock)
        message = reply.messages[0] if reply.messages else None
        rebooted = via == "insecure"
        if via == "mtls" and message is not None and message.mode == machine_pb2.ApplyConfigurationRequest.REBOOT:
            # AUTO resolved to a reboot: the node goes down a moment after this reply. Returning now
            # would let the next node go down with it.
            wait_until_down(mtls, node, timeout=min(REBOOT_START_TIMEOUT, deadline.remaining()),
                            backoff=backoff, sleep=sleep, clock=clock)
            rebooted = True
            wait = True
        if via == "mtls" and mode == "reboot":
            call_with_retry(lambda remaining: mtls.reboot(timeout=min(CALL_TIMEOUT, remaining)),
                            timeout=deadline.remaining(), what=f"reboot {node}", backoff=backoff,
                            sleep=sleep, clock=clock)
            rebooted = True
        if wait:
            wait_until_ready(mtls, timeout=deadline.remaining(), what=f"wait for {node} after apply",
                             backoff=backoff, sleep=sleep, clock=clock)

    if message is None:
        message = machine_pb2.ApplyConfiguration()
    return ApplyOutcome(
        via=via,
        mode=machine_pb2.ApplyConfigurationRequest.Mode.Name(message.mode),
        mode_details=message.mode_details,
        warnings=tuple(message.warnings),
        rebooted=rebooted,
    )


def apply_needs_reboot(node: str, machine_configuration: str | bytes, talosconfig: str | Mapping, *,
                       endpoint: str | None = None, timeout: float = 600.0, backoff: Backoff | None = None,
                       sleep=time.sleep, clock=time.monotonic) -> bool:
    """Whether a configured node would reboot to take `machine_configuration` in AUTO mode: Talos's own
    dry run (`talosctl apply-config --dry-run`), which changes nothing."""
    backoff = backoff or DEFAULT_BACKOFF
    data = machine_configuration.encode() if isinstance(machine_configuration, str) else machine_configuration
    with _mtls_client(talosconfig, endpoint or node, node) as mtls:
        reply = call_with_retry(
            lambda remaining: mtls.apply_configuration(data, mode="auto", dry_run=True,
                                                       timeout=min(CALL_TIMEOUT, remaining)),
            timeout=timeout, what=f"dry-run apply to {node}", backoff=backoff, retry_if=_transient_apply,
            sleep=sleep, clock=clock)
    return any(message.mode == machine_pb2.ApplyConfigurationRequest.REBOOT for message in reply.messages)


def bootstrap_etcd(node: str, talosconfig: str | Mapping, *, endpoint: str | None = None, timeout: float = 600.0,
                   recover_from: bytes | None = None, backoff: Backoff | None = None, sleep=time.sleep,
                   clock=time.monotonic) -> bool:
    """Bootstrap etcd on a control plane node; returns False if it was already bootstrapped.

    Talos answers a second bootstrap with ALREADY_EXISTS ("etcd data directory is not empty"),
    which is success for us; FAILED_PRECONDITION means "not yet" and is retried. With `recover_from`
    (an etcd snapshot's bytes), the snapshot is uploaded first and etcd starts from it, as `talosctl
    bootstrap --recover-from` does; a copy of a member's data directory (no sha256 at its end) skips
    etcd's hash check.
    """
    backoff = backoff or DEFAULT_BACKOFF
    skip_hash_check = recover_from is not None and len(recover_from) % 512 != 32
    with _mtls_client(talosconfig, endpoint or node, node) as mtls:

        def attempt(remaining: float) -> bool:
            try:
                if recover_from is not None:
                    mtls.etcd_recover(recover_from, timeout=min(CALL_TIMEOUT, remaining))
                mtls.bootstrap(recover_etcd=recover_from is not None, recover_skip_hash_check=skip_hash_check,
                               timeout=min(CALL_TIMEOUT, remaining))
            except errors.TalosApiError as exc:
                if exc.code == grpc.StatusCode.ALREADY_EXISTS:
                    return False
                raise
            return True

        what = f"{'recover' if recover_from is not None else 'bootstrap'} etcd on {node}"
        return call_with_retry(attempt, timeout=timeout, what=what, backoff=backoff,
                               retry_if=_not_ready_yet, sleep=sleep, clock=clock)


def fetch_kubeconfig(node: str, talosconfig: str | Mapping, *, endpoint: str | None = None, timeout: float = 600.0,
                     backoff: Backoff | None = None, sleep=time.sleep, clock=time.monotonic) -> str:
    """The cluster's admin kubeconfig from a control plane node (Talos issues a new client
    certificate on every call)."""
    backoff = backoff or DEFAULT_BACKOFF
    with _mtls_client(talosconfig, endpoint or node, node) as mtls:
        data = call_with_retry(lambda remaining: mtls.kubeconfig(timeout=min(CALL_TIMEOUT, remaining)),
                               timeout=timeout, what=f"kubeconfig from {node}", backoff=backoff,
                               retry_if=_not_ready_yet, sleep=sleep, clock=clock)
    return extract_kubeconfig(data)
