"""Rolling Talos upgrades against in-process stand-in nodes over mTLS: order, waits, a failing node stops the roll."""

import re
import time

import grpc
import pytest

from talos_proxmox.day_two.cluster_health import KubeApi, read_kubeconfig
from talos_proxmox.day_two.rolling import (RollError, RollNode, client_for, etcd_quorum_problem, health_problems, roll,
                                           roll_order, upgrade_node, uses_lifecycle_api, wait_healthy)
from talos_proxmox.talos_api import errors as operations_errors
from talos_proxmox.talos_config import client_config
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.retry import Backoff
from talos_proxmox.talos_api.generated.machine import machine_pb2
from tests.support import seed_cluster as seed
from tests.support.day_two import (FAST, SECONDS, FakeClock, bundle, credentials, stand_in_cluster, stop_all,  # noqa: F401 - fixtures
                           upgrade_timeline)
from tests.stand_ins.kubernetes_api import StandInApi, coredns, node as k8s_node, workload_pod
from tests.stand_ins.talos_api import FakeTalosNode

OLD, NEW = "v1.12.6", "v1.13.7"
IMAGE = f"factory.talos.dev/installer/{seed.SCHEMATIC}:{NEW}"


@pytest.fixture
def cluster(bundle):
    """Stack order on purpose not roll order: a worker first, then three control planes."""
    layout = [("worker-1", "10.5.0.11", "worker"), ("cp-1", "10.5.0.1", "controlplane"),
              ("cp-2", "10.5.0.2", "controlplane"), ("cp-3", "10.5.0.3", "controlplane")]
    nodes, fakes = stand_in_cluster(bundle, layout, version_tag=OLD)
    yield list(nodes.values()), fakes
    stop_all(fakes)


def _client(credentials, node):
    return TalosClient([node.endpoint], credentials=credentials, node=node.address, timeout=5)


def _upgrade_step(credentials, events, timeout=15.0):
    def step(node):
        with _client(credentials, node) as client:
            upgrade_node(client, node, IMAGE, talos_version=NEW, timeout=timeout, backoff=FAST,
                         on_event=lambda what, name: events.append((what, name)))
    return step


def _watch_previous(fakes, order, snapshots):
    """Each node's Upgrade records, at the moment it arrives, the state of the node before it."""
    for previous, current in zip(order, order[1:]):
        fake = fakes[current]

        def upgrade(node, request, context, previous=previous):
            prev = fakes[previous]
            snapshots.append((node.hostname, previous, prev.version_tag, prev._listener is not None))
            return FakeTalosNode._rpc_Upgrade(node, request, context)
        fake.behaviours["Upgrade"] = upgrade


def test_roll_order_is_control_planes_first_in_stack_order():
    nodes = [RollNode("w1", "10.0.0.4", "worker"), RollNode("cp1", "10.0.0.1", "controlplane"),
             RollNode("w2", "10.0.0.5", "worker"), RollNode("cp2", "10.0.0.2", "controlplane")]
    assert [n.name for n in roll_order(nodes)] == ["cp1", "cp2", "w1", "w2"]
    with pytest.raises(ValueError, match="w3"):
        roll_order([RollNode("w3", "10.0.0.6", "master")])


def test_four_node_roll_goes_one_at_a_time_control_planes_first_each_back_healthy(cluster, credentials):
    nodes, fakes = cluster
    events, snapshots = [], []
    _watch_previous(fakes, ["cp-1", "cp-2", "cp-3", "worker-1"], snapshots)

    done = roll(nodes, _upgrade_step(credentials, events), on_event=lambda what, name: events.append((what, name)))

    assert done == ["cp-1", "cp-2", "cp-3", "worker-1"]
    upgrades = sorted((call.at, name) for name, fake in fakes.items() for call in fake.calls_for("Upgrade"))
    assert [name for _, name in upgrades] == ["cp-1", "cp-2", "cp-3", "worker-1"]
    for fake in fakes.values():
        (call,) = fake.calls_for("Upgrade")
        assert call.request.image == IMAGE
        # what talosctl upgrade sends: no preserve (it would skip Talos's etcd checks), stage or force
        assert (call.request.preserve, call.request.stage, call.request.force) == (False, False, False)
        assert call.roles == ("os:admin",)
        assert fake.version_tag == NEW
    # when each later node was asked to upgrade, the one before it was up again, on the new version
    assert snapshots == [("cp-2", "cp-1", NEW, True), ("cp-3", "cp-2", NEW, True), ("worker-1", "cp-3", NEW, True)]
    per_node = ["start", "healthy-before", "upgrade-requested", "rebooted", "healthy", "done"]
    assert events == [(what, name) for name in ("cp-1", "cp-2", "cp-3", "worker-1") for what in per_node]
    # the wait after each control plane's upgrade checked etcd membership before the next started
    for name, nxt in (("cp-1", "cp-2"), ("cp-2", "cp-3"), ("cp-3", "worker-1")):
        upgraded_at = fakes[name].calls_for("Upgrade")[0].at
        next_at = fakes[nxt].calls_for("Upgrade")[0].at
        checks = [c.at for c in fakes[name].calls_for("EtcdMemberList") if upgraded_at < c.at < next_at]
        assert checks, f"no etcd check of {name} between its upgrade and {nxt}'s"


