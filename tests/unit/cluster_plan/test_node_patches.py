"""Patches derived from the stack settings equal the ones the seed walkthrough writes by hand."""


import pytest
import yaml

from talos_proxmox.talos_config.machine_config import parse_config, render
from talos_proxmox.cluster_plan.node_patches import hostname_patch, kubespan_patch, node_patches
from talos_proxmox.settings.stack import load_settings, stack_file_config
from tests.support import seed_cluster
from tests.paths import STACKS

NETWORK_KINDS = ("KubeSpanConfig", "LinkAliasConfig", "LinkConfig", "ResolverConfig", "Layer2VIPConfig")
INSTALLER = seed_cluster.INSTALLER


def settings(name="test-cluster", **changes):
    raw = stack_file_config(str(STACKS / f"Pulumi.{name}.yaml"))
    for key, value in changes.items():
        raw[key] = {**raw.get(key, {}), **value}
    return load_settings(raw)


def by_node(s):
    return {n.name: node_patches(s, n, INSTALLER) for n in s.nodes}


def test_seed_patches_for_master_1_and_a_data_disk_worker():
    patches = by_node(settings(ccm={"enabled": False}))
    master = patches["master-1"]
    assert master[0] == yaml.safe_load(seed_cluster.PATCH_INSTALL)
    current = [list(yaml.safe_load_all(text)) for text in seed_cluster.current_form_patches(seed_cluster.nodes()[0])]
    assert master[2] == current[1][0]  # discovery, no default CNI, no kube-proxy
    assert master[3] == current[2][0]  # the KubeSpanConfig document
    assert master[4:7] == current[3]  # LinkAliasConfig by MAC, LinkConfig, ResolverConfig
    assert master[4]["selector"] == {"match": 'mac(link.permanent_addr) == "bc:24:11:80:a1:9b"'}
    assert master[5]["addresses"] == [{"address": "10.255.200.201/24"}]
    assert master[7] == {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": {"$patch": "delete"},
                         "hostname": "master-1"}
    assert len(master) == 8
    worker = patches["worker-1"]
    assert yaml.safe_load(seed_cluster.PATCH_WORKER_WITH_DISK) == {
        "machine": {**worker[8]["machine"], "network": {"kubespan": {
            key: value for key, value in worker[3].items() if key not in ("apiVersion", "kind")}}},
        "cluster": worker[2]["cluster"]}
    assert len(patches["worker-4"]) == 8  # no disk, no modules: nothing beyond the common set


def test_kubespan_is_a_document_from_v1_13_and_the_v1alpha1_field_under_v1_12():
    fields = {"enabled": True, "mtu": 1420, "advertiseKubernetesNetworks": False}
    assert kubespan_patch(settings()) == {"apiVersion": "v1alpha1", "kind": "KubeSpanConfig", **fields}
    assert kubespan_patch(settings(cluster={"talosVersion": "v1.12.9"})) == {"machine": {"network": {"kubespan": fields}}}
    assert kubespan_patch(settings("dev")) is None  # KubeSpan off in dev


