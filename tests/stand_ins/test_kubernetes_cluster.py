"""The engine tier's real Kubernetes control plane (tests/stand_ins/kubernetes_cluster.py) under a stack's own CA.

A secrets bundle from the project's generator gives the Kubernetes CA and service-account key; etcd,
kube-apiserver, kube-controller-manager and kube-scheduler run for real, kwok plays the kubelets. What a
Talos upgrade's drain relies on is checked against Kubernetes' own code: nodes go Ready, a Deployment's
pods are scheduled and become available, the disruption controller's budget decides evictions (429 or
201), and a kubeconfig under the bundle's CA verifies the server.
"""

from __future__ import annotations

import socket
import ssl
import time
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import pytest
import requests
import yaml

from talos_proxmox.talos_config import pki, secrets_bundle
from tests.stand_ins.kubernetes_cluster import KubeCluster, kube_cluster, missing_binaries

pytestmark = pytest.mark.engine

TALOS_VERSION = "v1.13.9"
KUBERNETES_VERSION = "v1.36.2"  # scripts/tool-versions.env
NODE = "worker-1"
WAIT = 60.0  # seconds for a controller or kwok to act, on a loaded machine


def wait_for(what: str, probe: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Poll `probe` until it returns something true; fail naming `what` and the last value seen."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} after {timeout:.0f}s")
        time.sleep(0.2)


def get(cluster: KubeCluster, path: str) -> dict:
    response = cluster.request("GET", path)
    assert response.status_code == 200, f"GET {path}: HTTP {response.status_code}: {response.text[:300]}"
    return response.json()