def test_a_node_that_fails_health_stops_the_roll_and_leaves_the_rest_untouched(cluster, credentials):
    nodes, fakes = cluster
    broken = fakes["cp-2"]

    def upgrade_then_etcd_fails(node, request, context):
        node.services = [machine_pb2.ServiceInfo(id=s.id, state="Failed" if s.id == "etcd" else s.state,
                                                 health=s.health) for s in node.services]
        return FakeTalosNode._rpc_Upgrade(node, request, context)
    broken.behaviours["Upgrade"] = upgrade_then_etcd_fails

    with pytest.raises(RollError) as err:
        roll(nodes, _upgrade_step(credentials, [], timeout=6.0))  # room for a loaded machine: the last error must be the etcd one

    message = str(err.value)
    assert "cp-2 (10.5.0.2)" in message and "service etcd is Failed" in message
    assert "finished: cp-1" in message and "not touched: cp-3, worker-1" in message
    assert err.value.node.name == "cp-2" and err.value.untouched == ("cp-3", "worker-1")
    assert fakes["cp-1"].version_tag == NEW
    assert len(broken.calls_for("Upgrade")) == 1
    assert fakes["worker-1"].calls_for("Upgrade") == []
    assert fakes["worker-1"].version_tag == OLD


def test_an_unhealthy_node_is_not_upgraded(cluster, credentials):
    nodes, fakes = cluster
    cp1 = next(n for n in nodes if n.name == "cp-1")
    fakes["cp-1"].etcd_members = [m for m in fakes["cp-1"].etcd_members if m.hostname != "cp-1"]
    with _client(credentials, cp1) as client:
        assert health_problems(client, cp1) == [
            "etcd member on cp-1: no member has a URL on 10.5.0.1",
            "etcd members consistent on cp-2: lists members [101, 102, 103], cp-1 lists [102, 103]",
            "etcd members consistent on cp-3: lists members [101, 102, 103], cp-1 lists [102, 103]"]
        with pytest.raises(RollError, match="cp-1 .*not healthy after"):
            upgrade_node(client, cp1, IMAGE, talos_version=NEW, timeout=5, preflight_timeout=0.5, backoff=FAST)
    assert fakes["cp-1"].calls_for("Upgrade") == []


def test_wait_healthy_waits_through_a_reboot(cluster, credentials):
    nodes, fakes = cluster
    worker = next(n for n in nodes if n.name == "worker-1")
    fakes["worker-1"].go_down()
    fakes["worker-1"].reboot(0.3, after=0.0)
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        time.sleep(seconds)

    with _client(credentials, worker) as client:
        wait_healthy(client, worker, expected_tag=OLD, timeout=10, backoff=FAST, sleep=sleep)
    assert slept  # the first checks found it down and were retried
    assert fakes["worker-1"].calls_for("ServiceList")  # and the check that passed saw its services


def test_a_rerun_leaves_a_node_already_on_the_target_version_alone(cluster, credentials):
    """After a roll stopped part-way, the next up must not upgrade (reboot) the nodes it already did."""
    nodes, fakes = cluster
    fakes["cp-1"].version_tag = NEW
    events = []

    done = roll(nodes, _upgrade_step(credentials, events), on_event=lambda what, name: events.append((what, name)))

    assert done == ["cp-1", "cp-2", "cp-3", "worker-1"]
    assert fakes["cp-1"].calls_for("Upgrade") == []
    assert ("already-upgraded", "cp-1") in events and ("upgrade-requested", "cp-1") not in events
    assert [len(fakes[name].calls_for("Upgrade")) for name in ("cp-2", "cp-3", "worker-1")] == [1, 1, 1]


# --- an upgrade that goes wrong, each way, named by its node --------------------------------------


def _worker(nodes):
    return next(n for n in nodes if n.name == "worker-1")


def _upgrade(credentials, node, **kwargs):
    with _client(credentials, node) as client:
        upgrade_node(client, node, IMAGE, **{"talos_version": NEW, "timeout": 5, "backoff": FAST, **kwargs})


def test_a_node_that_accepts_the_upgrade_but_never_reboots_is_reported(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].behaviours["Upgrade"] = lambda _node, _request, _context: machine_pb2.UpgradeResponse(
        messages=[machine_pb2.Upgrade(ack="Upgrade request received")])
    with pytest.raises(RollError) as failed:  # 3 s: room for the steps before the reboot wait on a loaded machine
        _upgrade(credentials, _worker(nodes), timeout=3)
    assert str(failed.value).startswith("node worker-1 (10.5.0.11): did not reboot into the upgrade within ")
    assert f"still running Talos {OLD}; waiting for it to reboot" in str(failed.value)


def test_an_undelivered_upgrade_request_is_retried_with_the_given_backoff_clock_and_sleep(cluster, credentials):
    nodes, fakes = cluster
    clock, asked_at = FakeClock(), []

    def refused_twice(_node, _request, context):
        asked_at.append(clock.now)
        if len(asked_at) < 3:
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection refused")
        return machine_pb2.UpgradeResponse(messages=[machine_pb2.Upgrade(ack="Upgrade request received")])
    fakes["worker-1"].behaviours["Upgrade"] = refused_twice
    with pytest.raises(RollError, match="did not reboot into the upgrade within"):  # the stand-in never reboots
        _upgrade(credentials, _worker(nodes), timeout=10, backoff=SECONDS, sleep=clock.sleep, clock=clock)
    assert [b - a for a, b in zip(asked_at, asked_at[1:])] == [1.0, 1.0]


