"""The health wait against a stand-in Kubernetes API on 127.0.0.1 that demands the kubeconfig's client cert."""

from __future__ import annotations

import pytest
import yaml

from talos_proxmox.day_two import cluster_health
from talos_proxmox.day_two.cluster_health import (
    ClusterNotHealthy,
    KubeApi,
    KubeApiError,
    KubeconfigError,
    coredns_problems,
    node_problems,
    read_kubeconfig,
    wait_for_health,
)
from providers.cluster_health import ClusterHealthProvider
from talos_proxmox.talos_config.pki import issue_certificate, new_ca, talos_key_pem
from tests.stand_ins.kubernetes_api import (COREDNS_PATH, DAEMONSETS_PATH, NODES_PATH, NOT_READY, PODS_PATH, StandInApi, coredns,
                                 daemonsets, node, static_pods)

@pytest.fixture
def stand_in():
    made = []

    def make(states, **kw):
        api = StandInApi(states, **kw)
        made.append(api)
        return api

    yield make
    for api in made:
        api.close()


HEALTHY = ([node("master-1", True), node("worker-1", True)], coredns(2))


def test_waits_until_nodes_ready_and_coredns_available(stand_in):
    api = stand_in([
        ([node("master-1", True)], None),
        ([node("master-1", True), NOT_READY], coredns(0)),
        HEALTHY,
    ])
    polls = wait_for_health(KubeApi(read_kubeconfig(api.kubeconfig())), expected_nodes=2, timeout_seconds=30,
                            poll_seconds=0.01)
    assert polls == 3
    assert set(api.requests) == {(path, "system:masters") for path in (NODES_PATH, PODS_PATH, DAEMONSETS_PATH, COREDNS_PATH)}


def test_timeout_names_what_is_still_wrong(stand_in):
    api = stand_in([([node("master-1", True), NOT_READY], coredns(0))])
    with pytest.raises(ClusterNotHealthy) as err:
        wait_for_health(KubeApi(read_kubeconfig(api.kubeconfig())), expected_nodes=3, timeout_seconds=0.3,
                        poll_seconds=0.05)
    assert err.value.problems == [
        "2 of 3 expected nodes registered",
        "node worker-1 is not Ready (KubeletNotReady: container runtime network not ready: cni plugin not "
        "initialized)",
        "CoreDNS (kube-system/coredns): 0 of 2 replicas available",
    ]
    assert str(err.value).startswith(f"cluster at {api.server} not healthy after 0.3s (health.timeoutSeconds)")
    assert api.polls >= 2


def test_untrusted_server_is_retried_then_reported(stand_in):
    api = stand_in([HEALTHY])
    other_ca, _ = new_ca(organizations=["kubernetes"], key_type="ecdsa-p256")
    with pytest.raises(ClusterNotHealthy) as err:
        wait_for_health(KubeApi(read_kubeconfig(api.kubeconfig(ca_pem=other_ca))), 2, timeout_seconds=0.2,
                        poll_seconds=0.05)
    assert "CERTIFICATE_VERIFY_FAILED" in err.value.problems[0]
    assert api.requests == []


def test_refused_token_fails_at_once(stand_in):
    api = stand_in([HEALTHY], token="right-token")
    kube = KubeApi(read_kubeconfig(api.kubeconfig(with_client_cert=False, token="wrong-token")))
    with pytest.raises(KubeApiError, match="HTTP 401 .*credentials are refused") as err:
        wait_for_health(kube, 2, timeout_seconds=30, poll_seconds=0.01)
    assert "wrong-token" not in str(err.value)
    good = KubeApi(read_kubeconfig(api.kubeconfig(with_client_cert=False, token="right-token")))
    assert wait_for_health(good, 2, timeout_seconds=5, poll_seconds=0.01) == 1


