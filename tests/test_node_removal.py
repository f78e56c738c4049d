"""Removing a node: etcd leave (or remove via another control plane), then reset, against stand-in nodes."""

import grpc
import pytest

from talos_proxmox.day_two.node_removal import RemovalError, remove_node
from talos_proxmox.talos_api.client import TalosClient
from tests.day_two import FAST, bundle, credentials, stand_in_cluster, stop_all  # noqa: F401 - fixtures

LAYOUT = [("cp-1", "10.5.0.1", "controlplane"), ("cp-2", "10.5.0.2", "controlplane"),
          ("cp-3", "10.5.0.3", "controlplane"), ("worker-1", "10.5.0.11", "worker")]
MEMBER_IDS = {"cp-1": 0xA1, "cp-2": 0xA2, "cp-3": 0xA3}


@pytest.fixture
def cluster(bundle):
    nodes, fakes = stand_in_cluster(bundle, LAYOUT, downtime=0.2, member_ids=MEMBER_IDS)
    yield nodes, fakes
    stop_all(fakes)


def _client_for(credentials):
    return lambda node: TalosClient([node.endpoint], credentials=credentials, node=node.address, timeout=2)


def _ordered_calls(fakes, rpcs):
    calls = sorted((call.at, name, call.rpc) for name, fake in fakes.items() for call in fake.calls
                   if call.rpc in rpcs)
    return [(name, rpc) for _, name, rpc in calls]


def _remove(nodes, credentials, name, **kwargs):
    peers = [n for n in nodes.values() if n.role == "controlplane" and n.name != name]
    return remove_node(nodes[name], _client_for(credentials), peers, timeout=5, reach_timeout=0.5,
                       backoff=FAST, **kwargs)


def test_control_plane_leaves_etcd_then_is_reset_gracefully(cluster, credentials):
    nodes, fakes = cluster
    steps = _remove(nodes, credentials, "cp-2")
    assert steps == ["etcd-leave", "reset", "down"]
    assert _ordered_calls(fakes, {"EtcdLeaveCluster", "EtcdRemoveMemberByID", "Reset"}) == [
        ("cp-2", "EtcdLeaveCluster"), ("cp-2", "Reset")]
    (reset,) = fakes["cp-2"].calls_for("Reset")
    assert reset.request.graceful is True and reset.request.reboot is False
    assert reset.metadata["node"] == ["10.5.0.2"]
    assert [m.hostname for m in fakes["cp-2"].etcd_members] == ["cp-1", "cp-3"]


def test_unreachable_control_plane_is_removed_through_another_and_not_reset(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-3"].go_down()
    steps = _remove(nodes, credentials, "cp-3")
    assert steps == ["etcd-remove-member via cp-1", "reset-skipped-unreachable"]
    (removal,) = fakes["cp-1"].calls_for("EtcdRemoveMemberByID")
    assert removal.request.member_id == MEMBER_IDS["cp-3"]
    assert [m.hostname for m in fakes["cp-1"].etcd_members] == ["cp-1", "cp-2"]
    assert all(not fake.calls_for("Reset") for fake in fakes.values())


def test_control_plane_whose_etcd_cannot_leave_is_removed_elsewhere_then_reset(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-1"].fail_next("EtcdLeaveCluster", grpc.StatusCode.FAILED_PRECONDITION, "etcd is not running")
    steps = _remove(nodes, credentials, "cp-1")
    assert steps == ["etcd-remove-member via cp-2", "reset", "down"]
    assert _ordered_calls(fakes, {"EtcdLeaveCluster", "EtcdRemoveMemberByID", "Reset"}) == [
        ("cp-1", "EtcdLeaveCluster"), ("cp-2", "EtcdRemoveMemberByID"), ("cp-1", "Reset")]
    assert fakes["cp-2"].calls_for("EtcdRemoveMemberByID")[0].request.member_id == MEMBER_IDS["cp-1"]


def test_worker_is_only_reset(cluster, credentials):
    nodes, fakes = cluster
    assert _remove(nodes, credentials, "worker-1") == ["reset", "down"]
    assert _ordered_calls(fakes, {"EtcdLeaveCluster", "EtcdRemoveMemberByID", "EtcdMemberList", "Reset"}) == [
        ("worker-1", "Reset")]


def test_last_etcd_member_is_kept_and_reset_without_leaving(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-1"].etcd_members = [m for m in fakes["cp-1"].etcd_members if m.hostname == "cp-1"]
    assert _remove(nodes, credentials, "cp-1") == ["etcd-last-member-kept", "reset", "down"]
    assert not fakes["cp-1"].calls_for("EtcdLeaveCluster")
    assert fakes["cp-1"].calls_for("Reset")[0].request.graceful is False


def test_no_way_to_remove_the_member_refuses_and_names_the_node(cluster, credentials):
    nodes, fakes = cluster
    for name in ("cp-1", "cp-2", "cp-3"):
        fakes[name].go_down()
    with pytest.raises(RemovalError, match=r"node cp-2 \(10.5.0.2\).*talosctl etcd remove-member"):
        _remove(nodes, credentials, "cp-2")


def test_reset_can_be_turned_off(cluster, credentials):
    nodes, fakes = cluster
    assert _remove(nodes, credentials, "worker-1", reset=False) == ["reset-disabled"]
    assert not fakes["worker-1"].calls_for("Reset")


def _remove_two_at_once(nodes, fakes, credentials, cluster_key):
    """cp-2 and cp-3 removed from two threads at once, as the engine deletes independent resources;
    each EtcdLeaveCluster takes 0.4 s. Returns the (start, end) of each leave, in start order."""
    import threading

    for name in ("cp-2", "cp-3"):
        fakes[name].delays["EtcdLeaveCluster"] = 0.4
    threads = [threading.Thread(target=_remove, args=(nodes, credentials, name), kwargs={"cluster_key": cluster_key})
               for name in ("cp-2", "cp-3")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    leaves = sorted(call.at for name in ("cp-2", "cp-3") for call in fakes[name].calls_for("EtcdLeaveCluster"))
    assert len(leaves) == 2
    return [(at, at + 0.4) for at in leaves]


def test_two_control_planes_removed_at_once_never_change_etcd_membership_together(cluster, credentials):
    nodes, fakes = cluster
    first, second = _remove_two_at_once(nodes, fakes, credentials, cluster_key="test-cluster-serial")
    assert second[0] >= first[1]  # the second leave started only after the first had finished


def test_without_the_lock_the_two_leaves_overlap(cluster, credentials):
    """The check above can fail: unserialised, both leaves are in flight together."""
    nodes, fakes = cluster
    first, second = _remove_two_at_once(nodes, fakes, credentials, cluster_key=None)
    assert second[0] < first[1]