def test_an_upgrade_request_never_delivered_is_given_up_on_by_the_given_clock(cluster, credentials):
    nodes, fakes = cluster
    clock, asked_at = FakeClock(), []

    def refused(_node, _request, context):
        asked_at.append(clock.now)
        context.abort(grpc.StatusCode.UNAVAILABLE, "connection refused")
    fakes["worker-1"].behaviours["Upgrade"] = refused
    with pytest.raises(RollError, match=r"^node worker-1 \(10\.5\.0\.11\): "):
        _upgrade(credentials, _worker(nodes), timeout=5, backoff=SECONDS, sleep=clock.sleep, clock=clock)
    assert asked_at == [0.0, 1.0, 2.0, 3.0, 4.0]  # the roll's 5 s on that clock, not in real time


def test_permission_denied_while_waiting_for_the_reboot_stops_at_once_naming_the_node(cluster, credentials):
    nodes, fakes = cluster
    fake = fakes["worker-1"]

    def upgrade_then_deny(node, request, context):
        node.fail_next("Version", grpc.StatusCode.PERMISSION_DENIED, "not authorized", times=100)
        return machine_pb2.UpgradeResponse(messages=[machine_pb2.Upgrade(ack="Upgrade request received")])

    fake.behaviours["Upgrade"] = upgrade_then_deny
    started = time.monotonic()
    with pytest.raises(RollError) as failed:
        _upgrade(credentials, _worker(nodes), timeout=30)
    assert str(failed.value).startswith("node worker-1 (10.5.0.11): failed while waiting for it to reboot into the "
                                        "upgrade: ")
    assert "not authorized" in str(failed.value)
    assert time.monotonic() - started < 10  # not taken for a reboot and waited out


def test_a_refused_upgrade_names_the_node_and_the_image(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].fail_next("Upgrade", grpc.StatusCode.PERMISSION_DENIED, "not authorized")
    with pytest.raises(RollError) as failed:
        _upgrade(credentials, _worker(nodes))
    assert str(failed.value).startswith(f"node worker-1 (10.5.0.11): upgrade to {IMAGE} was refused: ")
    assert len(fakes["worker-1"].calls_for("Upgrade")) == 1  # not retried
    assert fakes["worker-1"].version_tag == OLD


def test_an_upgrade_call_that_hangs_is_bounded_by_the_overall_deadline_and_not_asked_again(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].delays["Upgrade"] = 8.0
    started = time.monotonic()
    with pytest.raises(RollError, match=r"^node worker-1 \(10\.5\.0\.11\): upgrade to .* got no answer before the "
                                        r"roll's deadline \(.*no answer before the deadline.*\); the node may still "
                                        r"reboot into it$"):
        _upgrade(credentials, _worker(nodes), timeout=2.0, preflight_timeout=1.0)
    assert time.monotonic() - started < 6
    assert len(fakes["worker-1"].calls_for("Upgrade")) == 1


def test_an_upgrade_request_whose_answer_is_late_is_not_repeated_and_the_reboot_is_awaited(cluster, credentials,
                                                                                          monkeypatch):
    """The node took the request but answered after the call's deadline (Talos drains before it acks
    on old releases): asking again would upgrade it twice; the wait after it sees the reboot."""
    nodes, fakes = cluster
    monkeypatch.setattr("talos_proxmox.day_two.rolling.CALL_TIMEOUT", 0.5)
    fakes["worker-1"].delays["Upgrade"] = 1.0
    events = []
    _upgrade(credentials, _worker(nodes), timeout=8, on_event=lambda what, name: events.append((what, name)))
    assert len(fakes["worker-1"].calls_for("Upgrade")) == 1 and fakes["worker-1"].version_tag == NEW
    assert events == [(what, "worker-1") for what in
                      ("healthy-before", "upgrade-request-unanswered", "rebooted", "healthy")]


def test_a_transient_error_on_the_upgrade_call_is_retried(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].fail_next("Upgrade", grpc.StatusCode.UNAVAILABLE, "connection reset")
    events = []
    _upgrade(credentials, _worker(nodes), on_event=lambda what, name: events.append((what, name)))
    assert len(fakes["worker-1"].calls_for("Upgrade")) == 2 and fakes["worker-1"].version_tag == NEW
    assert events == [(what, "worker-1") for what in ("healthy-before", "upgrade-requested", "rebooted", "healthy")]


def test_the_etcd_snapshot_hook_runs_after_the_health_check_and_before_the_upgrade(cluster, credentials):
    nodes, fakes = cluster
    seen = []
    _upgrade(credentials, _worker(nodes),
             before_upgrade=lambda: seen.append((len(fakes["worker-1"].calls_for("ServiceList")),
                                                 len(fakes["worker-1"].calls_for("Upgrade")))))
    assert len(seen) == 1 and seen[0][0] >= 1 and seen[0][1] == 0


