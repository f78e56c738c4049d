"""One VM through the Proxmox API: what is pending in its config, and a reboot that applies it.

A running VM takes most hardware changes (cores, memory, CPU type) as pending config; PVE applies
them at the VM's next power cycle. `POST .../status/reboot` is that cycle: an ACPI shutdown, then a
start, in one task whose end this waits for. A reboot from inside the guest would not apply them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

TASK_POLL_SECONDS = 1.0


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


def reboot(api, vm: VmRef, *, timeout: float, sleep: Callable[[float], None] = time.sleep,
           clock: Callable[[], float] = time.monotonic) -> None:
    """Shut the VM down (ACPI, up to `timeout` seconds) and start it again, applying pending changes."""
    upid = _qemu(api, vm).status.reboot.post(timeout=int(timeout))
    wait_task(api, vm.host, upid, timeout=timeout + 60, sleep=sleep, clock=clock)
