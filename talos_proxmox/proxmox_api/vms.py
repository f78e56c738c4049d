"""One VM through the Proxmox API: what is pending in its config, its power state, and a start.

A running VM takes most hardware changes (cores, memory, CPU type) as pending config; PVE applies
them when the VM next starts (`POST .../status/start`), not when the guest reboots itself. So the
guest is powered off first (day two asks Talos to shut down, which drains the node; PVE's own
reboot is an ACPI power-off that Talos answers with a forced, undrained shutdown), then started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import requests

TASK_POLL_SECONDS = 1.0
STILL_RUNNING_EVERY = 30.0


class ProxmoxTaskError(RuntimeError):
    """A PVE task ended in error or outlived its wait; the message has the task's type, VM and exit status."""


@dataclass(frozen=True)
class VmRef:
    host: str  # the Proxmox node the VM runs on
    vm_id: int

    def __str__(self) -> str:
        return f"VM {self.vm_id} on {self.host}"


def _qemu(api, vm: VmRef):
    return api.nodes(vm.host).qemu(vm.vm_id)


def pending_changes(api, vm: VmRef) -> dict[str, Any]:
    """Config keys waiting for the next power cycle: key -> new value (None for a pending delete)."""
    pending = {}
    for entry in _qemu(api, vm).pending.get() or []:
        if "pending" in entry:
            pending[entry["key"]] = entry["pending"]
        elif entry.get("delete"):
            pending[entry["key"]] = None
    return pending


def wait_task(api, host: str, upid: str, *, timeout: float, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> None:
    """Until the task has stopped; ProxmoxTaskError unless it exited OK."""
    deadline = clock() + timeout
    while True:
        status = api.nodes(host).tasks(upid).status.get()
        if status.get("status") == "stopped":
            if status.get("exitstatus") != "OK":
                raise ProxmoxTaskError(f"task {status.get('type', '?')} of VM {status.get('id', '?')} on {host} "
                                       f"ended with: {status.get('exitstatus')}")
            return
        if clock() >= deadline:
            raise ProxmoxTaskError(f"task {upid} on {host} still running after {timeout:g}s")
        sleep(TASK_POLL_SECONDS)


def is_stopped(api, vm: VmRef) -> bool:
    """Whether PVE reports the VM stopped (its status/current)."""
    return _qemu(api, vm).status.current.get().get("status") == "stopped"


def wait_stopped(api, vm: VmRef, *, timeout: float, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic,
                 still_running: Optional[Callable[[], None]] = None, every: float = STILL_RUNNING_EVERY) -> None:
    """Until PVE reports the VM stopped; ProxmoxTaskError if it still runs after `timeout` seconds.
    `still_running()` is called every `every` seconds of waiting (a drain can take minutes)."""
    deadline = clock() + timeout
    next_report = clock() + every
    while not is_stopped(api, vm):
        now = clock()
        if now >= deadline:
            raise ProxmoxTaskError(f"{vm} still running {timeout:g}s after its guest was asked to power off")
        if still_running is not None and now >= next_report:
            still_running()
            next_report = now + every
        sleep(TASK_POLL_SECONDS)


def start(api, vm: VmRef, *, timeout: float, sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic) -> None:
    """Start the stopped VM, which applies its pending config, and wait for the start task.

    A start that fails (PVE's "already running", or no answer in time) while the VM runs all the same is a
    start done: an earlier start PVE carried out late, after its caller had given up (a lock held by another
    task), applied the pending config as this one would have."""
    try:
        upid = _qemu(api, vm).status.start.post()
        wait_task(api, vm.host, upid, timeout=timeout, sleep=sleep, clock=clock)
    except Exception as error:
        try:
            running = _qemu(api, vm).status.current.get().get("status") == "running"
        except Exception:  # noqa: BLE001 - the start's own error is the one to report
            running = False
        if not running:
            if isinstance(error, requests.exceptions.Timeout):
                raise ProxmoxTaskError(f"PVE did not answer the start of {vm} in time (it may still carry it out, "
                                       "and the next `pulumi up` takes it from there)") from None
            raise
