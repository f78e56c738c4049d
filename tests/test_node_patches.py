"""Patches derived from the stack settings equal the ones the seed walkthrough writes by hand."""

from pathlib import Path

import pytest
import yaml

from talos_proxmox.talos_config.machine_config import render
from talos_proxmox.cluster_plan.node_patches import hostname_patch, node_patches
from talos_proxmox.settings.stack import load_settings, stack_file_config
from tests import seed_cluster

STACKS = Path(__file__).resolve().parent.parent / "stacks"
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
    assert master[2] == yaml.safe_load(seed_cluster.PATCH_CONTROLPLANE)
    assert master[3] == yaml.safe_load(seed_cluster.network_patch("bc:24:11:80:a1:9b", "10.255.200.201"))
    assert master[4] == {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": {"$patch": "delete"},
                         "hostname": "master-1"}
    assert len(master) == 5
    worker = patches["worker-1"]
    assert yaml.safe_load(seed_cluster.PATCH_WORKER_WITH_DISK) == {
        "machine": {**worker[5]["machine"], **worker[2]["machine"]}, "cluster": worker[2]["cluster"]}
    assert len(patches["worker-4"]) == 5  # no disk, no modules: nothing beyond the common set


@pytest.mark.parametrize("index", range(9))
def test_stack_renders_exactly_what_the_seeds_hand_patches_render(index):
    """From the stack file to the final machine config, the seed's nine nodes come out as by hand."""
    s = settings(ccm={"enabled": False})
    node, seed_node = s.nodes[index], seed_cluster.nodes()[index]
    assert (node.name, node.ip, node.mac) == (seed_node["name"], seed_node["ip"], seed_node["mac"])
    bundle = seed_cluster.shared_bundle()
    common = (bundle, s.cluster.name, s.cluster.endpoint, node.role, s.cluster.talos_version,
              s.cluster.kubernetes_version)
    by_hand = seed_cluster.node_patches(seed_node) + [hostname_patch(node)]
    assert render(*common, node_patches(s, node, INSTALLER)) == render(*common, by_hand)


def test_cluster_network_is_replaced_not_appended():
    ops = by_node(settings())["master-1"][1]
    assert ops == [
        {"op": "replace", "path": "/cluster/network/dnsDomain", "value": "cluster.local"},
        {"op": "replace", "path": "/cluster/network/podSubnets", "value": ["10.244.0.0/16"]},
        {"op": "replace", "path": "/cluster/network/serviceSubnets", "value": ["10.96.0.0/12"]},
    ]


def test_ccm_settings_on_every_node_and_talos_api_access_on_control_planes_only():
    patches = by_node(settings())
    for name, plist in patches.items():
        ccm = plist[3]
        assert ccm["machine"]["kubelet"]["extraArgs"] == {
            "cloud-provider": "external", "rotate-server-certificates": "true"}
        access = ccm["machine"].get("features", {}).get("kubernetesTalosAPIAccess")
        if name.startswith("master"):
            assert access == {"enabled": True, "allowedRoles": ["os:reader"],
                              "allowedKubernetesNamespaces": ["kube-system"]}
        else:
            assert access is None


def test_vip_goes_on_control_plane_interfaces_only():
    s = settings("dev")
    cp, worker = (node_patches(s, n, INSTALLER) for n in s.nodes)
    net = lambda plist: next(p for p in plist if isinstance(p, dict) and "interfaces" in p.get("machine", {}).get("network", {}))
    assert net(cp)["machine"]["network"]["interfaces"][0]["vip"] == {"ip": "10.10.0.50"}
    assert "vip" not in net(worker)["machine"]["network"]["interfaces"][0]
    # KubeSpan is off in dev, so the common patch carries no machine section.
    assert cp[2] == {"cluster": {"discovery": {"enabled": True}, "network": {"cni": {"name": "none"}},
                                 "proxy": {"disabled": True}}}


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
    assert patches["master-2"][3]["cluster"] == {
        "controllerManager": {"extraArgs": {"controllers": "*,tokencleaner,-node-ipam-controller"}}}
    assert "cluster" not in patches["worker-2"][3]
    assert "cluster" not in by_node(settings())["master-2"][3]
