"""NodeLifecycle provider called directly against stand-in nodes: no-op create, upgrade and
Kubernetes updates, removal on delete; and its wiring under Pulumi mocks."""

import grpc
import pytest
import yaml

from providers import node_lifecycle

from providers.kubernetes_upgrade import KubernetesUpgradeProvider
from providers.node_lifecycle import NodeLifecycleProvider
from talos_proxmox.day_two.rolling import RollError, RollNode, roll_predecessors
from talos_proxmox.talos_config import secrets_bundle
from talos_proxmox.talos_config.client_config import talosconfig as make_talosconfig
from tests.support import seed_cluster as seed
from tests.support.day_two import bundle, fast_backoff, stand_in_cluster, stop_all  # noqa: F401 - fixtures

OLD, NEW = "v1.12.6", "v1.13.7"


pytestmark = pytest.mark.usefixtures("fast_backoff")


@pytest.fixture
def pair(bundle):
    nodes, fakes = stand_in_cluster(bundle, [("cp-1", "10.5.0.1", "controlplane"), ("cp-2", "10.5.0.2", "controlplane"),
                                             ("cp-3", "10.5.0.3", "controlplane")], version_tag=OLD, downtime=0.2)
    yield fakes, make_talosconfig(bundle, "test", [fakes["cp-1"].endpoint, fakes["cp-2"].endpoint])
    stop_all(fakes)


def _props(fakes, talosconfig, **changes):
    props = {
        "node_name": "cp-1", "address": "10.5.0.1", "endpoint": fakes["cp-1"].endpoint, "role": "controlplane",
        "installer_image": f"factory.talos.dev/installer/{seed.SCHEMATIC}:{OLD}", "talos_version": OLD,
        "timeout_seconds": 10, "reset_on_delete": True, "talosconfig": talosconfig,
    }
    props.update(changes)
    return props


def test_create_touches_no_node(pair):
    fakes, talosconfig = pair
    result = NodeLifecycleProvider().create(_props(fakes, talosconfig))
    assert result.id == "lifecycle-cp-1"
    assert result.outs["talosconfig"] == talosconfig
    assert fakes["cp-1"].calls == []


def test_diff_replaces_only_with_the_vm_and_ignores_configuration_only_changes(pair):
    fakes, talosconfig = pair
    provider = NodeLifecycleProvider()
    olds = provider.create(_props(fakes, talosconfig)).outs
    same = provider.diff("id", olds, _props(fakes, talosconfig, machine_configuration="other: config\n"))
    assert same.changes is False
    moved = provider.diff("id", olds, _props(fakes, talosconfig, address="10.5.0.9",
                                             installer_image="installer:" + NEW, talos_version=NEW))
    assert moved.changes is True and moved.replaces == []


def test_adding_a_node_changes_only_the_talosconfig_endpoints_which_is_no_change_here(pair, bundle):
    fakes, talosconfig = pair
    provider = NodeLifecycleProvider()
    olds = provider.create(_props(fakes, talosconfig)).outs
    document = yaml.safe_load(talosconfig)
    document["contexts"]["test"]["endpoints"].append("10.5.0.3")
    document["contexts"]["test"]["nodes"] = ["10.5.0.3"]
    more_endpoints = yaml.safe_dump(document)
    assert provider.diff("id", olds, _props(fakes, more_endpoints)).changes is False
    other_cluster = make_talosconfig(secrets_bundle.generate_secrets(seed.TALOS_VERSION), "test",
                                     [fakes["cp-1"].endpoint])
    assert provider.diff("id", olds, _props(fakes, other_cluster)).changes is True


