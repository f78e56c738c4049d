"""vms: the start of a VM through the PVE API (the PVE stand-in: fakepve put right)."""

from __future__ import annotations

import pytest

from talos_proxmox.proxmox_api import vms
from tests.stand_ins.proxmox_ve import PVE_HOST, serve_proxmox

VM_ID = 9101
VM = vms.VmRef(PVE_HOST, VM_ID)


@pytest.fixture
def pve():
    with serve_proxmox() as pve:
        pve.add_vm(VM_ID, "cp-1", node=PVE_HOST, status="stopped", config={"cores": 2, "memory": "4096"})
        yield pve


def test_a_start_applies_the_pending_config(pve):
    pve.vm(VM_ID).pending = {"memory": "8192"}
    vms.start(pve.client(), VM, timeout=5)
    assert pve.vm(VM_ID).status == "running" and pve.vm(VM_ID).config["memory"] == "8192"


def test_a_vm_started_meanwhile_by_a_late_start_counts_as_started(pve):
    """PVE did an earlier start after its caller had given up: this start's task fails "already running"."""
    pve.client().nodes(PVE_HOST).qemu(VM_ID).status.start.post()
    vms.start(pve.client(), VM, timeout=5)
    tasks = [path for method, path, _ in pve.requests if method == "POST" and path.endswith("/status/start")]
    assert len(tasks) == 2 and pve.vm(VM_ID).status == "running"


def test_a_failed_start_of_a_vm_that_stays_stopped_is_reported(pve):
    pve.vm(VM_ID).start_error = "QEMU exited with code 1"
    with pytest.raises(vms.ProxmoxTaskError, match="QEMU exited with code 1"):
        vms.start(pve.client(), VM, timeout=5)
    assert pve.vm(VM_ID).status == "stopped"
