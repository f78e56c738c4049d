"""Objects stored under an API version the next Kubernetes minor removes stop its upgrade in the preview, as
`talosctl upgrade-k8s` checks them (talos_proxmox.day_two.kubernetes_removals), with the real CLI and a real
API server that serves the alpha `scheduling.k8s.io/v1alpha2` (turned on with its feature gate; Kubernetes
1.37 removes it).

A Talos 1.14 cluster at Kubernetes 1.36 holds one Workload of that version. The stack moving to 1.37 is
refused in the preview, naming how many of which resource, before any change to PVE or a node (the check
reads: the admin kubeconfig from the control plane, then the list); once the Workload is gone, the same
preview passes.
"""

from __future__ import annotations

import pytest

from tests.engine.cluster import engine_cluster, engine_stack

pytestmark = pytest.mark.engine

NODES = [("rm-cp-1", "controlplane", "127.0.0.142"), ("rm-worker-1", "worker", "127.0.0.143")]
TALOS, FROM, TO = "v1.14.0", "1.36.3", "1.37.0"
ALPHA_SCHEDULING = ["--runtime-config=scheduling.k8s.io/v1alpha2=true", "--feature-gates=GenericWorkload=true"]
WORKLOADS = "/apis/scheduling.k8s.io/v1alpha2/namespaces/default/workloads"
READS = {"Kubeconfig"}  # what the preview's check may ask a node for


@pytest.fixture(scope="module")
def removals(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("removals")
    with engine_cluster(tmp, NODES, TALOS, apiserver_args=ALPHA_SCHEDULING) as (cluster, project):
        def config(version):
            return engine_stack(cluster, NODES, TALOS, tmp / "secrets.yaml", kubernetes_version=version)

        cluster.deploy(project, config(FROM), tmp / "render-from")
        kube = cluster.kubernetes.kube
        made = kube.request("POST", WORKLOADS, {
            "apiVersion": "scheduling.k8s.io/v1alpha2", "kind": "Workload",
            "metadata": {"name": "training", "namespace": "default"},
            "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"basic": {}}}]}})
        assert made.status_code == 201, made.text
        pve_before = len(cluster.pve.requests)
        calls_before = {name: len(fake.calls) for name, fake in cluster.nodes.items()}
        refused = cluster.deploy(project, config(TO), tmp / "render-refused", fails=True)
        since = {"pve": cluster.pve.requests[pve_before:],
                 "talos": {name: [c.rpc for c in fake.calls[calls_before[name]:]]
                           for name, fake in cluster.nodes.items()}}
        assert kube.request("DELETE", f"{WORKLOADS}/training").status_code == 200
        project.set_config(config(TO))
        passed = project.preview(check=False)
        yield {"refused": refused, "since": since, "passed": passed}


def test_a_stored_workload_of_a_removed_version_refuses_the_minor_upgrade_in_the_preview(removals):
    refused = removals["refused"]
    assert refused.stopped_in_preview
    errors = "".join(refused.preview.diagnostics("error"))
    assert (f"cluster.kubernetesVersion {FROM} -> {TO}: 1 workloads stored as scheduling.k8s.io/v1alpha2, which "
            f"Kubernetes {TO} no longer serves: move them to a served version (or delete them) before this upgrade"
            in errors), errors[-3000:]


def test_the_check_only_read(removals):
    since = removals["since"]
    assert [method for method, _path, _body in since["pve"] if method != "GET"] == []
    assert {rpc for calls in since["talos"].values() for rpc in calls} <= READS, since["talos"]


def test_with_the_workload_gone_the_same_preview_passes(removals):
    passed = removals["passed"]
    assert passed.returncode == 0, "".join(passed.diagnostics("error"))[-2000:]
