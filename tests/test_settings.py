"""The stack settings model: both shipped stacks load, and each bad input gives its exact message."""

import copy
import ipaddress
from pathlib import Path

import pytest

from talos_proxmox.settings.stack import SettingsError, load_settings, stack_file_config

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
    assert s.warnings == ()


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


def _set(raw: dict, path: str, value):
    """Set `a.b[1].c` in a nested config; value None deletes the key."""
    target = raw
    parts = path.replace("]", "").replace("[", ".").split(".")
    for part in parts[:-1]:
        target = target[int(part)] if part.isdigit() else target.setdefault(part, {})
    last = parts[-1]
    if value is None and not last.isdigit():
        target.pop(last, None)
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value


BAD_INPUTS = [
    ("nodes[0].ip", "10.255.200.300",
     "talos-proxmox:nodes[0].ip: '10.255.200.300' is not an IP address or address/prefix (expected e.g. 10.255.200.201)"),
    ("nodes[1].ip", "10.255.201.5",
     "talos-proxmox:nodes[1].ip: '10.255.201.5' is outside network.subnet 10.255.200.0/24"),
    ("nodes[1].ip", "10.255.200.201",
     "talos-proxmox:nodes[1].ip: '10.255.200.201' duplicates nodes[0].ip (expected unique values)"),
    ("nodes[2].name", "master-1",
     "talos-proxmox:nodes[2].name: 'master-1' duplicates nodes[0].name (expected unique values)"),
    ("nodes[3].mac", "BC:24:11:80:A1:9B",
     "talos-proxmox:nodes[3].mac: 'bc:24:11:80:a1:9b' duplicates nodes[0].mac (expected unique values)"),
    ("nodes[3].mac", "bc:24:11:80:a1",
     "talos-proxmox:nodes[3].mac: 'bc:24:11:80:a1' is not a MAC address (expected e.g. bc:24:11:80:a1:9b)"),
    ("nodes[4].role", "master",
     "talos-proxmox:nodes[4].role: 'master' is not a role (expected controlplane or worker)"),
    ("nodes[4].cpu", 0,
     "talos-proxmox:nodes[4].cpu: 0 is not a number of vCPUs (positive integer)"),
    ("nodes[4].mtu", 65536,
     "talos-proxmox:nodes[4].mtu: 65536 is not an MTU in 68-65535"),
    ("nodes[4].mtu", 67,
     "talos-proxmox:nodes[4].mtu: 67 is not an MTU in 68-65535"),
    ("nodes[4].dataDisk", {"size": 30, "mount": "/data"},
     "talos-proxmox:nodes[4].dataDisk.mount: '/data' is not a known key (expected one of: size, device, mountpoint)"),
    ("nodes[5].patches", [{"machine": {}}, "machine: {}"],
     "talos-proxmox:nodes[5].patches[1]: 'machine: {}' is neither a mapping (strategic merge patch) nor a list "
     "of JSON patch operations with 'op' and 'path'"),
    ("nodes[5].patches", [[{"op": "frobnicate", "path": "/machine"}]],
     "talos-proxmox:nodes[5].patches[0]: [{'op': 'frobnicate', 'path': '/machine'}] is neither a mapping "
     "(strategic merge patch) nor a list of JSON patch operations with 'op' and 'path'"),
    ("cluster.patches", {"machine": {}},
     "talos-proxmox:cluster.patches: {'machine': {}} is not a list of patches"),
    ("cluster.rolePatches", {"master": []},
     "talos-proxmox:cluster.rolePatches.master: [] is not a known key (expected one of: controlplane, worker)"),
    ("cluster.endpoint", "10.255.200.201:6443",
     "talos-proxmox:cluster.endpoint: '10.255.200.201:6443' is not an endpoint with scheme, host and port "
     "(expected e.g. https://10.0.0.10:6443)"),
    ("cluster.endpoint", "https://10.255.200.201",
     "talos-proxmox:cluster.endpoint: 'https://10.255.200.201' is not an endpoint with scheme, host and port "
     "(expected e.g. https://10.0.0.10:6443)"),
    ("cluster.vip", "10.255.200.203",
     "talos-proxmox:cluster.vip: '10.255.200.203' equals nodes[2].ip (expected an unused address in the nodes' subnet)"),
    ("cluster.vip", "10.9.9.9",
     "talos-proxmox:cluster.vip: '10.9.9.9' is outside every control-plane node's subnet (a Layer 2 VIP must share it)"),
    ("cluster.kubespan.mtu", 70000,
     "talos-proxmox:cluster.kubespan.mtu: 70000 is not an MTU in 68-65535"),
    ("cluster.podSubnets", ["10.244.0.0/33"],
     "talos-proxmox:cluster.podSubnets: ['10.244.0.0/33'] is not a non-empty list of CIDRs"),
    ("cluster.serviceSubnets", ["10.96.0.1/12"],
     "talos-proxmox:cluster.serviceSubnets: ['10.96.0.1/12'] is not a non-empty list of CIDRs"),
    ("cluster.talosVersion", "latest",
     "talos-proxmox:cluster.talosVersion: 'latest' is not a supported Talos version (expected v1.12.x or v1.13.x, "
     "e.g. v1.13.7)"),
    ("cluster.talosVersion", "v1.11.5",
     "talos-proxmox:cluster.talosVersion: 'v1.11.5' is not a supported Talos version (expected v1.12.x or v1.13.x, "
     "e.g. v1.13.7)"),
    ("cluster.name", "Test_Cluster",
     "talos-proxmox:cluster.name: 'Test_Cluster' is not a cluster name (expected lowercase letters, digits and '-', "
     "at most 63)"),
    ("network.subnet", "10.255.200.0/33",
     "talos-proxmox:network.subnet: '10.255.200.0/33' is not a network in CIDR form (expected e.g. 10.255.200.0/24)"),
    ("network.gateway", "10.0.0.1",
     "talos-proxmox:network.gateway: '10.0.0.1' is outside network.subnet 10.255.200.0/24"),
    ("nodes[1].ip", "10.20.0.5/16",
     "talos-proxmox:nodes[1].gateway: '10.255.200.1' is outside the node's subnet 10.20.0.0/16"),
    ("network.nameservers", ["9.9.9"],
     "talos-proxmox:network.nameservers: ['9.9.9'] is not a non-empty list of IP addresses"),
    ("cilium.version", "one.nineteen",
     "talos-proxmox:cilium.version: 'one.nineteen' is not a chart version (expected e.g. 1.19.6)"),
    ("hubble.uiServiceType", "Ingress",
     "talos-proxmox:hubble.uiServiceType: 'Ingress' is not a Service type (expected ClusterIP, NodePort or LoadBalancer)"),
    ("ccm.controllers", ["cloud-node", "route"],
     "talos-proxmox:ccm.controllers: ['cloud-node', 'route'] is not a list of CCM controllers (expected some of: "
     "cloud-node, cloud-node-lifecycle, node-csr-approval, node-ipam-controller)"),
    ("health.timeoutSeconds", 0,
     "talos-proxmox:health.timeoutSeconds: 0 is not a timeout in seconds (positive integer)"),
    ("health.wait", "yes",
     "talos-proxmox:health.wait: 'yes' is not true or false"),
    ("ccm.version", "latest",
     "talos-proxmox:ccm.version: 'latest' is not a chart version (expected e.g. 0.5.4)"),
    ("lifecycle.timeoutSeconds", 0,
     "talos-proxmox:lifecycle.timeoutSeconds: 0 is not a timeout in seconds (positive integer)"),
    ("lifecycle.resetOnDelete", "no",
     "talos-proxmox:lifecycle.resetOnDelete: 'no' is not true or false"),
    ("image.arch", "riscv64",
     "talos-proxmox:image.arch: 'riscv64' is not a supported architecture (expected amd64 or arm64)"),
    ("image.schematic", {"customisation": {}},
     "talos-proxmox:image.schematic: {'customisation': {}} is not a valid schematic: schematic: unknown key "
     "'customisation'; expected one of: owner, overlay, customization (the Image Factory rejects unknown fields)"),
    ("proxmox.node", None,
     "talos-proxmox:proxmox.node: None is required (is not a Proxmox node name (expected e.g. pve))"),
    ("nodes[6].memory", "6G",
     "talos-proxmox:nodes[6].memory: '6G' is not a memory size in MiB (positive integer)"),
]


@pytest.mark.parametrize("path,value,message", BAD_INPUTS, ids=[f"{p}={v!r}" for p, v, _ in BAD_INPUTS])
def test_bad_input_is_refused_with_its_exact_message(path, value, message):
    raw = copy.deepcopy(stack("test-cluster"))
    _set(raw, path, value)
    with pytest.raises(SettingsError) as err:
        load_settings(raw)
    assert err.value.problems == [message]
    assert message in str(err.value)


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