def test_installer_image_change_upgrades_the_node_and_waits_for_it(pair):
    fakes, talosconfig = pair
    provider = NodeLifecycleProvider()
    olds = provider.create(_props(fakes, talosconfig)).outs
    image = f"factory.talos.dev/installer/{seed.SCHEMATIC}:{NEW}"
    outs = provider.update("id", olds, _props(fakes, talosconfig, installer_image=image, talos_version=NEW)).outs
    assert outs["installer_image"] == image
    (upgrade,) = fakes["cp-1"].calls_for("Upgrade")
    assert upgrade.request.image == image
    assert fakes["cp-1"].version_tag == NEW
    assert fakes["cp-1"].calls_for("ApplyConfiguration") == []
    # The last health check, after the reboot: the node (apid, boot status, services), then etcd as the
    # node and each member it lists (cp-1, cp-2, cp-3: asked through cp-1's apid) see it.
    assert [(c.rpc, c.metadata.get("node")) for c in fakes["cp-1"].calls[-10:]] == [
        ("Version", ["10.5.0.1"]), ("Get", ["10.5.0.1"]), ("ServiceList", ["10.5.0.1"]),
        ("EtcdMemberList", ["10.5.0.1"]),
        ("EtcdMemberList", ["10.5.0.1"]), ("ServiceList", ["10.5.0.1"]),
        ("EtcdMemberList", ["10.5.0.2"]), ("ServiceList", ["10.5.0.2"]),
        ("EtcdMemberList", ["10.5.0.3"]), ("ServiceList", ["10.5.0.3"])]
    assert fakes["cp-2"].calls == [] and fakes["cp-3"].calls == []


def test_delete_leaves_etcd_then_resets(pair):
    fakes, talosconfig = pair
    provider = NodeLifecycleProvider()
    outs = provider.create(_props(fakes, talosconfig)).outs
    provider.delete("id", outs)
    rpcs = [c.rpc for c in fakes["cp-1"].calls if c.rpc in ("EtcdLeaveCluster", "Reset")]
    assert rpcs == ["EtcdLeaveCluster", "Reset"]
    assert fakes["cp-2"].calls_for("EtcdRemoveMemberByID") == []


def test_delete_of_an_unreachable_control_plane_removes_it_through_a_talosconfig_endpoint(pair):
    fakes, talosconfig = pair
    provider = NodeLifecycleProvider()
    outs = provider.create(_props(fakes, talosconfig, timeout_seconds=2))
    fakes["cp-1"].go_down()
    provider.delete("id", outs.outs)
    (removal,) = fakes["cp-2"].calls_for("EtcdRemoveMemberByID")
    assert removal.request.member_id == 0x100  # cp-1's member, found by its address
    assert fakes["cp-1"].calls_for("Reset") == []


def test_roll_predecessors_chain_control_planes_first():
    nodes = [RollNode("w1", "10.0.0.4", "worker"), RollNode("cp1", "10.0.0.1", "controlplane"),
             RollNode("cp2", "10.0.0.2", "controlplane")]
    assert roll_predecessors(nodes) == {"cp1": None, "cp2": "cp1", "w1": "cp2"}


def test_resource_marks_credentials_and_config_secret(bundle):
    import pulumi

    from tests.support.day_two import recording_mocks

    monitor = recording_mocks(lambda args: dict(args.inputs))

    @pulumi.runtime.test
    def check():
        first = node_lifecycle.NodeLifecycle(
            "lifecycle-cp-1", node_name="cp-1", address="10.5.0.1", role="controlplane", installer_image="i:v1",
            talos_version="v1", talosconfig="tc")
        second = node_lifecycle.NodeLifecycle(
            "lifecycle-w-1", node_name="w-1", address="10.5.0.11", role="worker", installer_image="i:v1",
            talos_version="v1", talosconfig="tc", opts=pulumi.ResourceOptions(depends_on=[first]))

        def verify(_):
            by_name = {r.name: r for r in monitor.registrations}
            for registration in by_name.values():
                assert "talosconfig" in registration.additional_secret_outputs
            assert by_name["lifecycle-cp-1"].urn in by_name["lifecycle-w-1"].dependencies

        return pulumi.Output.all(first.urn, second.urn).apply(verify)

    check()


# --- wiring in the program ------------------------------------------------------------------------

DYNAMIC = "pulumi-python:dynamic:Resource"
VM = "proxmoxve:index/vmLegacy:VmLegacy"


def _by_name(run):
    return {(r.type, r.name): r for r in run.registrations}


def test_program_chains_lifecycles_in_roll_order_after_each_vm_and_before_each_apply():
    from tests.program.mocked_program import run_program, stack_config

    config = stack_config("test-cluster")
    run = run_program(config)
    regs = _by_name(run)
    names = [n["name"] for n in config["nodes"]]
    order = [n["name"] for n in config["nodes"] if n["role"] == "controlplane"] + \
            [n["name"] for n in config["nodes"] if n["role"] == "worker"]
    assert len(run.named("lifecycle-", DYNAMIC)) == len(names) == 9
    for previous, name in zip([None, *order], order):
        lifecycle = regs[(DYNAMIC, f"lifecycle-{name}")]
        deps = set(lifecycle.dependencies)
        assert regs[(VM, name)].urn in deps
        lifecycles_before = {r.urn for r in run.named("lifecycle-", DYNAMIC)} & deps
        assert lifecycles_before == ({regs[(DYNAMIC, f"lifecycle-{previous}")].urn} if previous else set())
        assert lifecycle.urn in regs[(DYNAMIC, f"apply-{name}")].dependencies
        assert "talosconfig" in lifecycle.additional_secret_outputs
        assert lifecycle.inputs["installer_image"] == run.exports["installerImage"]


