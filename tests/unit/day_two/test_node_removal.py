"""Removing a node: etcd leave (or remove via another control plane), then reset, against stand-in nodes."""

import threading
import time

import grpc
import pytest

from talos_proxmox.day_two.node_removal import RemovalError, answering_first, leaves_a_cluster, remove_node
from talos_proxmox.day_two.rolling import RollNode
from talos_proxmox.talos_api import errors
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.generated.machine import machine_pb2
from talos_proxmox.talos_api.retry import GaveUp
from tests.support.day_two import FAST, FakeClock, bundle, credentials, stand_in_cluster, stop_all  # noqa: F401 - fixtures

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
    return remove_node(nodes[name], _client_for(credentials), peers,
                       **{"timeout": 5, "reach_timeout": 0.5, "backoff": FAST, **kwargs})


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


def test_only_the_last_etcd_member_leaves_no_cluster_behind(cluster, credentials):
    nodes, fakes = cluster
    assert leaves_a_cluster(_remove(nodes, credentials, "cp-2"))  # left etcd: the others remain
    assert leaves_a_cluster(_remove(nodes, credentials, "worker-1"))
    fakes["cp-1"].etcd_members = [m for m in fakes["cp-1"].etcd_members if m.hostname == "cp-1"]
    assert not leaves_a_cluster(_remove(nodes, credentials, "cp-1"))


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


# --- what a removal does in each case, pinned (tests/data/equivalent_mutants.txt lists what is not) -----


def test_a_powered_off_worker_is_not_reset_and_the_removal_goes_on(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].go_down()
    events = []
    steps = _remove(nodes, credentials, "worker-1", on_event=lambda what, name: events.append((what, name)))
    assert steps == ["reset-skipped-unreachable"]
    assert events == [("reset-skipped-unreachable", "worker-1")]


def test_a_worker_is_reset_gracefully_and_each_step_is_reported_with_its_node(cluster, credentials):
    nodes, fakes = cluster
    events = []
    # reset defaults to on
    steps = remove_node(nodes["worker-1"], _client_for(credentials), timeout=5, reach_timeout=0.5, backoff=FAST,
                        on_event=lambda what, name: events.append((what, name)))
    assert steps == ["reset", "down"] and events == [("reset", "worker-1"), ("down", "worker-1")]
    (reset,) = fakes["worker-1"].calls_for("Reset")
    assert (reset.request.graceful, reset.request.reboot) == (True, False)  # cordon and drain, then power off


def test_a_node_that_keeps_answering_after_its_reset_is_reported(cluster, credentials):
    nodes, fakes = cluster
    # accepts the reset and does nothing
    fakes["worker-1"].behaviours["Reset"] = lambda _node, _request, _context: machine_pb2.ResetResponse()
    # (room for each Version call on a loaded machine: one that times out would count as down)
    assert _remove(nodes, credentials, "worker-1", timeout=2.0) == ["reset", "still-answering-after-reset"]


