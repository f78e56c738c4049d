"""Cilium, the Talos CCM and the health wait for real: the engine tier against a real Kubernetes control plane.

The real Pulumi CLI with the real Kubernetes provider plugin (pulumi-resource-kubernetes 4.32.0, Helm
3.20 inside) and the real Proxmox provider plugin deploys three control planes and a worker with Cilium
and the CCM on and the health wait on. Behind the Talos stand-ins (tests/engine/cluster.py,
`addons=True`): etcd, kube-apiserver, the controller manager and the scheduler for real, kwok as the
kubelets, under the stack's own Kubernetes CA; the charts come from mirrors the test serves over HTTPS
with CAs of its own: Cilium's from a Helm repository (`cilium.repository`, `cilium.caFile`), the CCM's
from an OCI registry (`ccm.chart: oci://...`). What is asserted is what the API server holds: Helm's
release Secrets, the workloads the charts made, the Node objects, and the CLI's own output.

The ups, in order: the first; Cilium's values changed; an LB-IPAM pool (`cilium.loadBalancerAddresses`),
whose pool and L2 policy the API server validates against Cilium's own CRDs; a Talos upgrade whose
worker drain a PodDisruptionBudget blocks through the real Eviction API (the up stops naming the node and
the pod); the same up once the budget is gone; the worker removed; CoreDNS down.

No container runs (kwok marks pods Running and Ready): what this shows is that the releases install and
upgrade, that Helm's wait and the health wait are satisfied by a cluster in the state a healthy one
reports, not that Cilium or the CCM work.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from tests.engine.pulumi_cli import PulumiProject
from tests.engine.cluster import EngineCluster, EngineUp, engine_cluster, engine_stack

pytestmark = pytest.mark.engine

NODES = [("addons-cp-1", "controlplane", "127.0.0.72"), ("addons-cp-2", "controlplane", "127.0.0.73"),
         ("addons-cp-3", "controlplane", "127.0.0.74"), ("addons-worker-1", "worker", "127.0.0.75")]
TALOS, UPGRADE = "v1.13.7", "v1.13.8"
POOL = ["127.0.0.240/30"]
DRAIN_TIMEOUT = 45  # lifecycle.timeoutSeconds while the budget blocks the worker's drain
APP = {"engine-test": "blocked-drain"}  # the labels of the workload the budget protects
HEALTH = {"wait": True, "timeoutSeconds": 300}
SHORT_TIMEOUT = 20  # seconds the health wait is given once CoreDNS is gone
CILIUM_VALUES = {"operator": {"replicas": 1}}
CHANGED_CILIUM_VALUES = {"operator": {"replicas": 1, "podLabels": {"engine-test": "changed"}}}


@dataclass
class Deployment:
    first: EngineUp
    first_seconds: float
    after_first: dict  # snapshot() right after the first up
    changed: EngineUp
    changed_seconds: float
    after_change: dict  # as after_first, right after the values change
    pooled: EngineUp
    pool_objects: dict  # {kind: the object the API server holds}
    blocked: EngineUp
    after_blocked: dict  # drain_state(), and the protected pod ("pods before") as it was before that up
    unblocked: EngineUp
    after_unblocked: dict
    removed: EngineUp
    nodes_after_removal: list[str]
    unhealthy: EngineUp
    cluster: EngineCluster
    project: PulumiProject


def stack_config(cluster: EngineCluster, secrets_file, cilium_values: dict, nodes=NODES, health=HEALTH,
                 talos=TALOS, pool=False) -> dict:
    config = engine_stack(cluster, nodes, talos, secrets_file, health=health)
    config.update(cluster.kubernetes.stack_settings())
    config["cilium"]["values"] = cilium_values
    config["ccm"]["replicas"] = 1
    if pool:
        config["cilium"]["loadBalancerAddresses"] = POOL
    config["lifecycle"]["timeoutSeconds"] = DRAIN_TIMEOUT
    return config


def deploy(cluster: EngineCluster, project: PulumiProject, config: dict, render_dir) -> EngineUp:
    """cluster.deploy, failing with the engine's error diagnostics (not the tail of its event stream)."""
    try:
        return cluster.deploy(project, config, render_dir)
    except AssertionError:
        last = project.runs[-1]
        errors = "\n".join(last.diagnostics("error") + [d for d in last.diagnostics("info#err")
                                                         if "Traceback" not in d][:20])
        pytest.fail(f"pulumi {' '.join(last.args)} failed:\n{errors}\n{last.stderr[-2000:]}\n"
                    f"registration errors: {cluster.kubernetes.errors}")


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("addons")
    with engine_cluster(tmp, NODES, TALOS, addons=True, health=HEALTH) as (cluster, project):
        started = time.monotonic()
        first = deploy(cluster, project, stack_config(cluster, tmp / "secrets.yaml", CILIUM_VALUES),
                       tmp / "render-first")
        first_seconds = time.monotonic() - started
        after_first = snapshot(cluster)
        started = time.monotonic()
        changed = deploy(cluster, project, stack_config(cluster, tmp / "secrets.yaml", CHANGED_CILIUM_VALUES),
                         tmp / "render-changed")
        changed_seconds = time.monotonic() - started
        after_change = snapshot(cluster)
        secrets = tmp / "secrets.yaml"
        pooled = deploy(cluster, project, stack_config(cluster, secrets, CHANGED_CILIUM_VALUES, pool=True),
                        tmp / "render-pooled")
        pool_objects = {kind: _get(cluster, path) for kind, path in pool_paths(pooled.config).items()}
        protect_a_pod_on(cluster, "addons-worker-1")
        protected_before = drain_state(cluster)["pods"]
        started = time.monotonic()
        blocked = cluster.deploy(project, stack_config(cluster, secrets, CHANGED_CILIUM_VALUES, talos=UPGRADE, pool=True),
                                 tmp / "render-blocked", fails=True)
        blocked_seconds = time.monotonic() - started
        after_blocked = {**drain_state(cluster), "pods before": protected_before}
        lifted = cluster.kubernetes.kube.request("DELETE", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/app")
        assert lifted.status_code == 200, lifted.text[:300]
        unblocked = deploy(cluster, project, stack_config(cluster, secrets, CHANGED_CILIUM_VALUES, talos=UPGRADE,
                                                          pool=True), tmp / "render-unblocked")
        after_unblocked = drain_state(cluster)
        started = time.monotonic()
        removed = deploy(cluster, project, stack_config(cluster, tmp / "secrets.yaml", CHANGED_CILIUM_VALUES,
                                                         nodes=NODES[:3], talos=UPGRADE, pool=True),
                         tmp / "render-removed")
        removed_seconds = time.monotonic() - started
        nodes_after_removal = node_names(cluster)
        # CoreDNS down to no replicas, then a change the health wait waits again for, with a short timeout.
        scaled = cluster.kubernetes.kube.request("PATCH", "/apis/apps/v1/namespaces/kube-system/deployments/coredns",
                                                 {"spec": {"replicas": 0}})
        assert scaled.status_code == 200, scaled.text[:300]
        started = time.monotonic()
        unhealthy = cluster.deploy(project, stack_config(cluster, tmp / "secrets.yaml", CILIUM_VALUES, nodes=NODES[:3],
                                                         health={"wait": True, "timeoutSeconds": SHORT_TIMEOUT},
                                                         talos=UPGRADE, pool=True),
                                   tmp / "render-unhealthy", fails=True)
        unhealthy_seconds = time.monotonic() - started
        print(f"\nfirst up (with preview) {first_seconds:.1f}s, cilium values changed {changed_seconds:.1f}s, "
              f"drain blocked {blocked_seconds:.1f}s, worker removed {removed_seconds:.1f}s, "
              f"CoreDNS down {unhealthy_seconds:.1f}s")
        yield Deployment(first, first_seconds, after_first, changed, changed_seconds, after_change, pooled,
                         pool_objects, blocked, after_blocked, unblocked, after_unblocked, removed,
                         nodes_after_removal,
                         unhealthy, cluster, project)


def pool_paths(config: dict) -> dict[str, str]:
    name = config["cluster"]["name"]
    return {"CiliumLoadBalancerIPPool": f"/apis/cilium.io/v2/ciliumloadbalancerippools/{name}",
            "CiliumL2AnnouncementPolicy": f"/apis/cilium.io/v2alpha1/ciliuml2announcementpolicies/{name}"}


def protect_a_pod_on(cluster: EngineCluster, node: str) -> None:
    """One pod of a Deployment on `node`, and a PodDisruptionBudget that lets none of its pods go."""
    kube = cluster.kubernetes.kube
    made = kube.request("POST", "/apis/apps/v1/namespaces/default/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "app"},
        "spec": {"replicas": 1, "selector": {"matchLabels": APP},
                 "template": {"metadata": {"labels": APP}, "spec": {
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}}}})
    assert made.status_code == 201, made.text[:300]
    budget = kube.request("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "app"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": APP}}})
    assert budget.status_code == 201, budget.text[:300]
    deadline = time.monotonic() + 60
    while not (protected_pods(cluster) and _get(cluster, "/apis/policy/v1/namespaces/default/poddisruptionbudgets/app")
               .get("status", {}).get("currentHealthy") == 1):
        assert time.monotonic() < deadline, "the protected pod did not run, or its budget did not count it, in 60s"
        time.sleep(0.5)