def test_a_node_healthy_again_on_the_old_version_is_not_taken_as_upgraded(cluster, credentials):
    """The node rebooted but came back on the old Talos (a failed install): the wait after it wants the new tag."""
    nodes, fakes = cluster

    def reboot_without_upgrading(node, request, context):
        node.reboot(0.2)
        return machine_pb2.UpgradeResponse(messages=[machine_pb2.Upgrade(ack="Upgrade request received")])

    fakes["worker-1"].behaviours["Upgrade"] = reboot_without_upgrading
    with pytest.raises(RollError) as failed:
        _upgrade(credentials, _worker(nodes), timeout=2.5)
    assert "not healthy after" in str(failed.value) and f"expected {NEW}" in str(failed.value)


def test_waits_go_through_the_given_clock_and_sleep(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].go_down()
    clock = FakeClock()
    with _client(credentials, _worker(nodes)) as client, pytest.raises(RollError, match="not healthy after 2s"):
        wait_healthy(client, _worker(nodes), timeout=2, backoff=FAST, sleep=clock.sleep, clock=clock)
    assert clock.slept_as(FAST, within=2)


def test_a_step_that_fails_with_any_error_stops_the_roll_with_its_message(cluster):
    nodes, _ = cluster

    def step(node):
        if node.name == "cp-2":
            raise OSError("disk full")

    with pytest.raises(RollError) as failed:
        roll(nodes, step)
    assert str(failed.value) == ("rolling operation stopped at node cp-2 (10.5.0.2): disk full; finished: cp-1; "
                                 "not touched: cp-3, worker-1")


def test_unknown_roles_are_all_named_with_the_roles_there_are():
    with pytest.raises(ValueError) as failed:
        roll_order([RollNode("a", "10.0.0.1", "master"), RollNode("b", "10.0.0.2", "etcd")])
    assert str(failed.value) == "role of node(s) a, b is not one of controlplane, worker"


# --- Talos 1.13 and later: ImageService.Pull, LifecycleService.Upgrade, drain, Reboot, uncordon -------

CURRENT, NEXT = "v1.13.7", "v1.13.8"
NEXT_IMAGE = f"factory.talos.dev/installer/{seed.SCHEMATIC}:{NEXT}"
ROLL = ["cp-1", "cp-2", "cp-3", "worker-1"]


@pytest.fixture
def current_cluster(bundle, credentials):
    """The cluster fixture's nodes on Talos 1.13, each running one workload pod and a Cilium pod, with
    the Kubernetes API stand-in the drain goes through."""
    layout = [("worker-1", "10.5.0.11", "worker"), ("cp-1", "10.5.0.1", "controlplane"),
              ("cp-2", "10.5.0.2", "controlplane"), ("cp-3", "10.5.0.3", "controlplane")]
    nodes, fakes = stand_in_cluster(bundle, layout, version_tag=CURRENT)
    kube = StandInApi([([k8s_node(name, True) for name, _, _ in layout], coredns(2))])
    kube.pods = [pod for name in ROLL for pod in (
        workload_pod(f"web-{name}", name), workload_pod(f"cilium-{name}", name, "kube-system", owner="DaemonSet"))]
    yield nodes, fakes, kube, credentials
    stop_all(fakes)
    kube.close()


def _kube(kube):
    return lambda: KubeApi(read_kubeconfig(kube.kubeconfig()))


def _timeline(fakes, kube) -> list[tuple[str, str]]:
    return upgrade_timeline({name: fake.calls for name, fake in fakes.items()}, kube.audit_log)


def _current_upgrade(credentials, nodes, stand_in, name, events=None, **kwargs):
    node = nodes[name]
    with _client(credentials, node) as client:
        upgrade_node(client, node, NEXT_IMAGE, **{
            "talos_version": NEXT, "timeout": 10, "backoff": FAST, "kube": _kube(stand_in),
            "on_event": (lambda what, who: events.append(what)) if events is not None else None, **kwargs})


@pytest.mark.parametrize("tag, lifecycle", [
    ("v1.13.0", True), ("v1.13.7", True), ("v1.14.0-rc.1", True), ("v1.17.2", True), ("1.13.1", True),
    ("v1.14.0-RC.1", True), ("v1.13.1-alpha.0", True),  # upper-case pre-releases; any pre-release past 1.13.0
    ("v1.13.0-alpha.3", True), ("v1.13.0-beta.0", True), ("v1.13.0-alpha.2.1", True), ("v1.13.0-alpha.10", True),
    ("v1.13.0-3", False),  # a numeric pre-release sorts below any word
    ("v1.13.0-alpha.2", False), ("v1.13.0-alpha.1", False), ("v1.13.0-alpha", False),
    ("v1.12.6", False), ("v1.11.5", False), ("v2.0.0", False), ("v0.14.0", False), ("", False), ("main", False),
])
def test_which_nodes_take_the_lifecycle_api_is_talosctls_version_range(tag, lifecycle):
    assert uses_lifecycle_api(tag) is lifecycle


