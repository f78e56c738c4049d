"""Taking a cluster down on purpose, through the real Pulumi CLI (the engine tier, tests/engine/).

With `cluster.deletionProtection` on (the default) `pulumi destroy` is refused before anything is touched
(tests/engine/test_first_deploy_and_day_two.py). Turned off, a `pulumi up` only lifts the protection (no node, VM or
Talos call), and `pulumi destroy` then takes the cluster down the way removals go: one node at a time,
the worker first, each control plane snapshotted and out of etcd before its reset, each node reset
before its VM is stopped and destroyed, the last control plane kept as etcd's last member and not asked
to delete Node objects from a cluster that is gone; the secrets go last and the state is empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.engine.pulumi_cli import CliRun
from tests.engine.cluster import EngineCluster, EngineUp, engine_cluster, engine_stack

pytestmark = pytest.mark.engine

CP1, CP2, CP3, WORKER = "down-cp-1", "down-cp-2", "down-cp-3", "down-worker-1"
NODES = [(CP1, "controlplane", "127.0.0.52"), (CP2, "controlplane", "127.0.0.53"),
         (CP3, "controlplane", "127.0.0.54"), (WORKER, "worker", "127.0.0.55")]
VM_IDS = {name: 9100 + int(ip.rsplit(".", 1)[1]) for name, _, ip in NODES}
TALOS = "v1.13.7"


@dataclass
class Teardown:
    first: EngineUp
    unprotected: EngineUp
    destroy: CliRun
    state: dict
    cluster: EngineCluster


@pytest.fixture(scope="module")
def teardown(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-teardown")
    with engine_cluster(tmp, NODES, TALOS) as (cluster, project):
        config = engine_stack(cluster, NODES, TALOS, tmp / "secrets.yaml")
        first = cluster.deploy(project, config, tmp / "render-first")
        config["cluster"]["deletionProtection"] = False
        unprotected = cluster.deploy(project, config, tmp / "render-unprotected")
        destroy = project.destroy()
        yield Teardown(first, unprotected, destroy, project.export(), cluster)


def test_lifting_the_protection_changes_no_resource_and_calls_no_one(teardown):
    first, unprotected = teardown.first, teardown.unprotected
    assert unprotected.preview.changes() == unprotected.up.changes() == {}
    assert unprotected.calls == first.calls
    assert unprotected.pve_requests == first.pve_requests


def test_destroy_deletes_everything_the_secrets_last(teardown):
    destroy = teardown.destroy
    assert destroy.returncode == 0
    assert set(destroy.steps().values()) == {"delete"}
    assert set(destroy.steps()) == set(teardown.first.up.steps())
    deleted = [name for op, name in destroy.started() if op == "delete"]
    assert deleted.index("secrets") > max(deleted.index(name) for name in (
        "talosconfig", *(f"machineconfig-{node}" for node, _, _ in NODES)))
    assert [r for r in teardown.state["deployment"].get("resources") or [] if r.get("custom")] == []
    assert not teardown.cluster.pve.vms


def test_nodes_go_one_at_a_time_worker_first_each_reset_before_its_vm_is_destroyed(teardown):
    cluster, first = teardown.cluster, teardown.first
    resets = {name: [c for c in cluster.nodes[name].calls[len(first.calls[name]):] if c.rpc == "Reset"]
              for name, _, _ in NODES}
    assert all(len(found) == 1 for found in resets.values()), resets
    order = sorted(resets, key=lambda name: resets[name][0].at)
    assert order == [WORKER, CP3, CP2, CP1]  # roll order, reversed
    destroyed = {e.vm_id: e.at for e in cluster.pve.vm_events if e.what == "destroyed"}
    for name, _, _ in NODES:
        assert resets[name][0].at < destroyed[VM_IDS[name]], name
    for before, after in zip(order, order[1:]):  # the next node only once this one is gone
        assert resets[before][0].at < resets[after][0].at


def test_control_planes_leave_etcd_before_their_reset_and_the_last_is_kept(teardown):
    cluster, first = teardown.cluster, teardown.first
    for name in (CP3, CP2):
        calls = [c.rpc for c in cluster.nodes[name].calls[len(first.calls[name]):]]
        assert calls.index("EtcdSnapshot") < calls.index("EtcdLeaveCluster") < calls.index("Reset"), name
    last = [c for c in cluster.nodes[CP1].calls[len(first.calls[CP1]):]]
    assert "EtcdLeaveCluster" not in [c.rpc for c in last]
    [reset] = [c for c in last if c.rpc == "Reset"]
    assert reset.request.graceful is False  # a graceful reset would try to leave etcd, and fail
    lines = "".join(teardown.destroy.diagnostics("info#err"))
    assert f"remove {CP1} (1 of 4): etcd-last-member-kept" in lines
    assert f"remove {CP1} (1 of 4): kubernetes-node-not-deleted (the last control plane: no cluster is left)" in lines
    assert f"remove {CP2} (2 of 4): kubernetes-node-deleted via 127.0.0.52" in lines  # through the last one
