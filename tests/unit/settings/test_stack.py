"""The stack settings model: both shipped stacks load with their defaults (bad inputs: test_bad_stacks.py)."""


import pytest

from talos_proxmox.settings.model import (
    PROJECT,
    CcmSettings,
    CiliumSettings,
    DataDisk,
    EtcdSnapshots,
    HubbleSettings,
    ImageSettings,
    KubeSpan,
    LifecycleSettings,
    NodeIpam,
    ProxmoxSettings,
    SettingsError,
)
from talos_proxmox.settings.stack import load_settings, stack_file_config
from tests.program.test_bad_stacks import CP, WORKER, broken, row_id
from tests.paths import STACKS



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
    node = s.nodes[0]
    assert (node.vm_id, node.proxmox_node, node.mtu, node.data_disk, node.kernel_modules) == \
        (None, "pve", None, None, ())
    assert (s.cluster.talos_version, s.cluster.kubernetes_version) == ("v1.13.7", "1.36.2")
    assert s.cluster.kubespan == KubeSpan(enabled=False, mtu=1420, advertise_kubernetes_networks=False)
    assert (s.cluster.discovery, s.cluster.system_disk_encryption, s.cluster.deletion_protection) == \
        (True, "none", True)
    assert s.network.mtu is None
    assert s.proxmox == ProxmoxSettings(node="pve", vm_datastore="local-lvm", iso_datastore="local", bridge="vmbr0",
                                        cpu_type="host", tags=(), iso_datastore_shared=False)
    assert s.image == ImageSettings(factory_url="https://factory.talos.dev", platform="metal", arch="amd64",
                                    secure_boot=False, schematic={"customization": {}})
    assert s.cilium == CiliumSettings(enabled=True, version="1.19.6", repository="https://helm.cilium.io", values={},
                                      load_balancer_addresses=())
    assert s.hubble == HubbleSettings(enabled=True, relay=True, ui=True, ui_service_type="ClusterIP")
    assert s.ccm == CcmSettings(enabled=True, chart="oci://ghcr.io/siderolabs/charts/talos-cloud-controller-manager",
                                version="0.5.4", replicas=1, controllers=("cloud-node", "node-csr-approval"),
                                node_ipam=None, values={})
    assert (s.lifecycle.timeout_seconds, s.lifecycle.reset_on_delete) == (1200, True)


def dev_with(changes: dict) -> dict:
    """The dev stack's project keys with `changes` (paths as in test_bad_stacks.py's table), prefix stripped."""
    prefix = f"{PROJECT}:"
    return {k[len(prefix):]: v for k, v in broken(changes).items() if k.startswith(prefix)}