def protected_pods(cluster: EngineCluster) -> list[dict]:
    pods = _get(cluster, "/api/v1/namespaces/default/pods?labelSelector=engine-test%3Dblocked-drain")["items"]
    return [p for p in pods if p["status"].get("phase") == "Running"]


def drain_state(cluster: EngineCluster) -> dict:
    return {"pods": [(p["metadata"]["uid"], p["spec"]["nodeName"]) for p in protected_pods(cluster)],
            "worker": _get(cluster, "/api/v1/nodes/addons-worker-1"),
            "versions": {name: fake.version_tag for name, fake in cluster.nodes.items()}}


def _get(cluster: EngineCluster, path: str) -> dict:
    response = cluster.kubernetes.kube.request("GET", path)
    assert response.status_code == 200, f"GET {path}: HTTP {response.status_code}: {response.text[:300]}"
    return response.json()


WORKLOADS = {"cilium-agent": "/apis/apps/v1/namespaces/kube-system/daemonsets/cilium",
             "cilium-operator": "/apis/apps/v1/namespaces/kube-system/deployments/cilium-operator",
             "ccm-deployment": "/apis/apps/v1/namespaces/kube-system/deployments/talos-cloud-controller-manager",
             "coredns": "/apis/apps/v1/namespaces/kube-system/deployments/coredns",
             "node-list": "/api/v1/nodes",
             "ccm-pods": "/api/v1/namespaces/kube-system/pods?labelSelector=app.kubernetes.io%2Fname%3D"
                         "talos-cloud-controller-manager"}


