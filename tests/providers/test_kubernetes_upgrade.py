"""providers.kubernetes_upgrade: when the cluster-wide Kubernetes upgrade runs, on what, and what it keeps."""

from __future__ import annotations

import pytest

from providers import kubernetes_upgrade as provider
from providers.kubernetes_upgrade import KubernetesUpgradeProvider
from talos_proxmox.talos_config import machine_config
from talos_proxmox.talos_config.client_config import talosconfig as make_talosconfig
from tests.support.day_two import bundle, stand_in_cluster, stop_all  # noqa: F401 - fixture

LAYOUT = [("cp-1", "10.5.0.1", "controlplane"), ("w-1", "10.5.0.11", "worker"), ("w-2", "10.5.0.12", "worker")]
INSTALL = [{"machine": {"install": {"disk": "/dev/sda"}}}]


@pytest.fixture
def cluster(bundle):
    nodes, fakes = stand_in_cluster(bundle, LAYOUT, version_tag="v1.13.7")
    yield nodes, fakes
    stop_all(fakes)


def props(bundle, fakes, kubernetes="1.36.3", talos="v1.13.7") -> dict:
    return {"kubernetes_version": kubernetes, "talos_version": talos, "timeout_seconds": 10,
            "nodes": [{"name": name, "address": address, "role": role} for name, address, role in LAYOUT],
            "configurations": {name: f"config of {name}" for name, _, _ in LAYOUT},
            # each node dialled at its stand-in (the talosconfig's endpoints are what the roll dials)
            "talosconfig": make_talosconfig(bundle, "test", [fakes["cp-1"].endpoint])}


@pytest.fixture
def dialled(monkeypatch, cluster):
    """RollNodes dial their stand-in: the provider builds them from addresses, which are not listening."""
    nodes, _ = cluster
    monkeypatch.setattr(provider, "_nodes", lambda p: [nodes[node["name"]] for node in p.get("nodes") or ()])


def test_only_a_version_change_is_a_change(bundle, cluster):
    _, fakes = cluster
    olds = props(bundle, fakes)
    more = {**olds, "nodes": olds["nodes"][:2], "configurations": {}, "talosconfig": "another"}
    assert KubernetesUpgradeProvider().diff("id", olds, more).changes is False
    assert KubernetesUpgradeProvider().diff("id", olds, props(bundle, fakes, kubernetes="1.37.0")).changes is True
    assert KubernetesUpgradeProvider().diff("id", olds, props(bundle, fakes, talos="v1.14.1")).changes is True


def test_create_on_a_new_cluster_does_one_read_and_keeps_no_secret(bundle, cluster, dialled):
    _, fakes = cluster
    for fake in fakes.values():
        fake.mode = "maintenance"  # a new cluster: booted from the ISO, not configured yet
    result = KubernetesUpgradeProvider().create(props(bundle, fakes))
    assert set(result.outs) == {"kubernetes_version", "talos_version", "nodes", "timeout_seconds"}
    # one read of the first control plane's running configuration, which a node in maintenance refuses
    assert {name: [c.rpc for c in fake.calls] for name, fake in fakes.items()} == {"cp-1": ["Get"], "w-1": [], "w-2": []}


def test_create_on_a_cluster_made_before_this_resource_upgrades_the_nodes_that_answer(bundle, cluster, dialled,
                                                                                    monkeypatch):
    _, fakes = cluster
    for (name, _, role), fake in zip(LAYOUT, fakes.values()):
        fake.config = machine_config.render(bundle, "c", "https://10.5.0.1:6443", role, "v1.13.7", "1.35.4",
                                            INSTALL).encode()
    fakes["w-2"].go_down()  # e.g. a node added in this up, not configured yet
    updates = []
    monkeypatch.setattr(KubernetesUpgradeProvider, "update",
                        lambda self, _id, olds, news: updates.append((olds, news)))
    news = props(bundle, fakes)
    KubernetesUpgradeProvider().create(news)
    [(olds, passed)] = updates
    assert (olds["kubernetes_version"], [n["name"] for n in olds["nodes"]]) == ("1.35.4", ["cp-1", "w-1"])
    assert passed is news

    updates.clear()
    for (name, _, role), fake in zip(LAYOUT, fakes.values()):
        fake.config = machine_config.render(bundle, "c", "https://10.5.0.1:6443", role, "v1.13.7", "1.36.3",
                                            INSTALL).encode()
    KubernetesUpgradeProvider().create(news)
    assert updates == []  # already at the stack's version


def test_a_talos_version_change_alone_syncs_the_manifests_only(bundle, cluster, dialled, monkeypatch):
    _, fakes = cluster
    synced, upgraded = [], []
    monkeypatch.setattr(provider, "_kube", lambda p, nodes: ("kube", nodes[0]))
    monkeypatch.setattr(provider, "sync_manifests", lambda p, kube, client, node: synced.append(node.name))
    monkeypatch.setattr(provider.kubernetes_upgrade, "upgrade", lambda *args, **kwargs: upgraded.append(args))
    outs = KubernetesUpgradeProvider().update("id", props(bundle, fakes), props(bundle, fakes, talos="v1.13.8")).outs
    assert (synced, upgraded) == (["cp-1"], [])
    assert outs["talos_version"] == "v1.13.8" and "configurations" not in outs and "talosconfig" not in outs
    KubernetesUpgradeProvider().update("id", props(bundle, fakes), props(bundle, fakes, kubernetes="1.37.0"))
    [(nodes, configs, version)] = upgraded
    assert ([n.name for n in nodes], version) == (["cp-1", "w-1", "w-2"], "1.37.0")
