"""Upgrading this program on a running cluster, end to end (tests/e2e_engine.py): nodes configured by a
release that wrote the node's network and KubeSpan as the deprecated `machine.network` fields take
today's documents (LinkAliasConfig, LinkConfig, ResolverConfig, Layer2VIPConfig, KubeSpanConfig) in
place: the preview a user reviews shows an update of each node's machine config and apply only, and the
up applies each over mTLS in auto mode, which Talos takes without a reboot; no VM, lifecycle or
secret changes, no node rebooted, reset or reinstalled."""

from __future__ import annotations

import pytest
import yaml

from talos_proxmox.cluster_plan import node_patches
from tests.e2e_engine import e2e_cluster, e2e_config

NODES = [("e2e-cp-1", "controlplane", "127.0.0.2"), ("e2e-cp-2", "controlplane", "127.0.0.3"),
         ("e2e-cp-3", "controlplane", "127.0.0.4"), ("e2e-worker-1", "worker", "127.0.0.5")]
TALOS = "v1.13.7"
NEW_DOCUMENTS = {"KubeSpanConfig", "LinkAliasConfig", "LinkConfig", "ResolverConfig", "Layer2VIPConfig"}
NODE_DOWN_RPCS = ("Reboot", "Upgrade", "LifecycleService/Upgrade", "Reset", "Shutdown")


def previous_release_network(node, vip):
    """The node network as the previous release wrote it: one interface picked by MAC, nameservers."""
    interface = {"deviceSelector": {"hardwareAddr": node.mac}, "addresses": [node.address],
                 "routes": [{"network": "0.0.0.0/0", "gateway": node.gateway}], "dhcp": False}
    if vip is not None and node.role == "controlplane":
        interface["vip"] = {"ip": vip}
    return [{"machine": {"network": {"interfaces": [interface], "nameservers": list(node.nameservers)}}}]


def previous_release_kubespan(settings):
    kubespan = settings.cluster.kubespan
    return {"machine": {"network": {"kubespan": {
        "enabled": True, "mtu": kubespan.mtu, "advertiseKubernetesNetworks": kubespan.advertise_kubernetes_networks}}}}


def _config(url):
    config = e2e_config(url, NODES, TALOS)
    config["cluster"]["kubespan"] = {"enabled": True, "mtu": 1420}
    return config


@pytest.fixture(scope="module")
def ups(tmp_path_factory):
    with e2e_cluster(NODES, TALOS, tmp_path_factory) as cluster:
        with pytest.MonkeyPatch.context() as previous_release:
            previous_release.setattr(node_patches, "node_network_patch", previous_release_network)
            previous_release.setattr(node_patches, "kubespan_patch", previous_release_kubespan)
            before = cluster.up(_config(cluster.factory.url))
        reboots = {name: fake.reboots for name, fake in cluster.nodes.items()}
        after = cluster.up(_config(cluster.factory.url))
        yield before, after, reboots, {name: fake.reboots for name, fake in cluster.nodes.items()}


def _documents(config: bytes) -> dict:
    return {doc.get("kind", "v1alpha1"): doc for doc in yaml.safe_load_all(config) if isinstance(doc, dict)}


def test_the_previous_release_configured_the_deprecated_fields(ups):
    before, _, _, _ = ups
    for name, _, ip in NODES:
        documents = _documents(before.rendered[name])
        assert not NEW_DOCUMENTS & set(documents), name
        network = documents["v1alpha1"]["machine"]["network"]
        assert network["interfaces"][0]["addresses"] == [f"{ip}/24"] and network["kubespan"]["enabled"] is True


def test_the_preview_shows_an_update_of_each_nodes_config_and_apply_only(ups):
    _, after, _, _ = ups
    expected = {f"{kind}-{name}" for kind in ("machineconfig", "apply") for name, _, _ in NODES}
    assert {step.name for step in after.plan.steps if step.op == "update"} == expected
    assert {step.op for step in after.plan.steps} <= {"update", "same"}
    assert after.steps("update") == expected and after.steps("create") == after.steps("delete") == set()


def test_each_node_takes_the_documents_in_place_without_going_down(ups):
    before, after, reboots_before, reboots_after = ups
    for name, role, ip in NODES:
        calls = after.new_calls(before, name)
        [apply] = [c for c in calls if c.rpc == "ApplyConfiguration"]
        assert (apply.request.mode, apply.roles, apply.mode) == (1, ("os:admin",), "configured"), name  # AUTO, mTLS
        assert apply.request.data == after.rendered[name], name
        assert not [c for c in calls if c.rpc in NODE_DOWN_RPCS], name
        assert reboots_after[name] == reboots_before[name], name
        documents = _documents(after.rendered[name])
        assert "network" not in documents["v1alpha1"]["machine"], name
        mac = f"bc:24:11:00:01:{int(ip.rsplit('.', 1)[1]):02x}"
        assert documents["LinkAliasConfig"]["selector"] == {"match": f'mac(link.permanent_addr) == "{mac}"'}, name
        assert documents["LinkConfig"]["addresses"] == [{"address": f"{ip}/24"}], name
        assert documents["KubeSpanConfig"]["enabled"] is True, name
        assert ("Layer2VIPConfig" in documents) is (role == "controlplane"), name