@pytest.mark.parametrize("index", range(9))
def test_stack_renders_exactly_what_the_seeds_hand_patches_render_in_todays_documents(index):
    """From the stack file to the final machine config, the seed's nine nodes come out as by hand, with
    the seed's network and KubeSpan written as Talos 1.13's documents (a deliberate difference from the
    seed, which uses the deprecated `machine.network` fields): the same config otherwise."""
    s = settings(ccm={"enabled": False})
    node, seed_node = s.nodes[index], seed_cluster.nodes()[index]
    assert (node.name, node.ip, node.mac) == (seed_node["name"], seed_node["ip"], seed_node["mac"])
    bundle = seed_cluster.shared_bundle()
    common = (bundle, s.cluster.name, s.cluster.endpoint, node.role, s.cluster.talos_version,
              s.cluster.kubernetes_version)
    ours = render(*common, node_patches(s, node, INSTALLER))
    assert ours == render(*common, seed_cluster.current_form_patches(seed_node) + [hostname_patch(node)])
    seeds = parse_config(render(*common, seed_cluster.node_patches(seed_node) + [hostname_patch(node)]))
    moved = [doc for doc in parse_config(ours) if doc.get("kind") in NETWORK_KINDS]
    assert [doc["kind"] for doc in moved] == ["KubeSpanConfig", "LinkAliasConfig", "LinkConfig", "ResolverConfig"]
    # what moved is all that differs from the seed's own form
    [seed_v1alpha1] = [doc for doc in seeds if doc.get("version") == "v1alpha1"]
    [our_v1alpha1] = [doc for doc in parse_config(ours) if doc.get("version") == "v1alpha1"]
    assert seed_v1alpha1["machine"].pop("network") == {
        "interfaces": [{"deviceSelector": {"hardwareAddr": node.mac}, "addresses": [f"{node.ip}/24"],
                        "routes": [{"network": "0.0.0.0/0", "gateway": "10.255.200.1"}], "dhcp": False}],
        "nameservers": ["9.9.9.9"], "kubespan": {"enabled": True, "mtu": 1420, "advertiseKubernetesNetworks": False}}
    assert "network" not in our_v1alpha1["machine"] and our_v1alpha1 == seed_v1alpha1

    def others(documents):
        return [doc for doc in documents if doc.get("version") != "v1alpha1" and doc.get("kind") not in NETWORK_KINDS]
    assert others(parse_config(ours)) == others(seeds)


@pytest.mark.parametrize("talos_version", ["v1.12.9", "v1.13.7"])
def test_cluster_network_is_a_merge_whose_subnets_replace_the_defaults(talos_version):
    s = settings(cluster={"talosVersion": talos_version, "domain": "example.internal",
                          "podSubnets": ["10.200.0.0/16"], "serviceSubnets": ["10.201.0.0/16"]})
    master = s.control_planes[0]
    network = {"dnsDomain": "example.internal", "podSubnets": ["10.200.0.0/16"], "serviceSubnets": ["10.201.0.0/16"]}
    assert node_patches(s, master, INSTALLER)[1] == {"cluster": {"network": network}}
    assert _rendered(s, master)["v1alpha1"]["cluster"]["network"] == {**network, "cni": {"name": "none"}}


def test_ccm_settings_on_every_node_and_talos_api_access_on_control_planes_only():
    patches = by_node(settings())
    for name, plist in patches.items():
        ccm = plist[4]  # after install, cluster network, features, KubeSpan
        assert ccm == {"machine": {"kubelet": {"extraArgs": {
            "cloud-provider": "external", "rotate-server-certificates": "true"}}}}
        access = [p["machine"]["features"]["kubernetesTalosAPIAccess"] for p in plist
                  if "kubernetesTalosAPIAccess" in (p.get("machine", {}).get("features") or {})]
        if name.startswith("master"):
            assert access == [{"enabled": True, "allowedRoles": ["os:reader"],
                               "allowedKubernetesNamespaces": ["kube-system"]}]
        else:
            assert access == []


@pytest.mark.parametrize("ccm, roles", [(True, ["os:reader", "os:etcd:backup"]), (False, ["os:etcd:backup"])])
def test_backups_add_the_etcd_backup_role_to_the_control_planes_talos_api_access(ccm, roles):
    s = settings(ccm={"enabled": ccm}, backups=BACKUPS)
    for node in s.nodes:
        access = [p["machine"]["features"]["kubernetesTalosAPIAccess"] for p in node_patches(s, node, INSTALLER)
                  if "kubernetesTalosAPIAccess" in (p.get("machine", {}).get("features") or {})]
        expected = [{"enabled": True, "allowedRoles": roles, "allowedKubernetesNamespaces": ["kube-system"]}]
        assert access == (expected if node.role == "controlplane" else []), node.name
        features = _rendered(s, node)["v1alpha1"]["machine"]["features"]
        assert features.get("kubernetesTalosAPIAccess") == (expected[0] if node.role == "controlplane" else None)


BACKUPS = {"bucket": "etcd-backups", "endpoint": "https://s3.lab.local:9000", "accessKeyId": "backup",
           "secretAccessKey": "x" * 40, "ageRecipient": "age1" + "q" * 58}


