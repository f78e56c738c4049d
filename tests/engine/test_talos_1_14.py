"""A running Talos 1.13 cluster moved to Talos 1.14 through the real CLI (the engine tier): one stack
change, `talosVersion: v1.14.0`. The nodes upgrade one at a time, control planes first (each through the
1.13 upgrade API), and only an upgraded node is sent the v1.14 contract's configuration: each Kubernetes
setting in a document of its own (KubeletConfig, KubeClusterConfig, ...), the install as an
UnattendedInstallConfig, and nothing of them left in the v1alpha1 document (Talos refuses both at once).
No VM is touched. Then the bootstrap manifests are synced from the upgraded first control plane: CoreDNS
moves to the version Talos 1.14 renders (Talos applies its manifests only at bootstrap)."""

from __future__ import annotations

import pytest
import yaml

from tests.engine.cluster import engine_cluster, engine_stack

pytestmark = pytest.mark.engine

NODES = [("e2e-cp-1", "controlplane", "127.0.0.82"), ("e2e-cp-2", "controlplane", "127.0.0.83"),
         ("e2e-cp-3", "controlplane", "127.0.0.84"), ("e2e-worker-1", "worker", "127.0.0.85")]
ROLL_ORDER = [name for name, _, _ in NODES]
OLD, NEW = "v1.13.7", "v1.14.0"
KUBERNETES = "1.35.4"  # supported by both lines, so only Talos changes
SKIPPED_MINOR = "1.37.1"  # Talos 1.14 runs it, but not from 1.35
COREDNS = "/apis/apps/v1/namespaces/kube-system/deployments/coredns"


