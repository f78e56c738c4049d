"""talos_proxmox.day_two.bootstrap_manifests against the real API server (tests/stand_ins/kubernetes_cluster.py):
Talos's bootstrap manifests synced as talosctl upgrade-k8s syncs them, and what the server holds after each
sync: objects created, changed (CoreDNS to a new image, rolled out by the real controllers and kwok) and
pruned, the inventory ConfigMap, the owner annotation and field manager, an object of another inventory
refused, a Secret's data never shown."""

from __future__ import annotations

import pytest

from talos_proxmox.day_two import bootstrap_manifests as bm
from talos_proxmox.day_two.cluster_health import KubeApi, read_kubeconfig
from tests.stand_ins.test_kubernetes_cluster import bundle, cluster, get, node  # noqa: F401 - fixtures
from tests.support.day_two import FAST

pytestmark = pytest.mark.engine

COREDNS_PATH = "/apis/apps/v1/namespaces/kube-system/deployments/coredns"


def coredns(image: str) -> dict:
    labels = {"k8s-app": "kube-dns"}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "coredns", "image": image}]}}}}


def token_secret(token: str) -> dict:
    return {"apiVersion": "v1", "kind": "Secret", "type": "bootstrap.kubernetes.io/token",
            "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"},
            "stringData": {"token-id": "abcdef", "token-secret": token}}


def binding(name: str) -> dict:
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:node-bootstrapper"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}]}


@pytest.fixture(scope="module")
def kube(cluster, node) -> KubeApi:  # node: CoreDNS's pod needs somewhere to run
    return KubeApi(read_kubeconfig(cluster.admin_kubeconfig))


def test_sync_creates_changes_and_prunes_and_keeps_the_inventory(cluster, kube):
    first = bm.sync(kube, [coredns("registry.k8s.io/coredns/coredns:v1.14.6"), token_secret("0123456789abcdef"),
                           binding("system-bootstrap-node-bootstrapper"), binding("old-binding")])
    # ConfigMaps and Secrets go before the rest, in the manifests' order otherwise
    assert first.lines == ["Created Secret kube-system/bootstrap-token-abcdef",
                           "Created Deployment kube-system/coredns",
                           "Created ClusterRoleBinding system-bootstrap-node-bootstrapper",
                           "Created ClusterRoleBinding old-binding"]
    bm.wait_rolled_out(kube, first.changed, timeout=60, backoff=FAST, on_progress=lambda line: None)

    second = bm.sync(kube, [coredns("registry.k8s.io/coredns/coredns:v1.14.7"), token_secret("fedcba9876543210"),
                            binding("system-bootstrap-node-bootstrapper")])
    assert second.lines == [
        "Configured Secret kube-system/bootstrap-token-abcdef", "  (a Secret's data is not shown)",
        "Configured Deployment kube-system/coredns",
        '  -spec.template.spec.containers[0].image: "registry.k8s.io/coredns/coredns:v1.14.6"',
        '  +spec.template.spec.containers[0].image: "registry.k8s.io/coredns/coredns:v1.14.7"',
        "Unchanged ClusterRoleBinding system-bootstrap-node-bootstrapper",
        "Pruned ClusterRoleBinding old-binding"]
    assert "fedcba9876543210" not in "\n".join(second.lines) and "0123456789abcdef" not in "\n".join(second.lines)
    progress = []
    bm.wait_rolled_out(kube, second.changed, timeout=60, backoff=FAST, on_progress=progress.append)

    deployment = get(cluster, COREDNS_PATH)
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.k8s.io/coredns/coredns:v1.14.7"
    assert deployment["status"]["updatedReplicas"] == deployment["status"]["availableReplicas"] == 1
    assert deployment["metadata"]["annotations"][bm.OWNING_INVENTORY] == bm.INVENTORY_NAME
    assert {entry["manager"] for entry in deployment["metadata"]["managedFields"]
            if entry["operation"] == "Apply"} == {"talos"}
    assert cluster.request("GET", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/old-binding").status_code == 404
    inventory = get(cluster, f"/api/v1/namespaces/kube-system/configmaps/{bm.INVENTORY_NAME}")
    assert sorted(inventory["data"]) == ["_system-bootstrap-node-bootstrapper_rbac.authorization.k8s.io_ClusterRoleBinding",
                                         "kube-system_bootstrap-token-abcdef__Secret",
                                         "kube-system_coredns_apps_Deployment"]


def test_an_object_of_another_inventory_is_refused_and_left_alone(cluster, kube):
    theirs = binding("someone-elses")
    theirs["metadata"]["annotations"] = {bm.OWNING_INVENTORY: "flux-system"}
    assert cluster.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", theirs).status_code == 201
    with pytest.raises(bm.ManifestSyncError, match="ClusterRoleBinding someone-elses belongs to the inventory "
                                                   "'flux-system'"):
        bm.sync(kube, [binding("someone-elses")])
    kept = get(cluster, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/someone-elses")
    assert kept["metadata"]["annotations"][bm.OWNING_INVENTORY] == "flux-system"


def test_a_rollout_that_does_not_finish_is_named():
    class Stuck:
        def get(self, path):
            if path == "/apis/apps/v1":
                return {"resources": [{"name": "deployments", "kind": "Deployment", "namespaced": True}]}
            return {**coredns("x:1"), "metadata": {"name": "coredns", "namespace": "kube-system", "generation": 2},
                    "status": {"observedGeneration": 2, "updatedReplicas": 0, "availableReplicas": 1}}

    with pytest.raises(bm.ManifestSyncError, match=r"not rolled out after 0.3s: Deployment kube-system/coredns: "
                                                   r"0 of 1 updated, 1 available"):
        bm.wait_rolled_out(Stuck(), [coredns("x:1")], timeout=0.3, backoff=FAST, on_progress=lambda line: None)