def test_adding_a_worker_adds_only_its_resources():
    from tests.program.mocked_program import run_program, stack_config

    config = stack_config("test-cluster")
    before = {r.urn: r for r in run_program(config).registrations}
    config["nodes"].append({"name": "worker-7", "role": "worker", "vmId": 210, "cpu": 3, "memory": 6144, "disk": 15,
                            "ip": "10.255.200.210", "mac": "bc:24:11:80:a1:a4"})
    after = {r.urn: r for r in run_program(config).registrations}
    added = {(after[u].type, after[u].name) for u in after.keys() - before.keys()}
    assert (DYNAMIC, "lifecycle-worker-7") in added and (VM, "worker-7") in added
    assert not before.keys() - after.keys()
    changed = {(after[u].type, after[u].name) for u in before if after[u].inputs != before[u].inputs}
    # Only the health and install waits count the nodes (the latter waits for the new one only), and
    # each lifecycle's place in the roll ("3 of 10") changes, which its diff ignores, as the Kubernetes
    # upgrade's diff ignores its node list (only a version change is an upgrade).
    assert changed == ({(DYNAMIC, "health"), (DYNAMIC, "nodes-installed"), (DYNAMIC, "node-changes"),
                        (DYNAMIC, "kubernetes-upgrade")}
                       | {(DYNAMIC, f"lifecycle-{n['name']}") for n in config["nodes"][:-1]})
    upgrade = next(urn for urn in before if before[urn].name == "kubernetes-upgrade")
    assert not KubernetesUpgradeProvider().diff("id", before[upgrade].inputs, after[upgrade].inputs).changes
    provider = NodeLifecycleProvider()
    for urn in before:
        if after[urn].name.startswith("lifecycle-"):
            assert after[urn].inputs["position"] != before[urn].inputs["position"]
            assert not provider.diff("id", before[urn].inputs, after[urn].inputs).changes, after[urn].name


def test_an_upgrade_prints_one_progress_line_per_step(pair, capfd):
    """The engine shows a dynamic provider's stderr: each step, named by node, with the time it took."""
    fakes, talosconfig = pair
    provider = NodeLifecycleProvider()
    olds = provider.create(_props(fakes, talosconfig)).outs
    image = f"factory.talos.dev/installer/{seed.SCHEMATIC}:{NEW}"
    provider.update("id", olds, _props(fakes, talosconfig, installer_image=image, talos_version=NEW))
    lines = capfd.readouterr().err.splitlines()
    steps = [line.split(": ")[2].split(" (")[0] for line in lines if line.startswith("talos-proxmox: upgrade cp-1: ")]
    assert steps == ["healthy-before", "upgrade-requested", "rebooted", "healthy"]
    assert all(line.endswith("s)") for line in lines if line.startswith("talos-proxmox: upgrade"))


def test_the_clusters_locks_are_named_by_its_ca(pair, bundle):
    from talos_proxmox.day_two.cluster_lock import key_for as cluster_key

    _, talosconfig = pair
    other = make_talosconfig(secrets_bundle.generate_secrets("v1.13.7"), "other", ["10.9.9.9:50000"])
    assert cluster_key(talosconfig) == cluster_key(make_talosconfig(bundle, "renamed", ["10.0.0.1:50000"]))
    assert cluster_key(talosconfig) != cluster_key(other) and len(cluster_key(talosconfig)) == 16