def snapshot(cluster: EngineCluster) -> dict:
    """What the API server holds now: the releases' Secrets, the charts' workloads, CoreDNS, the Nodes."""
    releases = cluster.kubernetes.release_secrets
    return {"cilium": releases("cilium"), "ccm": releases("talos-cloud-controller-manager"),
            "nodes": node_names(cluster), **{key: _get(cluster, path) for key, path in WORKLOADS.items()}}


def node_names(cluster: EngineCluster) -> list[str]:
    return sorted(n["metadata"]["name"] for n in _get(cluster, "/api/v1/nodes")["items"])


def test_the_first_up_installs_both_releases_and_waits_for_health(deployment):
    steps = deployment.first.up.steps()
    assert {steps[name] for name in ("cilium", "talos-ccm", "health", "k8s")} == {"create"}, steps
    assert not deployment.cluster.kubernetes.errors
    assert deployment.after_first["cilium"] == {"sh.helm.release.v1.cilium.v1": "deployed"}
    assert deployment.after_first["ccm"] == {"sh.helm.release.v1.talos-cloud-controller-manager.v1": "deployed"}
    assert deployment.after_first["nodes"] == sorted(name for name, _, _ in NODES)
    # What the CLI printed: each node's install progress, and nothing as an error.
    printed = "".join(deployment.first.up.diagnostics("info#err")) + deployment.first.up.stderr
    for name, _, _ in NODES:
        assert f"talos-proxmox: install {name} (" in printed and "configured (v1.13.7)" in printed
    assert not deployment.first.up.diagnostics("error")


def test_the_charts_came_from_the_mirrors(deployment):
    wiring = deployment.cluster.kubernetes
    assert ("GET", "/index.yaml") in wiring.helm_repository.requests
    assert ("GET", "/cilium-1.19.6.tgz") in wiring.helm_repository.requests
    pulled = [path for method, path in wiring.oci_registry.requests if method == "GET"]
    assert any(path.endswith("/manifests/0.5.4") or "/manifests/sha256:" in path for path in pulled), pulled
    assert any("/blobs/sha256:" in path for path in pulled), pulled


def test_the_workloads_the_charts_made_run_on_every_node(deployment):
    seen = deployment.after_first
    agent = seen["cilium-agent"]["status"]
    assert agent["desiredNumberScheduled"] == len(NODES) == agent["numberReady"]
    assert seen["cilium-operator"]["status"].get("availableReplicas") == 1
    assert seen["ccm-deployment"]["status"].get("availableReplicas") == 1
    ccm_nodes = [p["spec"]["nodeName"] for p in seen["ccm-pods"]["items"]]
    assert ccm_nodes and all(node.startswith("addons-cp-") for node in ccm_nodes), ccm_nodes
    assert seen["coredns"]["status"].get("availableReplicas") == 2


