"""The first `pulumi up` with `health.wait` on, end to end (tests/e2e_engine.py), against the Kubernetes API
stand-in of tests/kube_stand_in.py: the kubeconfig the control plane hands out points at it.

Two fresh clusters (one control plane, one worker on 127.0.0.2-3:50000), one after the other: in the
first, the nodes are not Ready on the first poll and everything is healthy on the second, and the up
succeeds once it is; in the second, CoreDNS never becomes available, and the up fails after
health.timeoutSeconds with the message naming what was still wrong.
"""

from __future__ import annotations

import pytest

from tests.e2e_engine import e2e_cluster, e2e_config
from tests.kube_stand_in import COREDNS_PATH, DAEMONSETS_PATH, NODES_PATH, PODS_PATH, NOT_READY, StandInApi, coredns, node

NODES = [("e2e-cp-1", "controlplane", "127.0.0.2"), ("e2e-worker-1", "worker", "127.0.0.3")]
TALOS = "v1.13.7"
READY = [node("e2e-cp-1", True), node("e2e-worker-1", True)]


def first_up(tmp_path_factory, states, timeout_seconds: int, fails: bool = False):
    """A new cluster's first up with the health wait on, the Kubernetes API answering `states` per poll."""
    api = StandInApi(states)
    try:
        with e2e_cluster(NODES, TALOS, tmp_path_factory) as cluster:
            cluster.nodes["e2e-cp-1"].kubeconfig_yaml = api.kubeconfig()
            health = {"wait": True, "timeoutSeconds": timeout_seconds}
            up = cluster.up(e2e_config(cluster.factory.url, NODES, TALOS, health=health), fails=fails)
        return up, api
    finally:
        api.close()


@pytest.fixture(scope="module")
def healthy(tmp_path_factory):
    return first_up(tmp_path_factory, [([node("e2e-cp-1", True), NOT_READY], None), (READY, coredns(2))], 30)


@pytest.fixture(scope="module")
def coredns_never_available(tmp_path_factory):
    return first_up(tmp_path_factory, [(READY, coredns(0))], 1, fails=True)


def test_first_up_waits_for_nodes_ready_and_coredns_then_succeeds(healthy):
    up, api = healthy
    assert up.error is None
    assert ("health", "create") in {(s.name, s.op) for s in up.monitor.steps}
    assert {(s.name, s.op) for s in up.monitor.steps} == {(s.name, s.op) for s in up.plan.steps}
    assert api.polls == 2  # not Ready at first: it polled again
    assert api.requests == [(path, "system:masters") for path in (NODES_PATH, PODS_PATH, DAEMONSETS_PATH, COREDNS_PATH)] * 2
    assert up.monitor.state_named("health").outputs["server"] == api.server
    # the wait comes after the cluster exists: bootstrap and kubeconfig were made first
    made = [s.name for s in up.monitor.steps]
    assert made.index("bootstrap") < made.index("kubeconfig") < made.index("health")


def test_first_up_fails_with_the_timeout_message_when_coredns_never_becomes_available(coredns_never_available):
    up, api = coredns_never_available
    message = str(up.error)
    assert f"cluster at {api.server} not healthy after 1s (health.timeoutSeconds)" in message
    assert "CoreDNS (kube-system/coredns): 0 of 2 replicas available" in message
    assert "expected nodes registered" not in message and "is not Ready" not in message
    assert api.polls >= 2
    steps = {(s.name, s.op) for s in up.monitor.steps}
    assert ("health", "create") not in steps and ("health", "create") in {(s.name, s.op) for s in up.plan.steps}
    assert steps == {(s.name, s.op) for s in up.plan.steps} - {("health", "create")}
    assert not [urn for urn in up.monitor.state if urn.endswith("::health")]  # a rerun waits again
