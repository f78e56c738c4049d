"""vms: the start of a VM through the PVE API (the PVE stand-in: fakepve put right)."""

from __future__ import annotations

import time

import pytest
from proxmoxer import ProxmoxAPI

from talos_proxmox.proxmox_api import vms
from tests.stand_ins.proxmox_ve import HOST, PVE_HOST, TOKEN_ID, TOKEN_SECRET, serve_proxmox

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


def test_a_start_pve_answers_later_than_the_client_waits_says_so_and_pve_carries_it_out(pve):
    pve.hold("POST", f"/nodes/{PVE_HOST}/qemu/{VM_ID}/status/start", 1.5)
    api = ProxmoxAPI(HOST, port=pve.port, user="root@pam", token_name=TOKEN_ID.split("!")[1],
                     token_value=TOKEN_SECRET, verify_ssl=pve.cafile, service="PVE", timeout=0.5)
    with pytest.raises(vms.ProxmoxTaskError) as late:
        vms.start(api, VM, timeout=5)
    assert str(late.value) == (f"PVE did not answer the start of VM {VM_ID} on {PVE_HOST} in time (it may still "
                               "carry it out, and the next `pulumi up` takes it from there)")
    deadline = time.monotonic() + 5
    while pve.vm(VM_ID).status != "running":
        assert time.monotonic() < deadline, "PVE never carried the held start out"
        time.sleep(0.05)
    vms.start(api, VM, timeout=5)  # the next up's start: already running, so done
