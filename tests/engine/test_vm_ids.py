"""A node without `vmId` through the real CLI and the real Proxmox provider: the provider asks PVE for the
next free id (`GET /cluster/nextid`), the VM is made under it, and the program takes that id from the VM
for everything that follows (the install wait, the lifecycle), with nothing to change on the next up.

Stand-ins as in tests/engine/test_first_deploy_and_day_two.py: one control plane with a vmId, one worker without, at
127.0.0.52-53:50000.
"""

from __future__ import annotations

import pytest

from tests.engine.cluster import engine_cluster, engine_stack

pytestmark = pytest.mark.engine

NODES = [("e2e-cp-1", "controlplane", "127.0.0.52"), ("e2e-worker-1", "worker", "127.0.0.53")]
TALOS = "v1.13.7"


@pytest.fixture(scope="module")
def ups(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-vm-ids")
    with engine_cluster(tmp, NODES, TALOS) as (cluster, project):
        config = engine_stack(cluster, NODES, TALOS, tmp / "secrets.yaml")
        del config["nodes"][1]["vmId"]
        first = cluster.deploy(project, config, tmp / "render-first")
        again = cluster.deploy(project, config, tmp / "render-again")
        yield {"first": first, "again": again, "pve": cluster.pve}


def test_the_provider_takes_the_next_free_id_and_makes_the_vm_under_it(ups):
    pve, first = ups["pve"], ups["first"]
    requests = [(method, path) for method, path, _ in pve.requests[:first.pve_requests]]
    worker = [vm for vm in pve.vms if vm.name == "e2e-worker-1"]
    assert len(worker) == 1 and worker[0].vmid != 9152
    assert ("GET", "/api2/json/cluster/nextid") in requests
    assert requests.index(("GET", "/api2/json/cluster/nextid")) < max(
        i for i, request in enumerate(requests) if request == ("POST", "/api2/json/nodes/pve/qemu"))
    assert first.resource("e2e-worker-1")["outputs"]["vmId"] == worker[0].vmid
    assert first.resource("lifecycle-e2e-worker-1")["inputs"]["vm_id"] == worker[0].vmid
    assert first.modes["e2e-worker-1"] == "configured"


def test_the_next_up_changes_nothing(ups):
    again = ups["again"]
    assert again.preview.changes() == {}
    assert set(again.up.steps().values()) == {"same"}