def test_talos_labelled_ed25519_client_key_is_accepted(stand_in):
    api = stand_in([HEALTHY])
    ca_pem, ca_key = new_ca(organizations=["kubernetes"], key_type="ed25519")
    access = read_kubeconfig(api.kubeconfig(key_pem=talos_key_pem(issue_certificate(
        ca_pem, ca_key, common_name="admin", client=True)[1])))
    assert access.key_pem.startswith(b"-----BEGIN PRIVATE KEY-----")
    assert "client-key" not in repr(access) and "BEGIN" not in repr(access)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d.update({"current-context": "nope"}), "kubeconfig: contexts has no entry named 'nope'"),
    (lambda d: d["clusters"][0]["cluster"].update(server="http://10.0.0.1:6443"),
     "kubeconfig: cluster 'test-cluster' server 'http://10.0.0.1:6443' is not an https:// URL"),
    (lambda d: d["users"][0]["user"].pop("client-key-data"),
     "kubeconfig: client-certificate-data and client-key-data must be given together"),
    (lambda d: d["users"][0].update(user={}), "kubeconfig: user 'admin' has neither a client certificate nor a token"),
    (lambda d: d["clusters"][0]["cluster"].update({"certificate-authority-data": "!!"}),
     "kubeconfig: certificate-authority-data: not valid base64"),
])
def test_bad_kubeconfig_names_the_field(stand_in, edit, message):
    doc = yaml.safe_load(stand_in([HEALTHY]).kubeconfig())
    edit(doc)
    with pytest.raises(KubeconfigError) as err:
        read_kubeconfig(yaml.safe_dump(doc))
    assert str(err.value) == message


def test_node_and_coredns_checks():
    assert node_problems({"items": [node("a", True), node("b", True)]}, 2) == []
    assert node_problems({"items": [{"metadata": {"name": "c"}, "status": {}}]}, 1) == ["node c: no Ready condition yet"]
    assert node_problems(None, 1) == ["0 of 1 expected nodes registered"]
    assert coredns_problems(coredns(1)) == []
    assert coredns_problems(None) == ["CoreDNS (kube-system/coredns): Deployment not found yet"]
    # Replicas counted available but the Deployment not yet reporting Available: still waiting.
    stale = coredns(1)
    stale["status"]["conditions"][0]["status"] = "False"
    assert coredns_problems(stale) == ["CoreDNS (kube-system/coredns): 1 of 2 replicas available"]


def test_provider_waits_on_create_and_on_trigger_changes_only(stand_in):
    api = stand_in([HEALTHY])
    provider = ClusterHealthProvider()
    props = {"kubeconfig": api.kubeconfig(), "expected_nodes": 2, "timeout_seconds": 5, "poll_seconds": 0.01,
             "triggers": [1, 1], "server": None}
    created = provider.create(props)
    assert created.outs == {"expected_nodes": 2, "timeout_seconds": 5, "triggers": [1, 1], "server": api.server}
    assert "kubeconfig" not in created.outs
    assert api.polls == 1
    assert not provider.diff(created.id, created.outs, {**props, "timeout_seconds": 60}).changes
    assert provider.diff(created.id, created.outs, {**props, "triggers": [2, 1]}).changes
    assert provider.diff(created.id, created.outs, {**props, "expected_nodes": 3}).changes
    provider.update(created.id, created.outs, {**props, "triggers": [2, 1]})
    assert api.polls == 2
    failing = stand_in([([NOT_READY], coredns(0))])
    with pytest.raises(ClusterNotHealthy):
        provider.create({**props, "kubeconfig": failing.kubeconfig(), "expected_nodes": 1, "timeout_seconds": 0.1})


CLUSTER = [node("master-1", True), node("master-2", True), node("worker-1", True)]


def _problems_from(stand_in, state):
    """What one poll of the stand-in API in `state` finds, through the real client and checks."""
    from talos_proxmox.day_two.cluster_health import cluster_problems

    api = stand_in([state])
    return cluster_problems(KubeApi(read_kubeconfig(api.kubeconfig())), expected_nodes=3)


def _cluster():
    return [dict(n, spec=dict(n["spec"])) for n in CLUSTER]


def test_one_condition_at_a_time_healthy_first(stand_in):
    assert _problems_from(stand_in, (CLUSTER, coredns(2))) == []


def test_a_node_that_has_not_registered(stand_in):
    assert _problems_from(stand_in, (CLUSTER[:2], coredns(2), static_pods(CLUSTER[:2]), daemonsets(desired=2))) == [
        "2 of 3 expected nodes registered"]


