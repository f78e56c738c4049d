"""A first install that never gets ready, with the CCM doing node IPAM: the engine tier against a real
Kubernetes control plane (tests/engine/cluster.py, `addons=True`).

One control plane and two workers; the CCM hands out pod CIDRs (`ccm.nodeIpam`), so it must run before the
pod network: as the chart's DaemonSet on the host network, tolerating nodes that are not ready. Cilium's
first install gets agents that never get ready (labelled engine-test/never-ready, which kwok leaves
Pending, as pods whose image never pulls from a mirror that lacks it), on three nodes so that the
DaemonSet's maxUnavailable of 2 cannot hide them, and a 20 s `cilium.timeoutSeconds`:
  failed  the first up fails on the Cilium release; Helm's release is left "failed" with Cilium's
          objects in place (not atomic on a first install: rolling back would take the network with it),
          while the CCM, which does not wait for Cilium, is deployed and initialized the nodes;
  fixed   the values fixed, the next up upgrades the failed release in place and finishes.

What the played controllers do (see tests/engine/cluster.py): the CCM's node controller lifts the
uninitialized taint once a CCM pod is Ready. Pod CIDRs are not handed out here (the CCM's node IPAM does
not run; no container does), and no pod network exists to wait for: that the CCM can start before one is
shown by where and how its pods run (host network, the not-ready toleration, the API server reached
through the node's address), not by a network that stays down.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tests.engine.cluster import EngineCluster, EngineUp, UNINITIALIZED_TAINT, engine_cluster, engine_stack

pytestmark = pytest.mark.engine

NODES = [("first-install-cp-1", "controlplane", "127.0.0.92"), ("first-install-worker-1", "worker", "127.0.0.93"),
         ("first-install-worker-2", "worker", "127.0.0.94")]
TALOS = "v1.13.7"
CILIUM_TIMEOUT = 20
NEVER_READY = {"operator": {"replicas": 1}, "podLabels": {"engine-test/never-ready": "true"}}
FIXED = {"operator": {"replicas": 1}}
CCM_DAEMONSET = "/apis/apps/v1/namespaces/kube-system/daemonsets/talos-cloud-controller-manager"
CCM_DEPLOYMENT = "/apis/apps/v1/namespaces/kube-system/deployments/talos-cloud-controller-manager"
CILIUM_DAEMONSET = "/apis/apps/v1/namespaces/kube-system/daemonsets/cilium"


@dataclass
class Installs:
    failed: EngineUp
    after_failed: dict
    fixed: EngineUp
    after_fixed: dict
    cluster: EngineCluster


def stack_config(cluster: EngineCluster, secrets_file, cilium_values: dict) -> dict:
    config = engine_stack(cluster, NODES, TALOS, secrets_file, health={"wait": True, "timeoutSeconds": 300})
    config.update(cluster.kubernetes.stack_settings())
    config["cilium"].update(values=cilium_values, timeoutSeconds=CILIUM_TIMEOUT)
    config["ccm"]["nodeIpam"] = {"cidrAllocatorType": "RangeAllocator"}
    return config


def get(cluster: EngineCluster, path: str) -> tuple[int, dict]:
    response = cluster.kubernetes.kube.request("GET", path)
    return response.status_code, response.json()


def read_back(cluster: EngineCluster) -> dict:
    """What the API server holds: the releases' Helm Secrets (name: status), the workloads, the Nodes."""
    ccm_pods = get(cluster, "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io%2Fname%3D"
                            "talos-cloud-controller-manager")[1]["items"]
    releases = cluster.kubernetes.release_secrets
    return {"cilium": releases("cilium"), "ccm": releases("talos-cloud-controller-manager"),
            "cilium-daemonset": get(cluster, CILIUM_DAEMONSET), "ccm-daemonset": get(cluster, CCM_DAEMONSET),
            "ccm-deployment": get(cluster, CCM_DEPLOYMENT)[0], "ccm-pods": ccm_pods,
            "nodes": get(cluster, "/api/v1/nodes")[1]["items"],
            "initialized": list(cluster.kubernetes.initialized_by_ccm)}


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("first-install")
    with engine_cluster(tmp, NODES, TALOS, addons=True) as (cluster, project):
        failed = cluster.deploy(project, stack_config(cluster, tmp / "secrets.yaml", NEVER_READY),
                                tmp / "render-failed", fails=True)
        after_failed = read_back(cluster)
        fixed = cluster.deploy(project, stack_config(cluster, tmp / "secrets.yaml", FIXED), tmp / "render-fixed")
        yield Installs(failed, after_failed, fixed, read_back(cluster), cluster)


def test_a_first_install_that_never_gets_ready_fails_the_up_and_stays_installed(installs):
    up = installs.failed
    assert up.up.returncode != 0 and not up.stopped_in_preview
    assert "cilium" in "".join(up.up.diagnostics("error")), up.error[-3000:]
    # Helm's record and Cilium's objects are still there: nothing uninstalled the cluster's network.
    assert installs.after_failed["cilium"] == {"sh.helm.release.v1.cilium.v1": "failed"}
    status, agent = installs.after_failed["cilium-daemonset"]
    assert status == 200 and agent["status"]["desiredNumberScheduled"] == len(NODES)
    assert not installs.cluster.kubernetes.errors


def test_with_node_ipam_the_ccm_is_a_host_network_daemonset_that_needs_no_pod_network(installs):
    seen = installs.after_failed
    assert seen["ccm"] == {"sh.helm.release.v1.talos-cloud-controller-manager.v1": "deployed"}
    assert seen["ccm-deployment"] == 404
    status, daemonset = seen["ccm-daemonset"]
    assert status == 200
    pod_spec = daemonset["spec"]["template"]["spec"]
    assert pod_spec["hostNetwork"] is True
    assert {"effect": "NoSchedule", "key": "node.kubernetes.io/not-ready", "operator": "Exists"} in pod_spec["tolerations"]
    [container] = pod_spec["containers"]
    assert {"--allocate-node-cidrs", "--cidr-allocator-type=RangeAllocator"} <= set(container["args"])
    api_host = next(e for e in container["env"] if e["name"] == "KUBERNETES_SERVICE_HOST")
    assert api_host["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"  # the node's own address
    # It ran on the control plane while Cilium never became ready, and lifted the nodes' taint.
    assert [p["spec"]["nodeName"] for p in seen["ccm-pods"]] == ["first-install-cp-1"]
    assert sorted(seen["initialized"]) == sorted(name for name, _, _ in NODES)
    assert not any(t["key"] == UNINITIALIZED_TAINT for n in seen["nodes"] for t in n["spec"].get("taints") or ())


def test_the_next_up_upgrades_the_failed_release_in_place(installs):
    up = installs.fixed
    steps = up.up.steps()
    assert steps["cilium"] == "update", steps
    assert steps["talos-ccm"] == "same", steps
    # Helm's upgrade of a release with no deployed revision: the failed one is superseded.
    assert installs.after_fixed["cilium"] == {"sh.helm.release.v1.cilium.v1": "superseded",
                                              "sh.helm.release.v1.cilium.v2": "deployed"}
    assert installs.after_fixed["ccm"] == installs.after_failed["ccm"]
    assert not up.up.diagnostics("error")