def test_delete_removes_the_kubernetes_node_through_another_control_plane(pair, capfd):
    """After leaving etcd and the reset, the Node object goes too, with a kubeconfig from a control plane
    that stays; it would otherwise sit NotReady in `kubectl get nodes` for good."""
    from tests.stand_ins.kubernetes_api import StandInApi, coredns, node as k8s_node

    fakes, talosconfig = pair
    api = StandInApi([([k8s_node("cp-1", True), k8s_node("cp-2", True)], coredns(1))])
    try:
        api.deletable = {"cp-1"}
        fakes["cp-2"].kubeconfig_yaml = api.kubeconfig()
        provider = NodeLifecycleProvider()
        provider.delete("id", provider.create(_props(fakes, talosconfig)).outs)
        assert ("DELETE /api/v1/nodes/cp-1", "") in api.requests
        assert fakes["cp-2"].calls_for("Kubeconfig") and not fakes["cp-1"].calls_for("Kubeconfig")
        reset = fakes["cp-1"].calls_for("Reset")[0]
        assert fakes["cp-2"].calls_for("Kubeconfig")[0].at > reset.at  # only once the node is out
        assert f"talos-proxmox: remove cp-1: kubernetes-node-deleted via {fakes['cp-2'].endpoint}" in capfd.readouterr().err
    finally:
        api.close()


def test_without_a_remaining_control_plane_the_node_object_is_reported_not_deleted(pair, capfd):
    fakes, talosconfig = pair
    provider = NodeLifecycleProvider()
    provider.delete("id", provider.create(_props(fakes, talosconfig)).outs)  # cp-2's kubeconfig is unusable
    err = capfd.readouterr().err
    assert "talos-proxmox: remove cp-1: kubernetes-node-not-deleted (" in err and "KubeconfigError" in err


def test_an_upgrade_on_talos_1_13_drains_through_the_kubeconfig_a_control_plane_gives(pair, capfd):
    from tests.stand_ins.kubernetes_api import StandInApi, coredns, node as k8s_node, workload_pod

    fakes, talosconfig = pair
    api = StandInApi([([k8s_node(name, True) for name in fakes], coredns(1))])
    try:
        for fake in fakes.values():
            fake.version_tag = "v1.13.7"
            fake.kubeconfig_yaml = api.kubeconfig()
        api.pods = [workload_pod("web-1", "cp-1"), workload_pod("web-2", "cp-2")]
        provider = NodeLifecycleProvider()
        olds = provider.create(_props(fakes, talosconfig, talos_version="v1.13.7")).outs
        image = f"factory.talos.dev/installer/{seed.SCHEMATIC}:v1.13.8"
        provider.update("id", olds, _props(fakes, talosconfig, installer_image=image, talos_version="v1.13.8"))
        cp1 = fakes["cp-1"]
        assert cp1.version_tag == "v1.13.8" and cp1.calls_for("Upgrade") == []
        # the kubeconfig from the node itself (a control plane, healthy), before anything was installed
        assert cp1.calls_for("Kubeconfig")[0].at < cp1.calls_for("ImageService/Pull")[0].at
        assert [what for _, what, _ in api.changes] == [
            "PATCH /api/v1/nodes/cp-1", "POST /api/v1/namespaces/default/pods/web-1/eviction", "PATCH /api/v1/nodes/cp-1"]
        assert api.changes[1][0] < cp1.calls_for("Reboot")[0].at < api.changes[2][0]
        assert [p["metadata"]["name"] for p in api.pods] == ["web-2"] and api.unschedulable == {"cp-1": False}
        err = capfd.readouterr().err
        assert "talos-proxmox: upgrade cp-1: drained (1 pod(s) evicted)" in err
        assert "talos-proxmox: upgrade cp-1: uncordoned" in err
    finally:
        api.close()


def test_an_upgrade_on_talos_1_13_without_a_usable_kubeconfig_changes_nothing(pair):
    fakes, talosconfig = pair
    for fake in fakes.values():
        fake.version_tag = "v1.13.7"  # kubeconfig_yaml stays the stand-in's empty one: no cluster in it
    provider = NodeLifecycleProvider()
    olds = provider.create(_props(fakes, talosconfig, talos_version="v1.13.7")).outs
    image = f"factory.talos.dev/installer/{seed.SCHEMATIC}:v1.13.8"
    with pytest.raises(RollError) as failed:
        provider.update("id", olds, _props(fakes, talosconfig, installer_image=image, talos_version="v1.13.8"))
    assert str(failed.value) == (f"node cp-1 (10.5.0.1): not upgraded: it must be drained first, and no control plane "
                                 f"gave a kubeconfig (cp-1: KubeconfigError; {fakes['cp-2'].endpoint}: KubeconfigError)")
    assert fakes["cp-1"].calls_for("ImageService/Pull") == [] and fakes["cp-1"].version_tag == "v1.13.7"
