"""A running Talos 1.13 cluster moved to Talos 1.14 through the real CLI (the engine tier): one stack
change, `talosVersion: v1.14.0`. The nodes upgrade one at a time, control planes first (each through the
1.13 upgrade API), and only an upgraded node is sent the v1.14 contract's configuration: each Kubernetes
setting in a document of its own (KubeletConfig, KubeClusterConfig, ...), the install as an
UnattendedInstallConfig, and nothing of them left in the v1alpha1 document (Talos refuses both at once).
No VM is touched."""

from __future__ import annotations

import pytest
import yaml

from tests.engine.cluster import engine_cluster, engine_stack

pytestmark = pytest.mark.engine

NODES = [("e2e-cp-1", "controlplane", "127.0.0.82"), ("e2e-cp-2", "controlplane", "127.0.0.83"),
         ("e2e-cp-3", "controlplane", "127.0.0.84"), ("e2e-worker-1", "worker", "127.0.0.85")]
ROLL_ORDER = [name for name, _, _ in NODES]
OLD, NEW = "v1.13.7", "v1.14.0"
KUBERNETES = "1.36.2"  # supported by both lines, so only Talos changes


@pytest.fixture(scope="module")
def ups(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("engine-talos-1-14")
    with engine_cluster(tmp, NODES, OLD) as (cluster, project):
        def deploy(name, talos):
            config = engine_stack(cluster, NODES, talos, tmp / "secrets.yaml", kubernetes_version=KUBERNETES)
            return cluster.deploy(project, config, tmp / f"render-{name}")

        first = deploy("first", OLD)
        pve_before = cluster.pve.vm_events[:]
        upgraded = deploy("upgraded", NEW)
        yield first, upgraded, {name: fake.version_tag for name, fake in cluster.nodes.items()}, \
            pve_before, cluster.pve.vm_events[:]


def _documents(config: bytes) -> dict:
    return {doc.get("kind", "v1alpha1") + (f"/{doc['name']}" if doc.get("name") else ""): doc
            for doc in yaml.safe_load_all(config) if isinstance(doc, dict)}


def test_the_1_13_cluster_ran_the_legacy_form(ups):
    first, _, _, _, _ = ups
    for name, _, _ in NODES:
        documents = _documents(first.rendered[name])
        assert documents["v1alpha1"]["machine"]["kubelet"]["image"] == f"ghcr.io/siderolabs/kubelet:v{KUBERNETES}"
        assert "KubeletConfig" not in documents and "UnattendedInstallConfig" not in documents, name


def test_each_node_upgrades_then_takes_the_1_14_documents_one_at_a_time(ups):
    first, upgraded, versions, _, _ = ups
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
    _, upgraded, _, _, _ = ups
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
    _, upgraded, _, pve_before, pve_after = ups
    assert pve_after == pve_before
    assert not {step for step in upgraded.steps("create") | upgraded.steps("delete")}
    # each VM's one change: its CD-ROM takes the new version's ISO (PVE swaps the medium of a running VM)
    vm_updates = {step["urn"].rsplit("::", 1)[1]: set(step.get("detailedDiff") or {})
                  for step in upgraded.preview.plan["steps"] if step["op"] == "update"
                  and step["urn"].rsplit("::", 1)[1] in ROLL_ORDER}
    assert vm_updates == {name: {"cdrom.fileId"} for name in ROLL_ORDER}
