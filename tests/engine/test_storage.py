"""The Proxmox CSI plugin for real: the real CLI, the real Proxmox and Kubernetes provider plugins, the real
chart (proxmox-csi-plugin 0.5.9 from ../shared/charts, pulled from the test's OCI registry), the PVE
stand-in keeping roles, users, tokens and ACL entries as PVE does, and a real API server.

A control plane on Proxmox host `pve` and a worker on `pve2`, Cilium and the Talos CCM on, `csi` on with
two StorageClasses. The first up makes the plugin's role, user, ACL entry and token on PVE (asserted on
what PVE stored, and on what the new token may do there), its Secret, namespace, release and classes in
the API server, and the Talos CCM's node transformations, which the played CCM turns into each node's
region and zone labels (read back from the Nodes). Then a PersistentVolume of the plugin's (a volume
that holds data) is made; the labels are switched to the Proxmox CCM (its own identity and release, the
plugin's untouched); and `csi` is removed: everything the program made goes, in PVE and in the API
server, and the volume stays.
"""

from __future__ import annotations

import base64

import pytest
import requests
import yaml

from talos_proxmox.cluster_plan.storage_values import CSI_PRIVILEGES
from tests.engine.cluster import EngineCluster, engine_cluster, engine_stack
from tests.engine.test_addons import _get, deploy

pytestmark = pytest.mark.engine

NODES = [("storage-cp-1", "controlplane", "127.0.0.112"), ("storage-worker-1", "worker", "127.0.0.113")]
HOSTS = {"storage-cp-1": "pve", "storage-worker-1": "pve2"}
TALOS = "v1.13.7"
REGION = "engine-pve"
USER, ROLE, TOKEN = "dev-csi@pve", "k8s-dev-csi", "dev-csi@pve!kubernetes"
CLASSES = [{"name": "proxmox-data", "datastore": "local-lvm", "default": True, "ssd": True},
           {"name": "proxmox-xfs", "datastore": "local-lvm", "fsType": "xfs", "reclaimPolicy": "Retain"}]
VOLUME = "pvc-engine-kept"


def stack_config(cluster: EngineCluster, secrets_file, csi: bool, labels: str = "talos-ccm") -> dict:
    config = engine_stack(cluster, NODES, TALOS, secrets_file)
    config.update(cluster.kubernetes.stack_settings())
    config["cilium"]["values"] = {"operator": {"replicas": 1}}
    config["ccm"]["replicas"] = 1
    for node in config["nodes"]:
        node["proxmoxNode"] = HOSTS[node["name"]]
    if csi:
        config["csi"] = cluster.kubernetes.csi_settings(region=REGION, storageClasses=CLASSES, topologyLabels=labels)
    if labels == "proxmox-ccm":
        config["ccm"]["controllers"] = ["node-csr-approval"]  # the Proxmox CCM initializes the nodes
    return config


def pve_access(cluster: EngineCluster) -> dict:
    pve = cluster.pve
    return {"roles": {k: sorted(v) for k, v in pve.roles.items()}, "users": sorted(pve.pve_users),
            "tokens": dict(pve.user_tokens), "acl": list(pve.acl_entries)}


