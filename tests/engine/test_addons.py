"""Cilium, the Talos CCM and the health wait for real: the engine tier against a real Kubernetes control plane.

The real Pulumi CLI with the real Kubernetes provider plugin (pulumi-resource-kubernetes 4.32.0, Helm
3.20 inside) and the real Proxmox provider plugin deploys three control planes and a worker with Cilium
and the CCM on and the health wait on. Behind the Talos stand-ins (tests/engine/cluster.py,
`kubernetes=True`): etcd, kube-apiserver, the controller manager and the scheduler for real, kwok as the
kubelets, under the stack's own Kubernetes CA; the charts come from mirrors the test serves over HTTPS
with CAs of its own: Cilium's from a Helm repository (`cilium.repository`, `cilium.caFile`), the CCM's
from an OCI registry (`ccm.chart: oci://...`). What is asserted is what the API server holds: Helm's
release Secrets, the workloads the charts made, the Node objects, and the CLI's own output.

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
TALOS = "v1.13.7"
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
    removed: EngineUp
    nodes_after_removal: list[str]
    unhealthy: EngineUp
    cluster: EngineCluster
    project: PulumiProject


def stack_config(cluster: EngineCluster, secrets_file, cilium_values: dict, nodes=NODES, health=HEALTH) -> dict:
    config = engine_stack(cluster, nodes, TALOS, secrets_file, health=health)
    config.update(cluster.kubernetes.stack_settings())
    config["cilium"]["values"] = cilium_values
    config["ccm"]["replicas"] = 1
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
    with engine_cluster(tmp, NODES, TALOS, kubernetes=True, health=HEALTH) as (cluster, project):
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
        started = time.monotonic()
        removed = deploy(cluster, project, stack_config(cluster, tmp / "secrets.yaml", CHANGED_CILIUM_VALUES,
                                                         nodes=NODES[:3]), tmp / "render-removed")
        removed_seconds = time.monotonic() - started
        nodes_after_removal = node_names(cluster)
        # CoreDNS down to no replicas, then a change the health wait waits again for, with a short timeout.
        scaled = cluster.kubernetes.kube.request("PATCH", "/apis/apps/v1/namespaces/kube-system/deployments/coredns",
                                                 {"spec": {"replicas": 0}})
        assert scaled.status_code == 200, scaled.text[:300]
        started = time.monotonic()
        unhealthy = cluster.deploy(project, stack_config(cluster, tmp / "secrets.yaml", CILIUM_VALUES, nodes=NODES[:3],
                                                         health={"wait": True, "timeoutSeconds": SHORT_TIMEOUT}),
                                   tmp / "render-unhealthy", fails=True)
        unhealthy_seconds = time.monotonic() - started
        print(f"\nfirst up (with preview) {first_seconds:.1f}s, cilium values changed {changed_seconds:.1f}s, "
              f"worker removed {removed_seconds:.1f}s, CoreDNS down {unhealthy_seconds:.1f}s")
        yield Deployment(first, first_seconds, after_first, changed, changed_seconds, after_change, removed,
                         nodes_after_removal,
                         unhealthy, cluster, project)


def release_secrets(cluster: EngineCluster, release: str) -> dict[str, str]:
    """{secret name: status label} of Helm's revisions of `release` in kube-system."""
    found = _get(cluster, f"/api/v1/namespaces/kube-system/secrets?labelSelector=owner%3Dhelm,name%3D{release}")
    return {s["metadata"]["name"]: s["metadata"]["labels"]["status"] for s in found["items"]}


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
    return {"cilium": release_secrets(cluster, "cilium"), "ccm": release_secrets(cluster, "talos-cloud-controller-manager"),
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