def test_vip_goes_on_control_plane_links_only():
    s = settings("dev")
    cp, worker = (node_patches(s, n, INSTALLER) for n in s.nodes)
    vips = lambda plist: [p for p in plist if isinstance(p, dict) and p.get("kind") == "Layer2VIPConfig"]
    assert vips(cp) == [{"apiVersion": "v1alpha1", "kind": "Layer2VIPConfig", "name": "10.10.0.50", "link": "net0"}]
    assert vips(worker) == []
    # KubeSpan is off in dev: no KubeSpanConfig, and the common patch is the cluster section only.
    assert cp[2] == {"cluster": {"discovery": {"enabled": True}, "network": {"cni": {"name": "none"}},
                                 "proxy": {"disabled": True}}}
    assert not [p for p in cp + worker if isinstance(p, dict) and p.get("kind") == "KubeSpanConfig"]


def test_user_patches_come_last_cluster_then_role_then_node():
    raw = stack_file_config(str(STACKS / "Pulumi.dev.yaml"))
    raw["cluster"]["patches"] = [{"machine": {"sysctls": {"a": "1"}}}]
    raw["cluster"]["rolePatches"] = {"worker": [[{"op": "add", "path": "/machine/sysctls/b", "value": "2"}]]}
    raw["nodes"][1]["patches"] = [{"machine": {"sysctls": {"c": "3"}}}]
    s = load_settings(raw)
    worker = node_patches(s, s.nodes[1], INSTALLER)
    assert worker[-3:] == [raw["cluster"]["patches"][0], raw["cluster"]["rolePatches"]["worker"][0],
                           raw["nodes"][1]["patches"][0]]
    assert node_patches(s, s.nodes[0], INSTALLER)[-1] == raw["cluster"]["patches"][0]


def test_ccm_node_ipam_turns_off_the_controller_managers_own_allocator_on_control_planes():
    patches = by_node(settings(ccm={"nodeIpam": {"cidrAllocatorType": "CloudAllocator"}}))
    assert patches["master-2"][4]["cluster"] == {
        "controllerManager": {"extraArgs": {"controllers": "*,tokencleaner,-node-ipam-controller"}}}
    assert "cluster" not in patches["worker-2"][4]
    assert "cluster" not in by_node(settings())["master-2"][4]


# --- the v1.14 contract: each Kubernetes setting in a document of its own --------------------------------


def v1_14(**changes):
    raw = stack_file_config(str(STACKS / "Pulumi.test-cluster.yaml"))
    raw["cluster"] = {**raw["cluster"], "talosVersion": "v1.14.0"}
    raw["cluster"].pop("kubernetesVersion", None)
    for node in raw["nodes"]:
        if node.get("dataDisk"):
            node["dataDisk"] = {**node["dataDisk"], "mountpoint": "/var/mnt/longhorn"}
    for key, value in changes.items():
        raw[key] = {**raw.get(key, {}), **value}
    return load_settings(raw)


def _rendered(s, node):
    text = render(seed_cluster.shared_bundle(), s.cluster.name, s.cluster.endpoint, node.role, s.cluster.talos_version,
                  s.cluster.kubernetes_version, node_patches(s, node, INSTALLER))
    return {d.get("kind", "v1alpha1") + (f"/{d['name']}" if d.get("name") else ""): d for d in parse_config(text)}


