"""Cordon, drain and uncordon against the stand-in Kubernetes API: which pods are evicted, in what order
the API sees it, disruption budgets waited on, and a drain that cannot finish named."""

from __future__ import annotations

import pytest

from talos_proxmox.day_two import node_drain
from talos_proxmox.day_two.cluster_health import KubeApi, read_kubeconfig
from tests.support.day_two import FakeClock
from tests.stand_ins.kubernetes_api import StandInApi, coredns, node, workload_pod

NODES = [node("cp-1", True), node("worker-1", True)]


@pytest.fixture
def api():
    stand_in = StandInApi([(NODES, coredns(2))])
    yield stand_in
    stand_in.close()


def _client(api) -> KubeApi:
    return KubeApi(read_kubeconfig(api.kubeconfig()))


def _changes(api) -> list[tuple[str, dict]]:
    return [(what, body) for _, what, body in api.changes]


def _eviction(namespace, name):
    return (f"POST /api/v1/namespaces/{namespace}/pods/{name}/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}})


def test_pods_to_evict_leaves_daemonset_mirror_and_finished_pods():
    pods = {"items": [
        workload_pod("web-1", "worker-1"),
        workload_pod("cilium-abc", "worker-1", namespace="kube-system", owner="DaemonSet"),
        workload_pod("kube-apiserver-cp-1", "worker-1", namespace="kube-system", owner="Node", mirror=True),
        workload_pod("job-1", "worker-1", owner="Job", phase="Succeeded"),
        workload_pod("crashed", "worker-1", owner=None, phase="Failed"),
        workload_pod("bare", "worker-1", owner=None),
    ]}
    # a DaemonSet reference that is not the controller does not keep a pod
    pods["items"][-1]["metadata"]["ownerReferences"] = [{"kind": "DaemonSet", "name": "x", "controller": False}]
    assert [p["metadata"]["name"] for p in node_drain.pods_to_evict(pods)] == ["web-1", "bare"]
    assert node_drain.pods_to_evict(None) == [] and node_drain.pods_to_evict({"items": None}) == []


def test_drain_cordons_then_evicts_each_pod_of_that_node_only(api):
    api.pods = [workload_pod("web-1", "worker-1"), workload_pod("web-2", "worker-1", namespace="shop"),
                workload_pod("cilium-x", "worker-1", namespace="kube-system", owner="DaemonSet"),
                workload_pod("web-3", "cp-1")]
    events = []
    assert node_drain.drain(_client(api), "worker-1", poll=0.01, on_event=events.append) == 2
    assert _changes(api) == [
        ("PATCH /api/v1/nodes/worker-1", {"spec": {"unschedulable": True}}),
        _eviction("default", "web-1"), _eviction("shop", "web-2")]
    assert ("PATCH /api/v1/nodes/worker-1", "application/strategic-merge-patch+json") in api.requests
    assert api.unschedulable == {"worker-1": True}
    assert [p["metadata"]["name"] for p in api.pods] == ["cilium-x", "web-3"]
    assert events == ["cordoned", "drained (2 pod(s) evicted)"]
    node_drain.set_unschedulable(_client(api), "worker-1", False)
    assert api.unschedulable == {"worker-1": False}
    assert _changes(api)[-1] == ("PATCH /api/v1/nodes/worker-1", {"spec": {"unschedulable": False}})


def test_an_eviction_a_disruption_budget_refuses_is_asked_again(api):
    api.pods = [workload_pod("db-0", "worker-1")]
    api.evictions_refused["db-0"] = 2
    clock, events = FakeClock(), []
    assert node_drain.drain(_client(api), "worker-1", poll=1.0, on_event=events.append, sleep=clock.sleep,
                            clock=clock) == 1
    assert [what for what, _ in _changes(api)].count("POST /api/v1/namespaces/default/pods/db-0/eviction") == 3
    assert clock.slept == [1.0, 1.0]
    assert events[1] == "draining: still on it: default/db-0 (eviction refused by a disruption budget)"


def test_a_drain_that_cannot_finish_names_the_node_and_the_pods_left(api):
    api.pods = [workload_pod("db-0", "worker-1"), workload_pod("web-1", "worker-1"), workload_pod("web-2", "worker-1")]
    api.evictions_refused["db-0"] = 1000
    api.lingering["web-2"] = 1000  # evicted, but terminating for good
    clock = FakeClock()
    with pytest.raises(node_drain.DrainError) as failed:
        node_drain.drain(_client(api), "worker-1", timeout=4.5, poll=1.0, sleep=clock.sleep, clock=clock)
    assert str(failed.value) == ("node worker-1: not drained after 4.5s; still on it: default/db-0 (eviction refused "
                                 "by a disruption budget), default/web-2")
    assert clock.slept == [1.0, 1.0, 1.0, 1.0, 0.5]  # the last sleep only up to the deadline
    assert api.unschedulable == {"worker-1": True}  # left cordoned: the caller decides


def test_an_evicted_pod_still_terminating_is_waited_for_not_evicted_again(api):
    api.pods = [workload_pod("web-1", "worker-1")]
    api.lingering["web-1"] = 2
    clock = FakeClock()
    assert node_drain.drain(_client(api), "worker-1", poll=1.0, sleep=clock.sleep, clock=clock) == 1
    assert [what for what, _ in _changes(api)] == [
        "PATCH /api/v1/nodes/worker-1", "POST /api/v1/namespaces/default/pods/web-1/eviction"]
    assert clock.slept == [1.0, 1.0]


def test_a_node_kubernetes_does_not_know_is_an_error_not_a_drained_node(api):
    with pytest.raises(node_drain.DrainError, match="^node worker-9: no such Kubernetes Node to cordon$"):
        node_drain.drain(_client(api), "worker-9")
    with pytest.raises(node_drain.DrainError, match="^node worker-9: no such Kubernetes Node to uncordon$"):
        node_drain.set_unschedulable(_client(api), "worker-9", False)


def test_refused_credentials_stop_the_drain_at_once():
    api = StandInApi([(NODES, coredns(2))], token="right")
    try:
        token_only = read_kubeconfig(api.kubeconfig(with_client_cert=False, token="wrong"))
        clock = FakeClock()
        with pytest.raises(node_drain.DrainError, match=r"^node worker-1: drain failed: .*HTTP 401"):
            node_drain.drain(KubeApi(token_only), "worker-1", sleep=clock.sleep, clock=clock)
        assert clock.slept == [] and api.unschedulable == {}
    finally:
        api.close()


def test_an_api_that_does_not_answer_is_tried_until_the_deadline(api):
    api.close()
    clock = FakeClock()
    with pytest.raises(node_drain.DrainError) as failed:
        node_drain.drain(_client(api), "worker-1", timeout=4, poll=1.0, sleep=clock.sleep, clock=clock)
    assert str(failed.value).startswith("node worker-1: not drained after 4s; last error: PATCH ")
    assert clock.slept == [1.0] * 4


def test_whether_a_node_is_cordoned_already_is_read_from_its_node_object(api):
    assert node_drain.is_unschedulable(_client(api), "worker-1") is False
    api.unschedulable["worker-1"] = True
    assert node_drain.is_unschedulable(_client(api), "worker-1") is True
    with pytest.raises(node_drain.DrainError, match="^node worker-9: no such Kubernetes Node$"):
        node_drain.is_unschedulable(_client(api), "worker-9")