@pytest.fixture(scope="module")
def storage(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("storage")
    with engine_cluster(tmp, NODES, TALOS, addons=True) as (cluster, project):
        for host in set(HOSTS.values()):
            cluster.pve.add_node(host)  # the Proxmox cluster's members
        first = deploy(cluster, project, stack_config(cluster, tmp / "secrets.yaml", csi=True), tmp / "render-first")
        pve = cluster.pve
        made = {
            "pve": pve_access(cluster),
            "token secret": pve.apitokens.get(TOKEN),
            "token may": requests.get(f"{pve.url}/api2/json/access/permissions", params={"path": "/"},
                                      verify=pve.cafile,
                                      headers={"Authorization": f"PVEAPIToken={TOKEN}={pve.apitokens.get(TOKEN)}"}),
            "namespace": _get(cluster, "/api/v1/namespaces/csi-proxmox"),
            "secret": _get(cluster, "/api/v1/namespaces/csi-proxmox/secrets/proxmox-csi-plugin-config"),
            "release": _get(cluster, "/api/v1/namespaces/csi-proxmox/secrets?labelSelector=owner%3Dhelm"),
            "classes": _get(cluster, "/apis/storage.k8s.io/v1/storageclasses"),
            "controller": _get(cluster, "/apis/apps/v1/namespaces/csi-proxmox/deployments/"
                                        "proxmox-csi-plugin-controller"),
            "node plugin": _get(cluster, "/apis/apps/v1/namespaces/csi-proxmox/daemonsets/proxmox-csi-plugin-node"),
            "nodes": {n["metadata"]["name"]: n["metadata"].get("labels", {})
                      for n in _get(cluster, "/api/v1/nodes")["items"]},
            "played": (list(cluster.kubernetes.errors), list(cluster.kubernetes.initialized_by_ccm)),
            "ccm config": _get(cluster, "/api/v1/namespaces/kube-system/configmaps/talos-cloud-controller-manager"),
        }
        kept = cluster.kubernetes.kube.request("POST", "/api/v1/persistentvolumes", {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": VOLUME},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "proxmox-xfs",
                     "csi": {"driver": "csi.proxmox.sinextra.dev",
                             "volumeHandle": f"{REGION}/pve2/local-lvm/vm-9999-{VOLUME}", "fsType": "xfs"}}})
        assert kept.status_code == 201, kept.text[:300]
        switched = deploy(cluster, project, stack_config(cluster, tmp / "secrets.yaml", csi=True, labels="proxmox-ccm"),
                          tmp / "render-switched")
        with_proxmox_ccm = {
            "pve": pve_access(cluster),
            "release": _get(cluster, "/api/v1/namespaces/kube-system/secrets?labelSelector=owner%3Dhelm,name%3D"
                                     "proxmox-cloud-controller-manager"),
            "deployment": _get(cluster, "/apis/apps/v1/namespaces/kube-system/deployments/"
                                        "proxmox-cloud-controller-manager"),
            "secret": _get(cluster, "/api/v1/namespaces/kube-system/secrets/proxmox-cloud-controller-manager-config"),
            "ccm config": _get(cluster, "/api/v1/namespaces/kube-system/configmaps/talos-cloud-controller-manager"),
        }
        removed = deploy(cluster, project, stack_config(cluster, tmp / "secrets.yaml", csi=False),
                         tmp / "render-removed")
        after = {
            "pve": pve_access(cluster),
            "namespace": cluster.kubernetes.kube.request("GET", "/api/v1/namespaces/csi-proxmox"),
            "classes": _get(cluster, "/apis/storage.k8s.io/v1/storageclasses"),
            "volume": cluster.kubernetes.kube.request("GET", f"/api/v1/persistentvolumes/{VOLUME}"),
        }
        yield {"first": first, "made": made, "switched": switched, "with proxmox ccm": with_proxmox_ccm,
               "removed": removed, "after": after, "cluster": cluster}


def test_pve_stores_the_plugin_s_role_user_acl_and_token_and_the_token_may_only_what_the_plugin_needs(storage):
    pve = storage["made"]["pve"]
    assert pve["roles"] == {ROLE: sorted(CSI_PRIVILEGES)}
    assert pve["users"] == [USER]
    assert pve["acl"] == [{"path": "/", "roleid": ROLE, "type": "user", "ugid": USER, "propagate": 1}]
    assert list(pve["tokens"]) == [TOKEN] and pve["tokens"][TOKEN]["privsep"] == 0
    may = storage["made"]["token may"]
    assert may.status_code == 200, may.text
    assert may.json()["data"] == {"/": dict.fromkeys(sorted(CSI_PRIVILEGES), 1)}
    steps = storage["first"].up.steps()
    assert {steps[name] for name in ("csi-role", "csi-user", "csi-acl", "csi-token", "proxmox-csi")} == {"create"}


def test_the_token_is_only_in_the_plugin_s_secret_never_in_the_cli_s_output_or_the_plain_state(storage):
    secret = storage["made"]["secret"]
    config = yaml.safe_load(base64.b64decode(secret["data"]["config.yaml"]))
    cluster = storage["cluster"]
    assert config == {"clusters": [{"url": cluster.pve.url + "/api2/json", "insecure": True, "token_id": TOKEN,
                                    "token_secret": storage["made"]["token secret"], "region": REGION}]}
    token_secret = storage["made"]["token secret"]
    first = storage["first"]
    assert token_secret not in first.up.stdout + first.up.stderr + first.preview.stdout
    assert token_secret not in repr(first.state), "the token's secret is in the state export in plain text"