def test_a_roll_on_talos_1_13_pulls_installs_drains_reboots_and_uncordons_one_node_at_a_time(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    events = []

    def step(node):
        with _client(credentials, node) as client:
            upgrade_node(client, node, NEXT_IMAGE, talos_version=NEXT, timeout=15, backoff=FAST, kube=_kube(kube),
                         on_event=lambda what, name: events.append((what, name)))

    assert roll(list(nodes.values()), step) == ROLL
    assert _timeline(fakes, kube) == [entry for name in ROLL for entry in (
        (name, "ImageService/Pull"), (name, "LifecycleService/Upgrade"), ("kubernetes", f"cordon {name}"),
        ("kubernetes", f"evict default/web-{name}"), (name, "Reboot"), ("kubernetes", f"uncordon {name}"))]
    for name, fake in fakes.items():
        (pull,) = fake.calls_for("ImageService/Pull")
        assert pull.request.image_ref == NEXT_IMAGE
        # talosctl upgrade's default: the CRI containerd's system namespace
        assert (pull.request.containerd.driver, pull.request.containerd.namespace) == (1, 1)
        (install,) = fake.calls_for("LifecycleService/Upgrade")
        assert install.request.source.image_name == NEXT_IMAGE and install.request.containerd == pull.request.containerd
        (reboot,) = fake.calls_for("Reboot")
        assert reboot.request.mode == machine_pb2.RebootRequest.DEFAULT and reboot.roles == ("os:admin",)
        assert fake.version_tag == NEXT and fake.calls_for("Upgrade") == []
    per_node = ["healthy-before", "installer-pulled", "installed", "cordoned", "drained (1 pod(s) evicted)",
                "reboot-requested", "rebooted", "healthy", "uncordoned"]
    assert events == [(what, name) for name in ROLL for what in per_node]
    assert kube.unschedulable == dict.fromkeys(ROLL, False)
    assert sorted(p["metadata"]["name"] for p in kube.pods) == sorted(f"cilium-{name}" for name in ROLL)


def test_a_failed_install_stops_before_the_drain_and_the_reboot_naming_the_exit_code(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["cp-1"].installer_exit_code = 1
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "cp-1")
    assert str(failed.value) == (f"node cp-1 (10.5.0.1): the installer {NEXT_IMAGE} exited with code 1; the node "
                                 "still runs its old version; it said: checking the install disk | partitioning "
                                 "the install disk | failed to write the boot partition")  # its last three lines
    assert _timeline(fakes, kube) == [("cp-1", "ImageService/Pull"), ("cp-1", "LifecycleService/Upgrade")]
    assert fakes["cp-1"].version_tag == CURRENT and fakes["cp-1"].is_up


def test_an_install_stream_without_an_exit_code_is_a_failure(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].behaviours["LifecycleService/Upgrade"] = lambda node, request, context: iter(())
    with pytest.raises(RollError, match=r"^node worker-1 \(10\.5\.0\.11\): the installer .* ended without an exit "
                                        r"code; the node still runs its old version$"):
        _current_upgrade(credentials, nodes, kube, "worker-1")
    assert fakes["worker-1"].calls_for("Reboot") == [] and kube.changes == []


def test_a_refused_pull_names_the_image_and_installs_nothing(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].fail_next("ImageService/Pull", grpc.StatusCode.NOT_FOUND, "manifest unknown")
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "worker-1")
    assert str(failed.value).startswith(f"node worker-1 (10.5.0.11): pulling the installer {NEXT_IMAGE} failed: ")
    assert "manifest unknown" in str(failed.value)
    assert fakes["worker-1"].calls_for("LifecycleService/Upgrade") == [] and kube.changes == []


def test_a_drain_that_cannot_finish_uncordons_and_does_not_reboot(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    kube.evictions_refused["web-worker-1"] = 10_000
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "worker-1", drain_timeout=0.3)
    assert str(failed.value).startswith("node worker-1 (10.5.0.11): node worker-1: not drained after 0.3s; still on "
                                        "it: default/web-worker-1 (eviction refused by a disruption budget); not "
                                        "rebooted (the new version is installed and starts at its next reboot)")
    timeline = _timeline(fakes, kube)
    assert timeline[:3] == [("worker-1", "ImageService/Pull"), ("worker-1", "LifecycleService/Upgrade"),
                            ("kubernetes", "cordon worker-1")]
    assert timeline[-1] == ("kubernetes", "uncordon worker-1") and ("worker-1", "Reboot") not in timeline
    assert kube.unschedulable == {"worker-1": False} and fakes["worker-1"].version_tag == CURRENT


def test_a_node_that_does_not_come_back_is_reported_and_still_uncordoned(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].behaviours["Reboot"] = lambda node, request, context: (
        node.go_down(), machine_pb2.RebootResponse(messages=[machine_pb2.Reboot()]))[1]
    with pytest.raises(RollError, match=r"^node worker-1 \(10\.5\.0\.11\): not healthy after "):
        _current_upgrade(credentials, nodes, kube, "worker-1", timeout=2)
    assert _timeline(fakes, kube)[-2:] == [("worker-1", "Reboot"), ("kubernetes", "uncordon worker-1")]


def test_a_lost_reboot_reply_is_not_answered_with_a_second_reboot(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].fail_next("Reboot", grpc.StatusCode.UNAVAILABLE, "connection reset")
    # 8 s: what is left of it still runs out in the reboot wait when the steps before it are slow (a loaded
    # 2-core CI machine used up 4 s before the reboot wait had its turn)
    with pytest.raises(RollError, match=r"did not reboot into the upgrade within "):
        _current_upgrade(credentials, nodes, kube, "worker-1", timeout=8)
    assert len(fakes["worker-1"].calls_for("Reboot")) == 1