def condition(obj: dict, kind: str) -> str | None:
    return next((c["status"] for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


@pytest.fixture(scope="module")
def bundle() -> dict:
    return secrets_bundle.generate_secrets(TALOS_VERSION)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, bundle) -> Iterator[KubeCluster]:
    missing = missing_binaries()
    if missing:
        pytest.fail(f"the engine tier needs {', '.join(missing)} in .tools/bin: run `bash scripts/tools.sh`")
    ca_cert, ca_key = secrets_bundle.ca_pair(bundle, "k8s")
    sa_key = pki.pem_from_b64(bundle["certs"]["k8sserviceaccount"]["key"])
    with kube_cluster(tmp_path_factory.mktemp("kube"), ca_cert, ca_key, service_account_key_pem=sa_key) as running:
        yield running


@pytest.fixture(scope="module")
def node(cluster) -> dict:
    cluster.add_node(NODE, {"node-role.kubernetes.io/worker": ""})
    return wait_for(f"Ready node {NODE}", lambda: (
        n if condition(n := get(cluster, f"/api/v1/nodes/{NODE}"), "Ready") == "True" else None))


def deploy(cluster: KubeCluster, name: str, replicas: int) -> list[dict]:
    """A Deployment of `replicas` pods labelled app=`name`, waited until available; its pods."""
    response = cluster.request("POST", "/apis/apps/v1/namespaces/default/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]}}}})
    assert response.status_code == 201, response.text[:300]
    path = f"/apis/apps/v1/namespaces/default/deployments/{name}"
    wait_for(f"{replicas} available replicas of {name}",
             lambda: get(cluster, path).get("status", {}).get("availableReplicas") == replicas)
    return get(cluster, f"/api/v1/namespaces/default/pods?labelSelector=app%3D{name}")["items"]


def test_a_node_added_becomes_ready(cluster, node):
    assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("kwok-")
    # kwok renews the node's heartbeat lease, as a kubelet does (under kwok's own holder identity).
    path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
    wait_for(f"a renewed lease of {NODE}", lambda: (
        (response := cluster.request("GET", path)).status_code == 200 and response.json()["spec"].get("renewTime")))


def test_a_deployment_of_two_becomes_available_on_the_node(cluster, node):
    pods = deploy(cluster, "web", 2)
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"] == NODE  # bound by the real scheduler
        assert pod["status"]["phase"] == "Running"
        assert condition(pod, "Ready") == "True"
    assert get(cluster, "/version")["gitVersion"] == KUBERNETES_VERSION


def evict(cluster: KubeCluster, pod: str) -> requests.Response:
    return cluster.request("POST", f"/api/v1/namespaces/default/pods/{pod}/eviction", {
        "apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": "default"}})


def budget_synced(cluster: KubeCluster, name: str, allowed: int) -> Callable[[], bool]:
    """The disruption controller has seen the budget's current spec and allows `allowed` disruptions."""
    def probe() -> bool:
        pdb = get(cluster, f"/apis/policy/v1/namespaces/default/poddisruptionbudgets/{name}")
        status = pdb.get("status", {})
        return (status.get("observedGeneration") == pdb["metadata"]["generation"]
                and status.get("disruptionsAllowed") == allowed)
    return probe


def test_a_disruption_budget_decides_evictions(cluster, node):
    pods = deploy(cluster, "guarded", 2)
    response = cluster.request("POST", "/apis/policy/v1/namespaces/default/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "guarded"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "guarded"}}}})
    assert response.status_code == 201, response.text[:300]
    wait_for("disruption status of guarded (minAvailable 2)", budget_synced(cluster, "guarded", 0))
    victim = pods[0]["metadata"]["name"]

    blocked = evict(cluster, victim)
    assert blocked.status_code == 429, blocked.text[:300]
    assert "disruption budget guarded" in blocked.text
    assert get(cluster, f"/api/v1/namespaces/default/pods/{victim}")["metadata"].get("deletionTimestamp") is None

    response = cluster.request("PATCH", "/apis/policy/v1/namespaces/default/poddisruptionbudgets/guarded",
                               {"spec": {"minAvailable": 1}})
    assert response.status_code == 200, response.text[:300]
    wait_for("disruption status of guarded (minAvailable 1)", budget_synced(cluster, "guarded", 1))

    allowed = evict(cluster, victim)
    assert allowed.status_code == 201, allowed.text[:300]
    # No kubelet: kwok finishes the deletion the eviction started.
    wait_for(f"{victim} gone", lambda: cluster.request("GET", f"/api/v1/namespaces/default/pods/{victim}")
             .status_code == 404)


def server_certificate(kubeconfig: dict, cafile: Path) -> bytes:
    """The server's certificate (PEM) from a TLS handshake that trusts only `cafile` and checks the host."""
    server = urlsplit(kubeconfig["clusters"][0]["cluster"]["server"])
    context = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection((server.hostname, server.port), timeout=10) as raw:
        with context.wrap_socket(raw, server_hostname=server.hostname) as tls:
            return ssl.DER_cert_to_PEM_cert(tls.getpeercert(binary_form=True)).encode()


def test_the_kubeconfig_verifies_the_server_against_the_given_ca(cluster, bundle, tmp_path):
    ca_cert, _ = secrets_bundle.ca_pair(bundle, "k8s")
    kubeconfig = yaml.safe_load(cluster.admin_kubeconfig)
    ca_data = pki.pem_from_b64(kubeconfig["clusters"][0]["cluster"]["certificate-authority-data"])
    assert ca_data == ca_cert
    cafile = tmp_path / "ca.crt"
    cafile.write_bytes(ca_data)
    pki.verify_issued_by(server_certificate(kubeconfig, cafile), ca_cert)

    other_ca, _ = secrets_bundle.ca_pair(secrets_bundle.generate_secrets(TALOS_VERSION), "k8s")
    (tmp_path / "other.crt").write_bytes(other_ca)
    with pytest.raises(ssl.SSLCertVerificationError):
        server_certificate(kubeconfig, tmp_path / "other.crt")

    # Its client certificate is the tests' own: CN engine-test in system:masters (not the program's CN=admin,
    # whose changes the audit log keeps), issued by the same CA.
    user = kubeconfig["users"][0]["user"]
    cert, key = pki.pem_from_b64(user["client-certificate-data"]), pki.pem_from_b64(user["client-key-data"])
    pki.verify_issued_by(cert, ca_cert)
    subject = pki.load_cert(cert).subject.rfc4514_string()
    assert subject in ("CN=engine-test,O=system:masters", "O=system:masters,CN=engine-test")
    (tmp_path / "admin.crt").write_bytes(cert)
    (tmp_path / "admin.key").write_bytes(key)
    response = requests.get(kubeconfig["clusters"][0]["cluster"]["server"] + "/api/v1/nodes", verify=str(cafile),
                            cert=(str(tmp_path / "admin.crt"), str(tmp_path / "admin.key")), timeout=10)
    assert response.status_code == 200