def test_v1_14_defaults_to_its_kubernetes_and_renders_every_setting_as_its_document():
    s = v1_14(ccm={"enabled": True, "nodeIpam": {"maskSizeIpv4": 24}},
              cluster={"podSubnets": ["10.200.0.0/16"], "domain": "example.internal"})
    assert s.cluster.kubernetes_version == "1.37.0"
    master, worker = s.control_planes[0], next(n for n in s.workers if n.data_disk is not None)
    cp, w = _rendered(s, master), _rendered(s, worker)
    for docs in (cp, w):
        assert docs["KubeNetworkConfig"]["podSubnets"] == ["10.200.0.0/16"]  # replaced, not appended
        assert docs["KubeNetworkConfig"]["dnsDomain"] == "example.internal"
        assert docs["KubeletConfig"]["extraArgs"] == {"cloud-provider": "external", "rotate-server-certificates": "true"}
        assert docs["UnattendedInstallConfig"]["installer"] == {"image": INSTALLER}
        assert set(docs["v1alpha1"]["machine"]) == {"type", "token", "ca", "certSANs", "features"}
        assert "KubeFlannelCNIConfig" not in docs
    assert cp["KubeTalosAPIAccessConfig"] == {"apiVersion": "v1alpha1", "kind": "KubeTalosAPIAccessConfig",
                                              "allowedRoles": ["os:reader"], "allowedKubernetesNamespaces": ["kube-system"]}
    assert cp["KubeControllerManagerConfig"]["extraArgs"] == {"controllers": "*,tokencleaner,-node-ipam-controller"}
    assert cp["KubeProxyConfig"]["enabled"] is False
    assert not {"KubeTalosAPIAccessConfig", "KubeControllerManagerConfig", "KubeProxyConfig"} & set(w)
    assert w["UserVolumeConfig/longhorn"]["provisioning"] == {
        "diskSelector": {"match": 'disk.dev_path == "/dev/sdb"'}, "minSize": "30GB"}
    assert [k for k in w if k.startswith("KernelModuleConfig/")] == \
        [f"KernelModuleConfig/{m}" for m in worker.kernel_modules]


def test_v1_14_without_discovery_or_cilium():
    s = v1_14(cluster={"discovery": False}, cilium={"enabled": False})
    cp = _rendered(s, s.control_planes[0])
    assert "DiscoveryServiceConfig/default" not in cp and "DiscoveryIdentityConfig" in cp
    assert cp["KubeFlannelCNIConfig"]["backendType"] == "vxlan" and "enabled" not in cp["KubeProxyConfig"]


def test_v1_14_data_disk_must_be_a_user_volume_mount():
    from talos_proxmox.settings.model import SettingsError

    raw = stack_file_config(str(STACKS / "Pulumi.test-cluster.yaml"))
    raw["cluster"] = {**raw["cluster"], "talosVersion": "v1.14.0"}
    raw["cluster"].pop("kubernetesVersion", None)
    with pytest.raises(SettingsError) as err:
        load_settings(raw)
    assert "nodes[3].dataDisk.mountpoint: '/var/lib/longhorn' is not where Talos 1.14 mounts a user volume " \
           "(expected /var/mnt/<name>" in str(err.value)
    for node in raw["nodes"]:
        if node.get("dataDisk"):
            node["dataDisk"] = {"size": 30}
    assert {n.data_disk.mountpoint for n in load_settings(raw).nodes if n.data_disk} == {"/var/mnt/longhorn"}


def test_moving_a_cluster_with_data_disks_to_v1_14_is_refused_before_anything_changes():
    from talos_proxmox.cluster_plan.resource_inputs import node_change_plan
    from talos_proxmox.day_two import node_changes

    before, after = settings(), v1_14()
    found = node_changes.problems(node_change_plan(before, INSTALLER), node_change_plan(after, INSTALLER))
    with_disks = [n.name for n in before.nodes if n.data_disk is not None]
    # (the stack takes v1.14's default Kubernetes, 1.37, which the nodes' v1.13 cannot run: refused as well)
    [*found, version] = found
    assert version.startswith("cluster.kubernetesVersion 1.37.0 is not one the nodes' Talos v1.13")
    assert with_disks and [p.split(":")[0] for p in found] == [f"node {name}" for name in sorted(with_disks)]
    assert all("(machine.disks at /var/lib/longhorn -> user volume at /var/mnt/longhorn)" in p for p in found)
    # Without data disks the same move is an upgrade like any other.
    bare = {"nodes": [{k: v for k, v in n.items() if k != "dataDisk"}
                      for n in stack_file_config(str(STACKS / "Pulumi.test-cluster.yaml"))["nodes"]]}
    plain_before = load_settings({**stack_file_config(str(STACKS / "Pulumi.test-cluster.yaml")), **bare})
    raw_after = {**stack_file_config(str(STACKS / "Pulumi.test-cluster.yaml")), **bare}
    raw_after["cluster"] = {**raw_after["cluster"], "talosVersion": "v1.14.0", "kubernetesVersion": "1.36.2"}
    assert node_changes.problems(node_change_plan(plain_before, INSTALLER),
                                 node_change_plan(load_settings(raw_after), INSTALLER)) == []