def test_a_two_member_etcd_is_refused_before_anything_happens(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    for name in ("cp-1", "cp-2"):
        fakes[name].etcd_members = [m for m in fakes[name].etcd_members if m.hostname != "cp-3"]
    fakes["cp-3"].stop()
    hook = []
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "cp-1", before_upgrade=lambda: hook.append("snapshot"))
    assert str(failed.value) == ("node cp-1 (10.5.0.1): not upgraded: etcd has 2 members, so the other one alone "
                                 "loses quorum while this one is down; add a third control plane first (or remove "
                                 "one)")
    assert hook == [] and _timeline(fakes, kube) == []


def test_without_a_kubernetes_api_the_drain_is_skipped_and_said(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    events = []
    _current_upgrade(credentials, nodes, kube, "worker-1", events=events, kube=None)
    assert "drain-skipped (no Kubernetes API)" in events and kube.changes == []
    assert fakes["worker-1"].version_tag == NEXT


def test_a_node_cordoned_before_the_upgrade_stays_cordoned(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    kube.unschedulable["worker-1"] = True  # an operator's own cordon
    events = []
    _current_upgrade(credentials, nodes, kube, "worker-1", events=events)
    assert kube.unschedulable == {"worker-1": True} and fakes["worker-1"].version_tag == NEXT
    assert _timeline(fakes, kube)[-1] == ("worker-1", "Reboot")  # no uncordon after it
    assert events[-1] == "left cordoned (it was before the upgrade)"


def test_a_drain_that_fails_on_a_node_cordoned_before_leaves_it_cordoned(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    kube.unschedulable["worker-1"] = True
    kube.evictions_refused["web-worker-1"] = 10_000
    with pytest.raises(RollError, match="not drained after 0.3s"):
        _current_upgrade(credentials, nodes, kube, "worker-1", drain_timeout=0.3)
    assert kube.unschedulable == {"worker-1": True}
    assert not [what for _, what, body in kube.changes if body.get("spec", {}).get("unschedulable") is False]


def test_the_etcd_member_list_for_the_quorum_check_is_bounded_and_asks_the_node(cluster, credentials):
    nodes, fakes = cluster
    cp1 = next(n for n in nodes if n.name == "cp-1")
    with _client(credentials, cp1) as client:
        assert etcd_quorum_problem(client, cp1) is None  # three members
        fakes["cp-1"].delays["EtcdMemberList"] = 10.0
        started = time.monotonic()
        with pytest.raises(operations_errors.TalosApiError):
            etcd_quorum_problem(client, cp1, call_timeout=1.0)
    assert time.monotonic() - started < 5
    assert fakes["cp-1"].calls_for("EtcdMemberList")[0].metadata.get("node") == ["10.5.0.1"]


def test_a_roll_client_targets_its_node_and_bounds_each_call(cluster, bundle):
    nodes, fakes = cluster
    worker = next(n for n in nodes if n.name == "worker-1")
    talosconfig = client_config.talosconfig(bundle, "test", [fakes["cp-1"].endpoint])
    fakes["worker-1"].delays["Version"] = 10.0
    started = time.monotonic()
    with client_for(worker, talosconfig, timeout=1.0) as client, pytest.raises(operations_errors.TalosApiError):
        client.version()
    assert time.monotonic() - started < 5
    assert fakes["worker-1"].calls_for("Version")[0].metadata.get("node") == ["10.5.0.11"]


def test_the_install_retries_with_the_given_backoff_clock_and_sleep_and_names_the_step(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].fail_next("ImageService/Pull", grpc.StatusCode.UNAVAILABLE, "registry unreachable", times=1000)
    slow = Backoff(initial=1.0, factor=3.0, maximum=7.0)
    clock = FakeClock()
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "worker-1", timeout=60, backoff=slow, sleep=clock.sleep, clock=clock)
    assert str(failed.value).startswith(f"node worker-1 (10.5.0.11): pulling the installer {NEXT_IMAGE} failed: "
                                        f"pulling the installer {NEXT_IMAGE} on worker-1: gave up after ")
    assert clock.slept_as(slow, within=60), clock.slept


def test_a_hung_pull_is_bounded_by_the_upgrades_time_left(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].delays["ImageService/Pull"] = 10.0
    started = time.monotonic()
    with pytest.raises(RollError, match="pulling the installer"):
        _current_upgrade(credentials, nodes, kube, "worker-1", timeout=1.5)
    assert time.monotonic() - started < 4.5  # not the client's own 5 s per call


def test_a_hung_install_is_bounded_by_the_upgrades_time_left(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].delays["LifecycleService/Upgrade"] = 10.0
    started = time.monotonic()
    with pytest.raises(RollError, match=f"installing {NEXT_IMAGE} failed"):
        _current_upgrade(credentials, nodes, kube, "worker-1", timeout=1.5)
    assert time.monotonic() - started < 4.5  # not the client's own 5 s per call


def test_a_refused_install_or_reboot_names_the_node_and_the_step(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    fakes["worker-1"].fail_next("LifecycleService/Upgrade", grpc.StatusCode.PERMISSION_DENIED, "not authorized")
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "worker-1")
    assert str(failed.value).startswith(f"node worker-1 (10.5.0.11): installing {NEXT_IMAGE} failed: ")
    fakes["worker-1"].fail_next("Reboot", grpc.StatusCode.PERMISSION_DENIED, "not authorized")
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "worker-1")
    assert failed.value.node.name == "worker-1"
    assert str(failed.value).startswith("node worker-1 (10.5.0.11): the reboot into the installed upgrade was "
                                        "refused: ") and "not authorized" in str(failed.value)
    assert kube.unschedulable["worker-1"] is False  # uncordoned again after the refusal


def test_an_uncordon_that_fails_is_a_failure_once_upgraded_and_said_while_stopping(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    kube.refuse_uncordon = True
    with pytest.raises(RollError) as failed:
        _current_upgrade(credentials, nodes, kube, "worker-1")
    assert failed.value.node.name == "worker-1" and fakes["worker-1"].version_tag == NEXT
    assert str(failed.value).startswith("node worker-1 (10.5.0.11): upgraded and healthy, but still cordoned: "
                                        "uncordon failed: ") and "HTTP 403" in str(failed.value)
    kube.evictions_refused["web-cp-1"] = 10_000
    heard = []
    with pytest.raises(RollError, match="not drained after"):
        _current_upgrade(credentials, nodes, kube, "cp-1", drain_timeout=0.3,
                         on_event=lambda what, who: heard.append((what, who)))
    [(what, who)] = [(what, who) for what, who in heard if what.startswith("uncordon-failed")]
    assert who == "cp-1" and "HTTP 403" in what


@pytest.mark.parametrize("done, untouched, expected", [
    ((), (), "node cp-2 (10.5.0.2): no answer"),
    (("cp-1",), (), "rolling operation stopped at node cp-2 (10.5.0.2): no answer; finished: cp-1; not touched: none"),
    ((), ("cp-3",), "rolling operation stopped at node cp-2 (10.5.0.2): no answer; finished: none; not touched: cp-3"),
    (("cp-1", "cp-0"), ("cp-3", "w-1"),
     "rolling operation stopped at node cp-2 (10.5.0.2): no answer; finished: cp-1, cp-0; not touched: cp-3, w-1"),
])
def test_a_roll_error_names_the_node_and_what_was_finished_and_not_touched(done, untouched, expected):
    error = RollError(RollNode("cp-2", "10.5.0.2", "controlplane"), "no answer", done, untouched)
    assert str(error) == expected
    assert (error.done, error.untouched) == (tuple(done), tuple(untouched))


# --- the health wait and the reboot wait, branch by branch ------------------------------------------

def _fail_services(fake, times):
    """etcd reported Failed by the next `times` ServiceList answers, Running after."""
    answers = []

    def service_list(node, request, context):
        answers.append(len(answers) < times)
        state = "Failed" if answers[-1] else "Running"
        return machine_pb2.ServiceListResponse(messages=[machine_pb2.ServiceList(services=[
            machine_pb2.ServiceInfo(id=s.id, state=state if s.id == "etcd" else s.state, health=s.health)
            for s in node.services])])
    fake.behaviours["ServiceList"] = service_list
    return answers


def test_an_unhealthy_node_is_waited_for_until_it_is_healthy(cluster, credentials):
    nodes, fakes = cluster
    cp1 = next(n for n in nodes if n.name == "cp-1")
    answers = _fail_services(fakes["cp-1"], times=2)
    with _client(credentials, cp1) as client:
        wait_healthy(client, cp1, timeout=10, backoff=FAST)
    assert answers[:3] == [True, True, False]


def test_a_node_still_unhealthy_at_the_deadline_is_named_with_every_problem(cluster, credentials):
    nodes, fakes = cluster
    cp1 = next(n for n in nodes if n.name == "cp-1")
    fakes["cp-1"].etcd_members = [m for m in fakes["cp-1"].etcd_members if m.hostname != "cp-1"]
    clock = FakeClock()  # with SECONDS, not FAST: FAST's last check had 37 ms of real time, too little under load
    with _client(credentials, cp1) as client, pytest.raises(RollError) as failed:
        wait_healthy(client, cp1, timeout=5, backoff=SECONDS, sleep=clock.sleep, clock=clock)
    assert clock.slept == [1.0] * 4
    assert str(failed.value) == (
        "node cp-1 (10.5.0.1): not healthy after 5s: etcd member on cp-1: no member has a URL on 10.5.0.1; "
        "etcd members consistent on cp-2: lists members [101, 102, 103], cp-1 lists [102, 103]; "
        "etcd members consistent on cp-3: lists members [101, 102, 103], cp-1 lists [102, 103]")


def test_a_problem_seen_before_the_node_stopped_answering_is_kept_in_the_message(cluster, credentials):
    nodes, fakes = cluster
    cp1 = next(n for n in nodes if n.name == "cp-1")
    _fail_services(fakes["cp-1"], times=1)
    original = fakes["cp-1"].behaviours["ServiceList"]

    def then_gone(node, request, context):
        reply = original(node, request, context)
        node.fail_next("Version", grpc.StatusCode.UNAVAILABLE, "connection refused", times=1000)
        return reply
    fakes["cp-1"].behaviours["ServiceList"] = then_gone
    clock = FakeClock()
    with _client(credentials, cp1) as client, pytest.raises(RollError) as failed:
        wait_healthy(client, cp1, timeout=2, backoff=FAST, sleep=clock.sleep, clock=clock)
    message = str(failed.value)
    assert message.startswith("node cp-1 (10.5.0.1): not healthy after 2s: service healthy on cp-1: service etcd "
                              "is Failed (then: Talos API Version at ")
    assert message.endswith(")") and message.count(" (then: ") == 1


def test_an_error_answer_to_the_health_check_stops_at_once_naming_the_node(cluster, credentials):
    nodes, fakes = cluster
    cp1 = next(n for n in nodes if n.name == "cp-1")
    fakes["cp-1"].fail_next("ServiceList", grpc.StatusCode.PERMISSION_DENIED, "not authorized", times=100)
    started = time.monotonic()
    with _client(credentials, cp1) as client, pytest.raises(RollError) as failed:
        wait_healthy(client, cp1, timeout=20, backoff=FAST)
    assert str(failed.value).startswith("node cp-1 (10.5.0.1): health check failed: ")
    assert "not authorized" in str(failed.value) and failed.value.node is cp1
    assert time.monotonic() - started < 10


def test_a_node_already_on_the_new_version_without_going_down_counts_as_rebooted(cluster, credentials):
    nodes, fakes = cluster

    def upgraded_at_once(node, request, context):
        node.version_tag = NEW  # e.g. it rebooted between two of our polls
        return machine_pb2.UpgradeResponse(messages=[machine_pb2.Upgrade(ack="Upgrade request received")])
    fakes["worker-1"].behaviours["Upgrade"] = upgraded_at_once
    events = []
    _upgrade(credentials, _worker(nodes), on_event=lambda what, name: events.append(what))
    assert events == ["healthy-before", "upgrade-requested", "rebooted", "healthy"]


def test_a_node_on_neither_version_is_still_waited_for(cluster, credentials):
    nodes, fakes = cluster

    def on_another_version(node, request, context):
        node.version_tag = "v1.12.9"
        return machine_pb2.UpgradeResponse(messages=[machine_pb2.Upgrade(ack="Upgrade request received")])
    fakes["worker-1"].behaviours["Upgrade"] = on_another_version
    with pytest.raises(RollError) as failed:
        # 4 s of real time: on a loaded machine 1.5 s ran out before the roll reached the reboot wait
        _upgrade(credentials, _worker(nodes), timeout=4.0)
    assert "still running Talos v1.12.9; waiting for it to reboot" in str(failed.value)


def test_an_upgrade_call_that_never_gets_through_names_the_retried_step(cluster, credentials):
    nodes, fakes = cluster
    fakes["worker-1"].fail_next("Upgrade", grpc.StatusCode.UNAVAILABLE, "connection reset", times=1000)
    with pytest.raises(RollError) as failed:
        _upgrade(credentials, _worker(nodes), timeout=1.5)
    # the last attempt gets what time is left, so it may end in its own deadline rather than in UNAVAILABLE
    assert re.match(rf"node worker-1 \(10\.5\.0\.11\): upgrade to {re.escape(IMAGE)} (was refused: upgrade "
                    rf"worker-1: gave up after |got no answer before the roll's deadline)", str(failed.value))
    assert len(fakes["worker-1"].calls_for("Upgrade")) > 1


def _nodes_with_one_down(down: str) -> list[dict]:
    return [k8s_node(name, False, "NodeStatusUnknown", "Kubelet stopped posting node status.") if name == down
            else k8s_node(name, True) for name in ROLL]


def test_a_node_is_not_taken_down_while_another_node_is_not_ready(current_cluster):
    """cp-3 stopped by hand: upgrading worker-1 then would have two nodes down at once."""
    nodes, fakes, kube, credentials = current_cluster
    kube.states = [(_nodes_with_one_down("cp-3"), coredns(2))]
    events = []
    with pytest.raises(RollError) as refused:
        _current_upgrade(credentials, nodes, kube, "worker-1", events=events, preflight_timeout=1)
    assert str(refused.value) == (
        "node worker-1 (10.5.0.11): not taken down: node cp-3 is not Ready (NodeStatusUnknown: Kubelet stopped "
        "posting node status.) after 1s, and a roll takes one node down at a time (bring it back, or take it out of "
        "`nodes`)")
    assert events == ["healthy-before", "waiting for the other nodes (node cp-3 is not Ready (NodeStatusUnknown: "
                                        "Kubelet stopped posting node status.))"]
    assert _timeline(fakes, kube) == [] and kube.changes == []  # no pull, no install, no cordon


def test_the_node_s_own_readiness_does_not_hold_its_upgrade(current_cluster):
    nodes, fakes, kube, credentials = current_cluster
    kube.states = [(_nodes_with_one_down("worker-1"), coredns(2))]
    _current_upgrade(credentials, nodes, kube, "worker-1", preflight_timeout=1)
    assert fakes["worker-1"].version_tag == NEXT