def test_every_node_registered_with_its_role(deployment):
    nodes = {n["metadata"]["name"]: n for n in deployment.after_first["node-list"]["items"]}
    assert set(nodes) == {name for name, _, _ in NODES}
    for name, role, _ in NODES:
        labels = nodes[name]["metadata"]["labels"]
        assert ("node-role.kubernetes.io/control-plane" in labels) == (role == "controlplane"), name


def test_a_values_change_upgrades_cilium_in_place(deployment):
    steps = deployment.changed.up.steps()
    assert steps["cilium"] == "update", steps
    assert steps["talos-ccm"] == "same", steps
    assert "replace" not in steps.values(), steps
    assert deployment.after_change["cilium"] == {"sh.helm.release.v1.cilium.v1": "superseded",
                                                 "sh.helm.release.v1.cilium.v2": "deployed"}
    assert deployment.after_change["ccm"] == deployment.after_first["ccm"]
    operator = deployment.after_change["cilium-operator"]
    assert operator["spec"]["template"]["metadata"]["labels"].get("engine-test") == "changed"
    # A new release revision is worth waiting for again.
    assert steps["health"] == "update", steps


def test_the_load_balancer_pool_and_l2_policy_are_accepted_under_cilium_s_crds(deployment):
    steps = deployment.pooled.up.steps()
    assert {steps["cilium-CiliumLoadBalancerIPPool"], steps["cilium-CiliumL2AnnouncementPolicy"]} == {"create"}, steps
    assert steps["cilium"] == "update", steps  # l2announcements on
    assert deployment.cluster.kubernetes.cilium_crds_registered
    pool = deployment.pool_objects["CiliumLoadBalancerIPPool"]
    assert pool["spec"]["blocks"] == [{"cidr": POOL[0]}]
    policy = deployment.pool_objects["CiliumL2AnnouncementPolicy"]
    assert (policy["spec"]["loadBalancerIPs"], policy["spec"]["externalIPs"]) == (True, True)


def test_a_disruption_budget_blocks_the_worker_s_drain_and_the_up_stops_naming_it(deployment):
    up, seen = deployment.blocked, deployment.after_blocked
    assert up.up.returncode != 0 and not up.stopped_in_preview
    assert "node addons-worker-1: not drained after" in up.error, up.error[-3000:]
    assert "(eviction refused by a disruption budget)" in up.error, up.error[-3000:]
    # The control planes were upgraded first; the worker kept its version, its pod, and is not left cordoned.
    assert seen["versions"] == {"addons-cp-1": UPGRADE, "addons-cp-2": UPGRADE, "addons-cp-3": UPGRADE,
                                "addons-worker-1": TALOS}
    assert seen["pods"] == seen["pods before"] and seen["pods"][0][1] == "addons-worker-1"
    assert not seen["worker"]["spec"].get("unschedulable")


def test_once_the_budget_is_gone_the_next_up_drains_the_worker_and_finishes(deployment):
    seen = deployment.after_unblocked
    assert set(seen["versions"].values()) == {UPGRADE}
    # Evicted: the protected pod is a new one (its Deployment's), back on the worker once uncordoned.
    [(uid, node)] = seen["pods"]
    assert uid != deployment.after_blocked["pods before"][0][0] and node == "addons-worker-1"
    assert not seen["worker"]["spec"].get("unschedulable")
    assert not deployment.unblocked.up.diagnostics("error")


def test_a_removed_worker_s_node_object_is_deleted(deployment):
    deleted = deployment.removed.steps("delete")
    assert any(name.startswith("addons-worker-1") for name in deleted), deleted
    assert deployment.nodes_after_removal == ["addons-cp-1", "addons-cp-2", "addons-cp-3"]


def test_the_health_wait_times_out_naming_coredns(deployment):
    up = deployment.unhealthy
    assert up.up.returncode != 0
    assert steps_of(up)["cilium"] == "update"
    assert f"not healthy after {SHORT_TIMEOUT}s (health.timeoutSeconds)" in up.error, up.error[-3000:]
    assert "CoreDNS (kube-system/coredns): 0 of 0 replicas available" in up.error, up.error[-3000:]


def steps_of(up: EngineUp) -> dict[str, str]:
    return up.up.steps()
