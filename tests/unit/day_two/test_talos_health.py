"""Node and etcd health through the Talos API: a stand-in cluster of three control planes and a worker,
healthy, then with exactly one condition broken per test; each names the check, the node and what was seen."""

from __future__ import annotations

import pytest

from talos_proxmox.day_two.rolling import health_problems
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.generated.machine import machine_pb2
from tests.support.day_two import bundle, credentials, stand_in_cluster, stop_all  # noqa: F401 - fixtures

TAG = "v1.13.7"
LAYOUT = [("cp-1", "10.5.0.1", "controlplane"), ("cp-2", "10.5.0.2", "controlplane"),
          ("cp-3", "10.5.0.3", "controlplane"), ("worker-1", "10.5.0.4", "worker")]


@pytest.fixture
def cluster(bundle):  # noqa: F811
    nodes, fakes = stand_in_cluster(bundle, LAYOUT, version_tag=TAG)
    yield nodes, fakes
    stop_all(fakes)


def problems(cluster, credentials, name, expected_tag=TAG):  # noqa: F811
    nodes, _ = cluster
    node = nodes[name]
    with TalosClient([node.dial], credentials=credentials, node=node.address, timeout=5) as client:
        return health_problems(client, node, expected_tag, call_timeout=5)


def _service(fake, service_id, **fields):
    for service in fake.services:
        if service.id == service_id:
            for key, value in fields.items():
                if key == "health":
                    service.health.CopyFrom(value)
                else:
                    setattr(service, key, value)


def test_a_healthy_cluster_has_no_problem(cluster, credentials):  # noqa: F811
    assert problems(cluster, credentials, "cp-1") == []
    assert problems(cluster, credentials, "worker-1") == []


def test_apid_answering_without_a_message(cluster, credentials):  # noqa: F811
    cluster[1]["worker-1"].behaviours["Version"] = lambda node, request, context: machine_pb2.VersionResponse()
    assert problems(cluster, credentials, "worker-1") == ["apid ready on worker-1: Version answered with no message"]


def test_talos_version_other_than_expected(cluster, credentials):  # noqa: F811
    assert problems(cluster, credentials, "worker-1", expected_tag="v1.14.0") == [
        "Talos version on worker-1: reports Talos v1.13.7, expected v1.14.0"]


def test_boot_sequence_not_finished(cluster, credentials):  # noqa: F811
    cluster[1]["worker-1"].machine_stage = "booting"
    assert problems(cluster, credentials, "worker-1") == ["boot sequence finished on worker-1: stage is booting"]


def test_running_but_boot_conditions_unmet(cluster, credentials):  # noqa: F811
    cluster[1]["worker-1"].unmet_conditions = [{"name": "nodeReady", "reason": "node not ready"}]
    assert problems(cluster, credentials, "worker-1") == [
        "boot sequence finished on worker-1: running but not ready (nodeReady: node not ready)"]


def test_kubelet_not_running(cluster, credentials):  # noqa: F811
    _service(cluster[1]["worker-1"], "kubelet", state="Failed")
    assert problems(cluster, credentials, "worker-1") == ["service healthy on worker-1: service kubelet is Failed"]


def test_apid_running_but_failing_its_health_check(cluster, credentials):  # noqa: F811
    _service(cluster[1]["cp-1"], "apid", health=machine_pb2.ServiceHealth(healthy=False, last_message="no certs"))
    assert problems(cluster, credentials, "cp-1") == ["service healthy on cp-1: service apid is unhealthy (no certs)"]


def test_etcd_unhealthy_on_another_member(cluster, credentials):  # noqa: F811
    """Quorum: before leaving cp-1, the roll sees that cp-2's etcd is down too."""
    _service(cluster[1]["cp-2"], "etcd", health=machine_pb2.ServiceHealth(healthy=False, last_message="no leader"))
    assert problems(cluster, credentials, "cp-1") == ["service healthy on cp-2: service etcd is unhealthy (no leader)"]


def test_etcd_member_lists_that_disagree(cluster, credentials):  # noqa: F811
    fake = cluster[1]["cp-2"]
    fake.etcd_members = [m for m in fake.etcd_members if m.hostname != "cp-3"]
    assert problems(cluster, credentials, "cp-1") == [
        "etcd members consistent on cp-2: lists members [100, 101], cp-1 lists [100, 101, 102]"]


def test_an_etcd_learner(cluster, credentials):  # noqa: F811
    for fake in cluster[1].values():
        for member in fake.etcd_members:
            if member.hostname == "cp-3":
                member.is_learner = True
    assert problems(cluster, credentials, "cp-1") == ["etcd member on cp-3: is still a learner"]


def test_a_member_that_is_not_a_control_plane(cluster, credentials):  # noqa: F811
    fake = cluster[1]["cp-3"]
    fake.services = [s for s in fake.services if s.id != "etcd"]
    assert problems(cluster, credentials, "cp-1") == [
        "etcd members are control planes on cp-3: runs no etcd service (not a control plane)"]


def test_a_member_that_does_not_answer(cluster, credentials):  # noqa: F811
    cluster[1]["cp-3"].go_down()
    [problem] = problems(cluster, credentials, "cp-1")
    assert problem.startswith("etcd members are control planes on cp-3: member at 10.5.0.3 does not answer as a node")


def test_the_node_itself_not_a_member(cluster, credentials):  # noqa: F811
    for fake in cluster[1].values():
        fake.etcd_members = [m for m in fake.etcd_members if m.hostname != "cp-1"]
    assert problems(cluster, credentials, "cp-1") == ["etcd member on cp-1: no member has a URL on 10.5.0.1"]
