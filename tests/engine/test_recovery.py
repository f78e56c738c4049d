"""Disaster recovery with the real CLI: every control plane lost, new VMs, `pulumi up` with
`cluster.recoverFrom`.

A new stack of one control plane and one worker (as after the loss: new VMs, the stack's state gone or
refreshed away) on the real Proxmox provider and the Talos stand-ins. First with a snapshot of another
cluster (tests/data/etcd/other-cluster.snapshot, made by the real etcd): refused in the preview, before
any PVE request or node call. Then with this cluster's snapshot (dr-cp-1.snapshot, a real etcd member
`dr-cp-1` at the stack's first control plane): the first control plane receives exactly that file
through EtcdRecover, then one Bootstrap with `recover_etcd`, and etcd is restored from it; a next up with
the same stack recovers nothing again.
"""

from __future__ import annotations

import pytest

from tests.engine.cluster import engine_cluster, engine_stack
from tests.engine.test_addons import deploy
from tests.paths import REPO

pytestmark = pytest.mark.engine

NODES = [("dr-cp-1", "controlplane", "127.0.0.122"), ("dr-worker-1", "worker", "127.0.0.123")]
TALOS = "v1.13.7"
SNAPSHOTS = REPO / "tests" / "data" / "etcd"
OURS, OTHER = SNAPSHOTS / "dr-cp-1.snapshot", SNAPSHOTS / "other-cluster.snapshot"


@pytest.fixture(scope="module")
def recovery(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("recovery")
    with engine_cluster(tmp, NODES, TALOS) as (cluster, project):
        def config(snapshot):
            stack = engine_stack(cluster, NODES, TALOS, tmp / "secrets.yaml")
            stack["cluster"]["recoverFrom"] = str(snapshot)
            return stack
        refused = cluster.deploy(project, config(OTHER), tmp / "render-refused", fails=True)
        recovered = deploy(cluster, project, config(OURS), tmp / "render-recovered")
        again = deploy(cluster, project, config(OURS), tmp / "render-again")
        yield {"refused": refused, "recovered": recovered, "again": again, "cluster": cluster}


def test_a_snapshot_of_another_cluster_is_refused_before_any_pve_request_or_node_call(recovery):
    refused = recovery["refused"]
    assert refused.stopped_in_preview
    assert refused.pve_requests == 0
    assert all(calls == [] for calls in refused.calls.values()), refused.calls
    printed = refused.preview.stdout + refused.preview.stderr
    assert (f"talos-proxmox:cluster.recoverFrom: '{OTHER}' is a snapshot of another cluster: its etcd members are "
            "prod-cp-1 (https://10.20.0.11:2380), and none is a control plane of this stack (dr-cp-1 (127.0.0.122))"
            in printed), printed[-2000:]


def test_the_first_control_plane_gets_exactly_that_snapshot_then_one_recovering_bootstrap(recovery):
    cluster, recovered = recovery["cluster"], recovery["recovered"]
    first = recovered.calls["dr-cp-1"]
    recovery_calls = [(c.rpc, c.request) for c in first if c.rpc in ("EtcdRecover", "Bootstrap")]
    assert [rpc for rpc, _ in recovery_calls] == ["EtcdRecover", "Bootstrap"]
    assert recovery_calls[0][1].bytes == OURS.read_bytes()
    bootstrap = recovery_calls[1][1]
    assert (bootstrap.recover_etcd, bootstrap.recover_skip_hash_check) == (True, False)
    assert cluster.nodes["dr-cp-1"].etcd_restored_from == OURS.read_bytes()
    assert not [c for c in recovered.calls["dr-worker-1"] if c.rpc in ("EtcdRecover", "Bootstrap")]
    printed = "".join(recovered.up.diagnostics("info#err")) + recovered.up.stdout
    assert f"recovering etcd on 127.0.0.122 from {OURS} ({OURS.stat().st_size} bytes)" in printed


def test_a_next_up_with_the_same_snapshot_recovers_nothing_again(recovery):
    again, recovered = recovery["again"], recovery["recovered"]
    assert not [c for c in again.new_calls(recovered, "dr-cp-1") if c.rpc in ("EtcdRecover", "Bootstrap")]
    assert "bootstrap" not in again.up.changes()