# A key set away from its default (or to a bound of its range), and what Settings holds for it.
ACCEPTED = [
    ({"cluster.domain": "k8s.example.org"}, lambda s: s.cluster.domain, "k8s.example.org"),
    ({"cluster.installDisk": "/dev/x"}, lambda s: s.cluster.install_disk, "/dev/x"),  # the shortest device path
    # 1280: the least MTU KubeSpan takes.
    ({"cluster.kubespan": {"enabled": True, "mtu": 1280, "advertiseKubernetesNetworks": True}},
     lambda s: s.cluster.kubespan, KubeSpan(enabled=True, mtu=1280, advertise_kubernetes_networks=True)),
    ({"cluster.discovery": False}, lambda s: s.cluster.discovery, False),
    ({"cluster.systemDiskEncryption": "none"}, lambda s: s.cluster.system_disk_encryption, "none"),
    ({"cluster.systemDiskEncryption": "tpm", "image.secureBoot": True},
     lambda s: (s.cluster.system_disk_encryption, s.image.secure_boot), ("tpm", True)),
    ({"cluster.deletionProtection": False}, lambda s: s.cluster.deletion_protection, False),
    # The endpoint without a VIP: the first control plane's address, not the first node's; IPv6 in brackets.
    ({"cluster.vip": None, "nodes": [WORKER, CP]}, lambda s: s.cluster.endpoint, "https://10.10.0.51:6443"),
    ({"cluster.vip": None, "network.subnet": "fd00:10::/64", "network.gateway": "fd00:10::1",
      "nodes[0].ip": "fd00:10::51", "nodes[1].ip": "fd00:10::52"},
     lambda s: s.cluster.endpoint, "https://[fd00:10::51]:6443"),
    # A dual-stack pair of nodes: an IPv6 pool is checked against the IPv6 addresses only.
    ({"cluster.vip": None, "nodes[0].ip": "fd00:10::51/64", "nodes[0].gateway": "fd00:10::1", "cilium.enabled": True,
      "cilium.loadBalancerAddresses": ["fd00:10::60-fd00:10::69"]},
     lambda s: s.cilium.load_balancer_addresses, ("fd00:10::60-fd00:10::69",)),
    # The oldest and the newest Kubernetes minor Talos v1.13 supports; a leading "v" is dropped, as talosctl does.
    ({"cluster.kubernetesVersion": "v1.31.0"}, lambda s: s.cluster.kubernetes_version, "1.31.0"),
    ({"cluster.kubernetesVersion": "1.36.2"}, lambda s: s.cluster.kubernetes_version, "1.36.2"),
    ({"network.mtu": 9000}, lambda s: (s.network.mtu, [n.mtu for n in s.nodes]), (9000, [9000, 9000])),
    ({"proxmox.vmDatastore": "ceph-vm", "proxmox.isoDatastore": "cephfs", "proxmox.isoDatastoreShared": True,
      "proxmox.bridge": "vmbr1", "proxmox.cpuType": "x86-64-v2-AES", "proxmox.tags": ["talos", "dev"]},
     lambda s: s.proxmox, ProxmoxSettings(node="pve", vm_datastore="ceph-vm", iso_datastore="cephfs", bridge="vmbr1",
                                          cpu_type="x86-64-v2-AES", tags=("talos", "dev"), iso_datastore_shared=True)),
    ({"proxmox.cpuType": "custom-epyc-talos"}, lambda s: s.proxmox.cpu_type, "custom-epyc-talos"),
    ({"image.platform": "nocloud"}, lambda s: s.image.platform, "nocloud"),
    ({"image.schematic": {"customization": {"extraKernelArgs": ["console=ttyS0"]}}},
     lambda s: s.image.schematic, {"customization": {"extraKernelArgs": ["console=ttyS0"]}}),
    ({"nodes[0].vmId": 100, "nodes[1].vmId": 999_999_999}, lambda s: [n.vm_id for n in s.nodes], [100, 999_999_999]),
    ({"nodes[1].proxmoxNode": "pve2", "nodes[1].nameservers": ["10.10.0.2"], "nodes[1].mtu": 1500},
     lambda s: [(n.proxmox_node, n.nameservers, n.mtu) for n in s.nodes],
     [("pve", ("1.1.1.1", "9.9.9.9"), None), ("pve2", ("10.10.0.2",), 1500)]),
    ({"nodes[1].dataDisk": {"size": 1}}, lambda s: s.nodes[1].data_disk, DataDisk(1, "/dev/sdb", "/var/lib/longhorn")),
    ({"nodes[1].memory": 1024}, lambda s: s.nodes[1].memory_mib, 1024),  # a worker has no control plane's minimum
    # Nodes may share subnets of their own, overlapping or not.
    ({"cluster.vip": None, "nodes[0].ip": "10.20.0.5/16", "nodes[0].gateway": "10.20.0.1",
      "nodes[1].ip": "10.20.1.6/24", "nodes[1].gateway": "10.20.1.1"},
     lambda s: [n.address for n in s.nodes], ["10.20.0.5/16", "10.20.1.6/24"]),
    # From Talos 1.14 the data disk is a user volume, which Talos mounts under /var/mnt.
    ({"cluster.talosVersion": "v1.14.1", "nodes[1].dataDisk": {"size": 30}},
     lambda s: s.nodes[1].data_disk, DataDisk(30, "/dev/sdb", "/var/mnt/longhorn")),
    ({"cluster.talosVersion": "v1.14.1", "nodes[1].dataDisk": {"size": 30, "device": "/dev/vdb",
                                                               "mountpoint": "/var/mnt/data-1"}},
     lambda s: s.nodes[1].data_disk, DataDisk(30, "/dev/vdb", "/var/mnt/data-1")),
    ({"cilium.repository": "https://charts.lab.local", "cilium.values": {"ipam": {"mode": "kubernetes"}}},
     lambda s: (s.cilium.repository, s.cilium.values), ("https://charts.lab.local", {"ipam": {"mode": "kubernetes"}})),
    ({"cilium.enabled": False}, lambda s: (s.cilium.enabled, s.hubble.enabled), (False, True)),  # Hubble not asked for
    ({"hubble.ui": False, "hubble.uiServiceType": "NodePort"},
     lambda s: s.hubble, HubbleSettings(enabled=True, relay=True, ui=False, ui_service_type="NodePort")),
    ({"ccm.chart": "oci://registry.lab.local/charts/talos-cloud-controller-manager"},
     lambda s: s.ccm.chart, "oci://registry.lab.local/charts/talos-cloud-controller-manager"),
    ({"ccm.values": {"logVerbosityLevel": 4}}, lambda s: s.ccm.values, {"logVerbosityLevel": 4}),
    ({"ccm.enabled": True, "ccm.replicas": 1}, lambda s: s.ccm.replicas, 1),  # as many as control planes
    ({"ccm.nodeIpam": {}}, lambda s: s.ccm.node_ipam, NodeIpam("CloudAllocator", 24, 80)),
    ({"ccm.nodeIpam": {"cidrAllocatorType": "CloudAllocator"}},
     lambda s: s.ccm.node_ipam, NodeIpam("CloudAllocator", 24, 80)),
    ({"ccm.nodeIpam": {"cidrAllocatorType": "RangeAllocator", "maskSizeIpv4": 20, "maskSizeIpv6": 96}},
     lambda s: (s.ccm.node_ipam, s.ccm.controllers),
     (NodeIpam("RangeAllocator", 20, 96), ("cloud-node", "node-csr-approval", "node-ipam-controller"))),
    ({"ccm.controllers": ["node-ipam-controller", "cloud-node"], "ccm.nodeIpam": {}},
     lambda s: s.ccm.controllers, ("node-ipam-controller", "cloud-node")),  # named once, not added again
    # The lower bounds (the dev stack's CCM is off, so no pod subnet has to hold the node ranges).
    ({"ccm.nodeIpam": {"maskSizeIpv4": 1, "maskSizeIpv6": 1}},
     lambda s: s.ccm.node_ipam, NodeIpam("CloudAllocator", 1, 1)),
    # Node ranges that just fit: one for the one node, two for two nodes, and 16 bits below the pod subnet.
    ({"nodes": [CP], "ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 16}},
     lambda s: s.ccm.node_ipam.mask_size_ipv4, 16),
    ({"ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 25}, "cluster.podSubnets": ["10.244.0.0/24"]},
     lambda s: s.ccm.node_ipam.mask_size_ipv4, 25),
    ({"ccm.enabled": True, "ccm.nodeIpam": {"maskSizeIpv4": 28}, "cluster.podSubnets": ["10.240.0.0/12"]},
     lambda s: s.ccm.node_ipam.mask_size_ipv4, 28),
    ({"lifecycle": {"timeoutSeconds": 3600, "resetOnDelete": False, "etcdSnapshots": {"keep": 1}}},
     lambda s: s.lifecycle, LifecycleSettings(timeout_seconds=3600, reset_on_delete=False,
                                              etcd_snapshots=EtcdSnapshots("etcd-snapshots", 1))),
]


@pytest.mark.parametrize("changes, read, parsed", ACCEPTED, ids=[row_id(changes) for changes, _, _ in ACCEPTED])
def test_a_key_set_away_from_its_default_is_read_as_given(changes, read, parsed):
    s = load_settings(dev_with(changes))
    assert read(s) == parsed
    assert s.warnings == ()


def test_node_with_its_own_prefix_and_gateway():
    raw = stack("dev")
    raw["nodes"][1] = dict(raw["nodes"][1], ip="10.20.0.5/16", gateway="10.20.0.1")
    s = load_settings(raw)
    assert s.nodes[1].address == "10.20.0.5/16" and s.nodes[1].gateway == "10.20.0.1"


EVEN_CONTROL_PLANES = ("talos-proxmox:nodes: 2 control-plane nodes is an even number; etcd keeps quorum best with an "
                       "odd number (1, 3, 5)")
# A stack that loads, and what it is warned of.
WARNED = [
    ({"nodes[1].role": "controlplane"}, (EVEN_CONTROL_PLANES,)),
    ({"nodes[0].memory": 1024},
     ("talos-proxmox:nodes[0].memory: 1024 MiB for control plane dev-cp-1 is below Talos's minimum of 2048 MiB for a "
      "control plane",)),
    ({"cilium.enabled": False, "hubble.enabled": True},
     ("talos-proxmox:hubble.enabled: True has no effect with cilium.enabled: false (Hubble is part of Cilium)",)),
    ({"nodes[1].role": "controlplane", "ccm.enabled": True, "ccm.replicas": 3},
     (EVEN_CONTROL_PLANES, "talos-proxmox:ccm.replicas: 3 is more than the 2 control planes the CCM runs on; the extra "
                           "replicas stay Pending")),
]


@pytest.mark.parametrize("changes, warnings", WARNED, ids=[row_id(changes) for changes, _ in WARNED])
def test_a_stack_loads_with_its_warnings(changes, warnings):
    assert load_settings(dev_with(changes)).warnings == warnings


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


# Several bad entries of one list: each is reported, and each overlapping pair of keys once.
SEVERAL_PROBLEMS = [
    ({"cilium.loadBalancerAddresses": ["10.20.0.60/30", "10.10.0.48/28"]},
     ["talos-proxmox:cilium.loadBalancerAddresses[0]: '10.20.0.60/30' is outside the nodes' subnet "
      "(L2 announcements answer ARP only there)",
      "talos-proxmox:cilium.loadBalancerAddresses[1]: '10.10.0.48/28' includes nodes[0].ip "
      "(expected addresses no node, VIP or gateway uses)"]),
    ({"cluster.podSubnets": ["10.10.0.0/16", "10.0.0.0/11"], "nodes[1].ip": "10.30.0.5/24",
      "nodes[1].gateway": "10.30.0.1"},
     ["talos-proxmox:cluster.podSubnets: '10.10.0.0/16' overlaps cluster.podSubnets 10.0.0.0/11 "
      "(expected pod, service and node networks apart)",
      "talos-proxmox:cluster.podSubnets: '10.10.0.0/16' overlaps network.subnet 10.10.0.0/24 "
      "(expected pod, service and node networks apart)",
      "talos-proxmox:cluster.podSubnets: '10.0.0.0/11' overlaps nodes[1].ip 10.30.0.0/24 "
      "(expected pod, service and node networks apart)"]),
]


@pytest.mark.parametrize("changes, problems", SEVERAL_PROBLEMS, ids=[row_id(c) for c, _ in SEVERAL_PROBLEMS])
def test_each_bad_entry_of_a_list_is_reported(changes, problems):
    with pytest.raises(SettingsError) as err:
        load_settings(dev_with(changes))
    assert err.value.problems == problems


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


def test_csi_is_off_by_default_and_its_region_defaults_to_the_cluster_name():
    s = load_settings(stack("test-cluster"))
    assert not s.csi.enabled and s.csi.storage_classes == () and s.proxmox.datastores == ()
    raw = stack("test-cluster")
    raw["proxmox"] = {**raw["proxmox"], "datastores": ["ceph-vm"]}
    raw["csi"] = {"enabled": True, "storageClasses": [{"name": "data", "datastore": "ceph-vm"}]}
    s = load_settings(raw)
    assert (s.csi.region, s.csi.topology_labels, s.csi.chart, s.csi.version) == (
        "test-cluster", "talos-ccm", "oci://ghcr.io/sergelogvinov/charts/proxmox-csi-plugin", "0.5.9")
    [sc] = s.csi.storage_classes
    assert (sc.name, sc.datastore, sc.reclaim_policy, sc.fs_type, sc.cache, sc.ssd, sc.default) == (
        "data", "ceph-vm", "Delete", "ext4", None, False, False)