@pytest.fixture(scope="module")
def ups(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-talos-1-14")
    with engine_cluster(tmp, NODES, OLD) as (cluster, project):
        def deploy(name, talos):
            config = engine_stack(cluster, NODES, talos, tmp / "secrets.yaml", kubernetes_version=KUBERNETES)
            return cluster.deploy(project, config, tmp / f"render-{name}")

        def coredns_image():
            deployment = cluster.kubernetes.kube.request("GET", COREDNS).json()
            return deployment["spec"]["template"]["spec"]["containers"][0]["image"]

        first = deploy("first", OLD)
        coredns_images = [coredns_image()]
        pve_before = cluster.pve.vm_events[:]
        upgraded = deploy("upgraded", NEW)
        coredns_images.append(coredns_image())
        refusals = {
            "skipped_minor": cluster.deploy(project, engine_stack(
                cluster, NODES, NEW, tmp / "secrets.yaml", kubernetes_version=SKIPPED_MINOR), tmp / "skip", fails=True),
            "downgrade": cluster.deploy(project, engine_stack(
                cluster, NODES, OLD, tmp / "secrets.yaml", kubernetes_version=KUBERNETES), tmp / "down", fails=True)}
        yield first, upgraded, {name: fake.version_tag for name, fake in cluster.nodes.items()}, \
            pve_before, cluster.pve.vm_events[:], coredns_images, refusals


def _documents(config: bytes) -> dict:
    return {doc.get("kind", "v1alpha1") + (f"/{doc['name']}" if doc.get("name") else ""): doc
            for doc in yaml.safe_load_all(config) if isinstance(doc, dict)}


def test_the_1_13_cluster_ran_the_legacy_form(ups):
    first, _, _, _, _, _, _ = ups
    for name, _, _ in NODES:
        documents = _documents(first.rendered[name])
        assert documents["v1alpha1"]["machine"]["kubelet"]["image"] == f"ghcr.io/siderolabs/kubelet:v{KUBERNETES}"
        assert "KubeletConfig" not in documents and "UnattendedInstallConfig" not in documents, name


def test_each_node_upgrades_then_takes_the_1_14_documents_one_at_a_time(ups):
    first, upgraded, versions, _, _, _, _ = ups
    assert versions == {name: NEW for name in ROLL_ORDER}
    windows = []
    for name in ROLL_ORDER:
        calls = upgraded.new_calls(first, name)
        [upgrade] = [c for c in calls if c.rpc == "LifecycleService/Upgrade"]
        applies = [c for c in calls if c.rpc == "ApplyConfiguration"]
        assert applies and all(c.at > upgrade.at for c in applies), name  # the new form only after the upgrade
        assert applies[-1].request.data == upgraded.rendered[name], name
        windows.append((upgrade.at, applies[-1].at))
    # Control planes first, and a node's upgrade only once the one before it is done.
    assert [start for start, _ in windows] == sorted(start for start, _ in windows)
    assert all(windows[i][0] > windows[i - 1][0] for i in range(1, len(windows)))


@pytest.mark.parametrize("name, role, ip", NODES)
def test_the_1_14_configuration_is_the_multi_document_form(ups, name, role, ip):
    _, upgraded, _, _, _, _, _ = ups
    documents = _documents(upgraded.rendered[name])
    v1alpha1 = documents["v1alpha1"]
    assert set(v1alpha1["machine"]) == {"type", "token", "ca", "certSANs", "features"}
    assert set(v1alpha1["cluster"]) == ({"token", "etcd"} if role == "controlplane" else {"token"})
    assert documents["KubeletConfig"]["image"] == f"ghcr.io/siderolabs/kubelet:v{KUBERNETES}"
    assert documents["KubeClusterConfig"] == {"apiVersion": "v1alpha1", "kind": "KubeClusterConfig",
                                              "clusterName": "dev", "endpoint": "https://127.0.0.100:6443"}
    install = documents["UnattendedInstallConfig"]
    assert install["installer"]["image"].endswith(f":{NEW}")
    assert install["provisioning"]["diskSelector"] == {"match": 'disk.dev_path == "/dev/sda"'}
    assert documents["HostnameConfig"]["hostname"] == name
    # These stacks run without Cilium: Talos's own CNI and kube-proxy, on the control planes that deploy them.
    assert ("KubeFlannelCNIConfig" in documents) is (role == "controlplane")
    assert ("KubeProxyConfig" in documents) is (role == "controlplane")
    if role == "controlplane":
        assert documents["KubeProxyConfig"].get("enabled", True) is True
        assert documents["KubeServiceAccountConfig"]["issuer"]["issuerURL"] == "https://127.0.0.100:6443"
    else:
        assert not {"KubeServiceAccountConfig", "KubeEtcdEncryptionConfig", "KubeAggregatorCAConfig"} & set(documents)
        assert "issuingCA" not in documents["KubeAPIServerCAConfig"]


def test_no_vm_is_touched(ups):
    _, upgraded, _, pve_before, pve_after, _, _ = ups
    assert pve_after == pve_before
    assert not {step for step in upgraded.steps("create") | upgraded.steps("delete")}
    # each VM's one change: its CD-ROM takes the new version's ISO (PVE swaps the medium of a running VM)
    vm_updates = {step["urn"].rsplit("::", 1)[1]: set(step.get("detailedDiff") or {})
                  for step in upgraded.preview.plan["steps"] if step["op"] == "update"
                  and step["urn"].rsplit("::", 1)[1] in ROLL_ORDER}
    assert vm_updates == {name: {"cdrom.fileId"} for name in ROLL_ORDER}


def test_coredns_moves_to_the_version_the_new_talos_renders(ups):
    _, upgraded, _, _, _, coredns_images, _ = ups
    assert coredns_images == ["registry.k8s.io/coredns/coredns:v1.14.6", "registry.k8s.io/coredns/coredns:v1.14.7"]
    assert upgraded.steps("update") >= {"kubernetes-upgrade"}
    printed = "".join(upgraded.up.diagnostics("info#err")) + upgraded.up.stderr
    assert "talos-proxmox: manifests: Configured Deployment kube-system/coredns" in printed
    # kube-proxy, made by the bootstrap, is adopted by the first sync: the inventory's annotation and nothing else
    synced = [line.split("manifests: ", 1)[1] for line in printed.splitlines() if "talos-proxmox: manifests: " in line]
    proxy = synced.index("Configured DaemonSet kube-system/kube-proxy")
    assert synced[proxy + 1] == '  +metadata.annotations.config.k8s.io/owning-inventory: "talos-bootstrap-manifests-inventory"'
    assert not any(line.startswith("  ") for line in synced[proxy + 2:proxy + 3]), synced
    # no Kubernetes component was touched: the version stayed
    assert "talos-proxmox: kubernetes" not in printed


REFUSALS = [
    ("skipped_minor", [f"cluster.kubernetesVersion {KUBERNETES} -> {SKIPPED_MINOR} skips a minor version",
                       "upgrade to the newest 1.36.x first"]),
    ("downgrade", [f"cluster.talosVersion {NEW} -> {OLD} is a downgrade",
                   "set cluster.allowDowngrade: true for this up"]),
]


@pytest.mark.parametrize("name, reasons", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_an_unsupported_path_is_refused_in_the_preview_before_any_call(ups, name, reasons):
    _, upgraded, _, _, _, _, refusals = ups
    refused = refusals[name]
    assert refused.stopped_in_preview
    for reason in reasons:
        assert reason in refused.error
    assert refused.pve_requests == upgraded.pve_requests
    for node in ROLL_ORDER:
        assert refused.new_calls(upgraded, node) == [], node