def test_a_control_plane_that_is_not_an_etcd_member_only_is_reset(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-3"].etcd_members = [m for m in fakes["cp-3"].etcd_members if m.hostname != "cp-3"]
    assert _remove(nodes, credentials, "cp-3") == ["etcd-not-a-member", "reset", "down"]
    assert not any(fake.calls_for("EtcdLeaveCluster") or fake.calls_for("EtcdRemoveMemberByID")
                   for fake in fakes.values())
    assert fakes["cp-3"].calls_for("Reset")[0].request.graceful is True


def test_a_control_plane_whose_etcd_does_not_answer_is_removed_elsewhere_and_reset_gracefully(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-2"].fail_next("EtcdMemberList", grpc.StatusCode.INTERNAL, "etcdserver: no leader", times=50)
    assert _remove(nodes, credentials, "cp-2") == ["etcd-remove-member via cp-1", "reset", "down"]
    assert fakes["cp-1"].calls_for("EtcdRemoveMemberByID")[0].request.member_id == MEMBER_IDS["cp-2"]
    assert fakes["cp-2"].calls_for("Reset")[0].request.graceful is True


def test_the_node_itself_among_the_peers_is_skipped_not_the_end_of_the_list(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-3"].go_down()
    peers = [nodes["cp-3"], nodes["cp-1"]]
    steps = remove_node(nodes["cp-3"], _client_for(credentials), peers, timeout=5, reach_timeout=0.5, backoff=FAST)
    assert steps == ["etcd-remove-member via cp-1", "reset-skipped-unreachable"]


def test_a_removal_through_a_peer_retries_what_is_transient(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-3"].go_down()
    fakes["cp-1"].fail_next("EtcdRemoveMemberByID", grpc.StatusCode.UNAVAILABLE, "etcd leader changed")
    assert _remove(nodes, credentials, "cp-3")[0] == "etcd-remove-member via cp-1"
    assert len(fakes["cp-1"].calls_for("EtcdRemoveMemberByID")) == 2


def test_a_control_plane_back_in_maintenance_mode_is_removed_elsewhere_and_not_reset(cluster, credentials):
    """Reinstalled under us, it answers with its maintenance certificate: as unreachable as a rebooting
    node, so its member goes through a peer and no reset is tried."""
    nodes, fakes = cluster
    fakes["cp-3"].go_down()
    fakes["cp-3"].come_up(mode="maintenance")
    assert _remove(nodes, credentials, "cp-3") == ["etcd-remove-member via cp-1", "reset-skipped-unreachable"]


def _refusal_when_cp1_cannot_remove(cluster, credentials, code, details):
    """The message removing cp-2 fails with when cp-2 and cp-3 are down and cp-1's removal keeps failing."""
    nodes, fakes = cluster
    for name in ("cp-2", "cp-3"):
        fakes[name].go_down()
    fakes["cp-1"].fail_next("EtcdRemoveMemberByID", code, details, times=100)
    with pytest.raises(RemovalError) as refused:
        _remove(nodes, credentials, "cp-2")
    return str(refused.value)


def test_the_refusal_names_what_each_peer_answered(cluster, credentials):
    message = _refusal_when_cp1_cannot_remove(cluster, credentials, grpc.StatusCode.PERMISSION_DENIED, "not allowed")
    assert message.startswith("node cp-2 (10.5.0.2): its etcd member could not be removed; the node cannot leave by "
                              "itself and no other control plane removed it (cp-1: ")
    assert "not allowed" in message and "; cp-3: etcd members via cp-3: gave up after 0.5s" in message
    assert message.endswith("). Remove it by hand (talosctl etcd remove-member) before destroying the VM; if the "
                            "whole cluster is gone, drop this node's lifecycle resource from the state (pulumi "
                            "state delete) instead.")


def test_a_peer_whose_removal_keeps_failing_is_named_with_the_member_in_the_refusal(cluster, credentials):
    message = _refusal_when_cp1_cannot_remove(cluster, credentials, grpc.StatusCode.UNAVAILABLE, "etcd leader changed")
    assert "removed it (cp-1: remove etcd member a2 via cp-1: gave up after 0.5s" in message


def test_the_refusal_without_any_peer_says_so(cluster, credentials):
    nodes, fakes = cluster
    fakes["cp-2"].go_down()
    with pytest.raises(RemovalError, match=r"removed it \(no other control plane known\)\. Remove it by hand"):
        remove_node(nodes["cp-2"], _client_for(credentials), [], timeout=5, reach_timeout=0.5, backoff=FAST)


def test_a_reset_that_never_gets_through_names_the_node(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].fail_next("Reset", grpc.StatusCode.UNAVAILABLE, "rebooting", times=100)
    with pytest.raises(GaveUp, match=r"^reset worker-1: gave up after 0.5s"):
        _remove(nodes, credentials, "worker-1")


def test_a_hung_node_is_given_up_on_after_the_reach_timeout(cluster, credentials):
    """Each call is bounded by what is left of the reach timeout, not the client's own 10 s."""
    nodes, fakes = cluster
    for rpc in ("Version", "Reset"):
        fakes["worker-1"].delays[rpc] = 12.0
    client_for = lambda node: TalosClient([node.endpoint], credentials=credentials, node=node.address, timeout=10)
    started = time.monotonic()
    assert remove_node(nodes["worker-1"], client_for, timeout=5, reach_timeout=0.5,
                       backoff=FAST) == ["reset-skipped-unreachable"]
    assert time.monotonic() - started < 5


def test_waits_go_through_the_given_clock_and_sleep(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].go_down()
    clock = FakeClock()
    steps = _remove(nodes, credentials, "worker-1", reach_timeout=0.5, sleep=clock.sleep, clock=clock)
    assert steps == ["reset-skipped-unreachable"] and clock.slept_as(FAST, within=0.5)


def test_a_peer_that_is_already_gone_is_not_waited_on_first(cluster, credentials):
    """The state's peers may still list a control plane removed since: the ones that answer go first."""
    nodes, fakes = cluster
    fakes["cp-3"].go_down()  # gone, but listed first
    fakes["cp-2"].go_down()  # the node being removed
    started = time.monotonic()
    steps = remove_node(nodes["cp-2"], _client_for(credentials), [nodes["cp-3"], nodes["cp-1"]], timeout=5,
                        reach_timeout=5, backoff=FAST)
    assert steps == ["etcd-remove-member via cp-1", "reset-skipped-unreachable"]
    # 5 s of trying cp-2 itself, and not 5 more of trying cp-3 for its member list first
    assert time.monotonic() - started < 8


# (the node removed, which node's call hangs, the call, a call made to fail first, the steps): each call is
# given the time left of the reach timeout (0.5 s), not the client's own 2 s, so one that answers only
# after 1.2 s is given up on, and the removal takes its other way.
HUNG_CALLS = [
    ("cp-2", "cp-2", "EtcdMemberList", None, ["etcd-remove-member via cp-1", "reset-skipped-unreachable"]),
    ("cp-2", "cp-2", "EtcdLeaveCluster", None, ["etcd-remove-member via cp-1", "reset", "down"]),
    ("cp-2", "cp-1", "EtcdRemoveMemberByID", "EtcdLeaveCluster", ["etcd-remove-member via cp-3", "reset", "down"]),
    ("cp-2", "cp-1", "Version", "EtcdLeaveCluster", ["etcd-remove-member via cp-3", "reset", "down"]),
    ("cp-2", "cp-1", "EtcdMemberList", "EtcdLeaveCluster", ["etcd-remove-member via cp-3", "reset", "down"]),
]


@pytest.mark.parametrize("removed, hung, rpc, failing, steps", HUNG_CALLS, ids=[f"{c[1]}-{c[2]}" for c in HUNG_CALLS])
def test_each_call_is_bounded_by_the_time_left_not_the_clients_own(cluster, credentials, removed, hung, rpc,
                                                                    failing, steps):
    nodes, fakes = cluster
    fakes[hung].delays[rpc] = 1.2
    if failing:
        fakes[removed].fail_next(failing, grpc.StatusCode.FAILED_PRECONDITION, "etcd is not running")
    assert _remove(nodes, credentials, removed, reach_timeout=0.5) == steps


def test_a_reset_that_answers_only_after_the_reach_timeout_is_given_up_on(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].delays["Reset"] = 1.2
    with pytest.raises(GaveUp, match=r"^reset worker-1: gave up after 0.5s"):
        _remove(nodes, credentials, "worker-1", reach_timeout=0.5)


def test_the_wait_for_a_reset_node_to_go_down_uses_the_given_clock_and_sleep(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].behaviours["Reset"] = lambda _node, _request, _context: machine_pb2.ResetResponse()
    clock = FakeClock()
    steps = _remove(nodes, credentials, "worker-1", timeout=1.0, sleep=clock.sleep, clock=clock)
    assert steps == ["reset", "still-answering-after-reset"]
    assert clock.slept_as(FAST, within=1.0)


def test_every_peer_is_probed_at_once(credentials):
    """answering_first asks all peers together: with more peers than a default thread pool's workers, a
    probe that waits for every other one to be under way still answers."""
    peers = [RollNode(f"cp-{i}", f"10.5.1.{i}", "controlplane") for i in range(1, 41)]
    together = threading.Barrier(len(peers), timeout=5)

    class Probe:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def version(self, timeout):
            try:
                together.wait()
            except threading.BrokenBarrierError:
                raise errors.TalosUnavailable("stand-in", "Version", "not probed with the others") from None

    assert answering_first(peers, lambda _peer: Probe(), probe_timeout=5) == peers
    assert not together.broken