def test_a_node_not_ready(stand_in):
    nodes = CLUSTER[:2] + [NOT_READY]
    assert _problems_from(stand_in, (nodes, coredns(2))) == [
        "node worker-1 is not Ready (KubeletNotReady: container runtime network not ready: cni plugin not initialized)"]


def test_a_cordoned_node(stand_in):
    nodes = _cluster()
    nodes[2]["spec"]["unschedulable"] = True
    assert _problems_from(stand_in, (nodes, coredns(2))) == ["node worker-1 is not schedulable (cordoned)"]


def test_a_static_pod_missing(stand_in):
    pods = static_pods(CLUSTER)
    pods["items"] = [p for p in pods["items"] if p["metadata"]["name"] != "kube-scheduler-master-2"]
    assert _problems_from(stand_in, (CLUSTER, coredns(2), pods, daemonsets(desired=3, ready=3))) == [
        "static pod kube-scheduler on master-2: not found"]


def test_a_control_plane_component_not_ready(stand_in):
    pods = static_pods(CLUSTER)
    apiserver = next(p for p in pods["items"] if p["metadata"]["name"] == "kube-apiserver-master-1")
    apiserver["status"]["conditions"] = [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]
    assert _problems_from(stand_in, (CLUSTER, coredns(2), pods, daemonsets(desired=3, ready=3))) == [
        "static pod kube-apiserver on master-1: Running but not Ready (ContainersNotReady)"]


def test_a_static_pod_not_running(stand_in):
    pods = static_pods(CLUSTER)
    next(p for p in pods["items"] if p["metadata"]["name"] == "kube-controller-manager-master-2")["status"]["phase"] = "Pending"
    assert _problems_from(stand_in, (CLUSTER, coredns(2), pods, daemonsets(desired=3, ready=3))) == [
        "static pod kube-controller-manager on master-2: Pending"]


def test_no_control_plane_labelled(stand_in):
    nodes = [node(n["metadata"]["name"], True, control_plane=False) for n in CLUSTER]
    assert _problems_from(stand_in, (nodes, coredns(2), static_pods(nodes), daemonsets(desired=3, ready=3))) == [
        "no node has the node-role.kubernetes.io/control-plane label yet"]


def test_the_kube_proxy_replacement_not_ready_everywhere(stand_in):
    assert _problems_from(stand_in, (CLUSTER, coredns(2), static_pods(CLUSTER), daemonsets(desired=3, ready=2))) == [
        "cilium (kube-proxy replacement): 2 of 3 pods ready"]


def test_kube_proxy_itself_when_it_runs(stand_in):
    assert _problems_from(stand_in, (CLUSTER, coredns(2), static_pods(CLUSTER),
                                     daemonsets("kube-proxy", desired=3, ready=0))) == [
        "kube-proxy: 0 of 3 pods ready"]


def test_neither_kube_proxy_nor_a_replacement(stand_in):
    assert _problems_from(stand_in, (CLUSTER, coredns(2), static_pods(CLUSTER), {"items": []})) == [
        "kube-proxy or its replacement: neither DaemonSet (kube-proxy, cilium) found yet"]


def test_coredns_not_available(stand_in):
    assert _problems_from(stand_in, (CLUSTER, coredns(0))) == ["CoreDNS (kube-system/coredns): 0 of 2 replicas available"]


def test_the_wait_prints_what_is_missing_whenever_it_changes_and_when_it_is_healthy():
    class Api:
        server = "https://10.0.0.1:6443"

    answers = iter([["CoreDNS: 0 of 2 available"], ["CoreDNS: 0 of 2 available"], ["CoreDNS: 1 of 2 available"], []])
    told, clock = [], iter(range(0, 100, 5))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cluster_health, "cluster_problems", lambda _api, _expected: next(answers))
        polls = cluster_health.wait_for_health(Api(), 2, 60, poll_seconds=5, clock=lambda: next(clock),
                                               sleep=lambda _s: None, on_waiting=told.append)
    assert polls == 4
    assert told == ["waiting (5s): CoreDNS: 0 of 2 available", "waiting (20s): CoreDNS: 1 of 2 available",
                    "healthy (30s)"]
