"""The stack settings model: both shipped stacks load with their defaults (bad inputs: test_bad_stacks.py)."""

from pathlib import Path

import pytest

from talos_proxmox.settings.stack import EtcdSnapshots, SettingsError, load_settings, stack_file_config

STACKS = Path(__file__).resolve().parent.parent / "stacks"


def stack(name: str) -> dict:
    return stack_file_config(str(STACKS / f"Pulumi.{name}.yaml"))


def test_test_cluster_stack_matches_the_seed_walkthrough():
    s = load_settings(stack("test-cluster"))
    assert s.cluster.name == "test-cluster"
    assert s.cluster.endpoint == "https://10.255.200.201:6443"
    assert s.cluster.talos_version == "v1.13.7"
    assert s.cluster.kubespan.enabled and s.cluster.kubespan.mtu == 1420
    assert [n.ip for n in s.control_planes] == ["10.255.200.201", "10.255.200.202", "10.255.200.203"]
    assert [n.ip for n in s.workers] == [f"10.255.200.{i}" for i in range(204, 210)]
    for cp in s.control_planes:
        assert (cp.cpu, cp.memory_mib, cp.disk_gb, cp.data_disk) == (1, 2048, 15, None)
    with_disk = [n for n in s.workers if n.data_disk]
    assert len(with_disk) == 3
    for w in with_disk:
        assert (w.cpu, w.memory_mib, w.disk_gb) == (3, 6144, 15)
        assert (w.data_disk.size_gb, w.data_disk.device, w.data_disk.mountpoint) == (30, "/dev/sdb", "/var/lib/longhorn")
        assert w.kernel_modules == ("iscsi_tcp",)
    assert all(w.kernel_modules == () and w.data_disk is None for w in s.workers if not w.data_disk)
    assert {(n.gateway, n.nameservers, n.prefix) for n in s.nodes} == {("10.255.200.1", ("9.9.9.9",), 24)}
    assert s.nodes[0].mac == "bc:24:11:80:a1:9b" and s.nodes[0].address == "10.255.200.201/24"
    assert s.bootstrap_node.name == "master-1"
    assert s.image.schematic["customization"]["extraKernelArgs"] == ["net.ifnames=0"]
    assert s.cilium.enabled and s.cilium.version == "1.19.6"
    assert (s.hubble.enabled, s.hubble.relay, s.hubble.ui, s.hubble.ui_service_type) == (True, True, True, "ClusterIP")
    assert s.ccm.enabled and s.ccm.controllers == ("cloud-node", "node-csr-approval") and s.ccm.replicas == 2
    # The seed's 1-vCPU control planes load, with Talos's minimum named for each.
    assert s.warnings == tuple(
        f"talos-proxmox:nodes[{i}].cpu: 1 vCPU for control plane master-{i + 1} is below Talos's minimum of 2 "
        "for a control plane" for i in range(3))


def test_kubernetes_version_defaults_to_what_talosctl_of_that_line_picks():
    assert load_settings(stack("test-cluster")).cluster.kubernetes_version == "1.36.2"
    raw = stack("dev")
    raw["cluster"]["talosVersion"] = "v1.12.4"
    assert load_settings(raw).cluster.kubernetes_version == "1.35.0"
    raw["cluster"]["kubernetesVersion"] = "1.34.1"
    assert load_settings(raw).cluster.kubernetes_version == "1.34.1"


def test_dev_stack_derives_endpoint_from_vip():
    s = load_settings(stack("dev"))
    assert s.cluster.endpoint == "https://10.10.0.50:6443"
    assert [n.role for n in s.nodes] == ["controlplane", "worker"]
    assert not s.ccm.enabled and not s.cluster.kubespan.enabled