def test_the_api_server_holds_the_release_the_classes_and_the_workloads_on_the_right_nodes(storage):
    made = storage["made"]
    assert made["namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    assert {s["metadata"]["name"]: s["metadata"]["labels"]["status"] for s in made["release"]["items"]} == {
        "sh.helm.release.v1.proxmox-csi-plugin.v1": "deployed"}
    classes = {c["metadata"]["name"]: c for c in made["classes"]["items"]}
    assert set(classes) == {"proxmox-data", "proxmox-xfs"}
    data, xfs = classes["proxmox-data"], classes["proxmox-xfs"]
    assert (data["provisioner"], data["reclaimPolicy"], data["volumeBindingMode"]) == (
        "csi.proxmox.sinextra.dev", "Delete", "WaitForFirstConsumer")
    assert data["parameters"] == {"csi.storage.k8s.io/fstype": "ext4", "storage": "local-lvm", "ssd": "true"}
    assert data["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert (xfs["reclaimPolicy"], xfs["parameters"]) == ("Retain", {"csi.storage.k8s.io/fstype": "xfs",
                                                                    "storage": "local-lvm"})
    assert "annotations" not in xfs["metadata"] or not xfs["metadata"]["annotations"].get(
        "storageclass.kubernetes.io/is-default-class")
    controller = made["controller"]["spec"]["template"]["spec"]
    assert controller["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    volumes = {v["name"]: v for v in controller["volumes"]}
    assert any(v.get("secret", {}).get("secretName") == "proxmox-csi-plugin-config" for v in volumes.values())
    assert made["node plugin"]["status"]["desiredNumberScheduled"] == len(NODES)  # every node, control plane too


def test_each_node_carries_the_region_and_its_proxmox_host_as_zone(storage):
    errors, initialized = storage["made"]["played"]
    assert errors == [] and sorted(initialized) == sorted(HOSTS), (errors, initialized)
    config = yaml.safe_load(storage["made"]["ccm config"]["data"]["ccm-config.yaml"])
    # The chart writes them beside `global` (talos-cloud-controller-manager's cloudConfig reads them there).
    assert config == {"global": None, "transformations": [
        {"name": f"proxmox-{host}", "nodeSelector": [{"matchExpressions": [
            {"key": "hostname", "operator": "In", "values": [name]}]}],
         "platformMetadata": {"Region": REGION, "Zone": host}} for name, host in HOSTS.items()]}
    nodes = storage["made"]["nodes"]
    for name, host in HOSTS.items():
        labels = nodes[name]
        assert (labels.get("topology.kubernetes.io/region"), labels.get("topology.kubernetes.io/zone")) == (
            REGION, host), name


def test_switching_the_labels_to_the_proxmox_ccm_gives_it_its_own_identity_and_release(storage):
    pve = storage["with proxmox ccm"]["pve"]
    assert pve["roles"] == {ROLE: sorted(CSI_PRIVILEGES), "k8s-dev-ccm": ["Sys.Audit", "VM.Audit", "VM.GuestAgent.Audit"]}
    assert pve["users"] == ["dev-ccm@pve", USER]
    assert sorted(pve["tokens"]) == ["dev-ccm@pve!kubernetes", TOKEN]
    release = storage["with proxmox ccm"]["release"]["items"]
    assert [(s["metadata"]["labels"]["name"], s["metadata"]["labels"]["status"]) for s in release] == [
        ("proxmox-cloud-controller-manager", "deployed")]
    pod = storage["with proxmox ccm"]["deployment"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    config = yaml.safe_load(base64.b64decode(storage["with proxmox ccm"]["secret"]["data"]["config.yaml"]))
    assert config["clusters"][0]["token_id"] == "dev-ccm@pve!kubernetes"
    talos_ccm = yaml.safe_load(storage["with proxmox ccm"]["ccm config"]["data"]["ccm-config.yaml"])
    assert "transformations" not in (talos_ccm or {})  # one source of the labels
    steps = storage["switched"].up.steps()
    assert {steps[name] for name in ("ccm-role", "ccm-user", "ccm-acl", "ccm-token", "proxmox-ccm")} == {"create"}
    assert {steps[name] for name in ("csi-role", "csi-user", "csi-acl", "csi-token", "proxmox-csi")} == {"same"}


def test_removing_csi_removes_what_it_made_and_keeps_the_volume(storage):
    after = storage["after"]
    assert after["pve"] == {"roles": {}, "users": [], "tokens": {}, "acl": []}
    assert storage["cluster"].pve.apitokens.get(TOKEN) is None  # the token no longer logs in
    assert [c["metadata"]["name"] for c in after["classes"]["items"]] == []
    namespace = after["namespace"]
    assert namespace.status_code == 404 or namespace.json()["status"]["phase"] == "Terminating"
    assert after["volume"].status_code == 200, "the volume that holds data was deleted"
    steps = storage["removed"].up.steps()
    assert {steps[name] for name in ("csi-role", "csi-user", "csi-acl", "csi-token", "proxmox-csi",
                                     "csi-config", "csi-namespace", "ccm-role", "ccm-user", "ccm-acl", "ccm-token",
                                     "proxmox-ccm", "ccm-config")} == {"delete"}