def test_defaults_fill_what_a_minimal_stack_leaves_out():
    s = load_settings({
        "cluster": {"name": "mini"},
        "network": {"subnet": "192.168.5.0/24", "gateway": "192.168.5.1"},
        "proxmox": {"node": "pve"},
        "nodes": [{"name": "cp", "role": "controlplane", "cpu": 2, "memory": 2048, "disk": 10,
                   "ip": "192.168.5.10", "mac": "BC:24:11:00:00:01"}],
    })
    assert s.cluster.endpoint == "https://192.168.5.10:6443"
    assert s.cluster.pod_subnets == ("10.244.0.0/16",) and s.cluster.service_subnets == ("10.96.0.0/12",)
    assert s.cluster.domain == "cluster.local" and s.cluster.install_disk == "/dev/sda"
    assert s.nodes[0].mac == "bc:24:11:00:00:01"  # normalised so duplicates are caught case-blind
    assert s.nodes[0].nameservers == ("9.9.9.9",)
    assert s.image.schematic == {"customization": {}}
    assert s.image.factory_url == "https://factory.talos.dev"
    assert (s.lifecycle.timeout_seconds, s.lifecycle.reset_on_delete) == (1200, True)


def test_node_with_its_own_prefix_and_gateway():
    raw = stack("dev")
    raw["nodes"][1] = dict(raw["nodes"][1], ip="10.20.0.5/16", gateway="10.20.0.1")
    s = load_settings(raw)
    assert s.nodes[1].address == "10.20.0.5/16" and s.nodes[1].gateway == "10.20.0.1"


def test_even_number_of_control_planes_warns_but_loads():
    raw = stack("dev")
    raw["nodes"][1] = dict(raw["nodes"][1], role="controlplane")
    s = load_settings(raw)
    assert s.warnings == (
        "talos-proxmox:nodes: 2 control-plane nodes is an even number; etcd keeps quorum best with an odd "
        "number (1, 3, 5)",)


def test_no_control_plane_is_an_error():
    raw = stack("test-cluster")
    for node in raw["nodes"]:
        node["role"] = "worker"
    with pytest.raises(SettingsError) as err:
        load_settings(raw)
    assert err.value.problems == [
        "talos-proxmox:nodes: '9 nodes, 0 with role controlplane' has no control-plane node (expected at least 1)"]


def test_every_problem_is_reported_at_once():
    raw = stack("test-cluster")
    raw["nodes"][0]["cpu"] = -1
    raw["nodes"][8]["ip"] = "not-an-ip"
    raw["clustr"] = {}
    with pytest.raises(SettingsError) as err:
        load_settings(raw)
    assert len(err.value.problems) == 3
    assert err.value.problems[0].startswith("talos-proxmox:clustr: ")


def test_missing_nodes_is_an_error():
    raw = stack("test-cluster")
    del raw["nodes"]
    with pytest.raises(SettingsError) as err:
        load_settings(raw)
    assert err.value.problems == ["talos-proxmox:nodes: None is not a non-empty list of nodes"]


def test_add_on_defaults_pin_the_ccm_chart_and_wait_for_health():
    s = load_settings(stack("test-cluster"))
    assert s.ccm.version == "0.5.4"
    assert (s.health.wait, s.health.timeout_seconds) == (True, 600)
    raw = stack("test-cluster")
    raw["health"] = {"wait": False, "timeoutSeconds": 120}
    raw["ccm"]["version"] = "0.5.3"
    s = load_settings(raw)
    assert (s.health.wait, s.health.timeout_seconds, s.ccm.version) == (False, 120, "0.5.3")


def test_etcd_snapshots_default_on_and_can_be_turned_off():
    assert load_settings(stack("dev")).lifecycle.etcd_snapshots == EtcdSnapshots("etcd-snapshots", 5)
    raw = stack("dev")
    raw["lifecycle"] = {"etcdSnapshots": {"directory": "/srv/backups", "keep": 2}}
    assert load_settings(raw).lifecycle.etcd_snapshots == EtcdSnapshots("/srv/backups", 2)
    raw["lifecycle"] = {"etcdSnapshots": {"enabled": False}}
    assert load_settings(raw).lifecycle.etcd_snapshots is None


def test_only_a_change_of_a_deployed_cluster_name_is_a_rename():
    from talos_proxmox.settings.stack import cluster_rename_problem

    assert cluster_rename_problem(None, "dev") is None  # first deploy
    assert cluster_rename_problem("dev", "dev") is None
    assert cluster_rename_problem("dev", "prod").startswith(
        "talos-proxmox:cluster.name: 'prod' renames the deployed cluster 'dev'")
