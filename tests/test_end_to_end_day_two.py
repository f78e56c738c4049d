"""Day two, end to end: `pulumi up` of the real program (tests/e2e_engine.py) after the cluster exists.

Same engine and stand-ins as tests/test_end_to_end.py: the real dynamic providers against one
FakeTalosNode per node on 127.0.0.2-5:50000 (three control planes sharing one etcd member list, one
worker) and the Image Factory stand-in. The ups, in order, each after its preview:
  first       a new cluster on Talos v1.13.7, Kubernetes 1.36.2 (the Talos line's default);
  kubernetes  cluster.kubernetesVersion 1.36.3: the new configuration reaches one node at a time,
              control planes first, each healthy again before the next;
  hardware    every node from 2 to 4 cores and 4096 to 6144 MiB: the VMs take it as pending config,
              then in roll order each node is shut down through Talos (drained) and its VM started
              through the Proxmox API, healthy before the next;
  failed      Talos v1.13.8 (pull, install, drain, reboot, uncordon) while e2e-cp-2 fails its health check
              after its upgrade: the up fails naming it, e2e-cp-2 is uncordoned all the same, later
              nodes are not upgraded, e2e-cp-1 stays upgraded in the state;
  resumed     the same up once e2e-cp-2 is well again: it continues at e2e-cp-2, not at e2e-cp-1;
  cp_removed  e2e-cp-3 taken out of the stack: it leaves etcd, then is reset, then its VM goes;
  unreachable e2e-cp-2 powered off, then taken out of the stack: its etcd member is removed through
              e2e-cp-1, no reset is attempted, and the up succeeds;
  renamed, new_vm_ids, shrunk  refused in the preview: cluster.name, two nodes' vmIds at once,
              e2e-cp-1's disk (VM replacements that happen: tests/test_end_to_end_vm_replacement.py).
"""

from __future__ import annotations

import time

import grpc
import pytest
import yaml
from pulumi.output import Unknown

from providers import node_lifecycle

from talos_proxmox.talos_config import client_config
from talos_proxmox.talos_api import operations
from providers import talos_operations
from talos_proxmox.talos_api.client import read_talosconfig
from tests.day_two import upgrade_timeline
from tests.e2e_engine import Up, e2e_cluster, e2e_config
from tests.talos_api_server import FakeTalosNode, RecordedCall, shared_bundle

CP1, CP2, CP3, WORKER = "e2e-cp-1", "e2e-cp-2", "e2e-cp-3", "e2e-worker-1"
NODES = [(CP1, "controlplane", "127.0.0.2"), (CP2, "controlplane", "127.0.0.3"),
         (CP3, "controlplane", "127.0.0.4"), (WORKER, "worker", "127.0.0.5")]
ROLL_ORDER = [CP1, CP2, CP3, WORKER]
TALOS, UPGRADE = "v1.13.7", "v1.13.8"
KUBERNETES, NEW_KUBERNETES = "1.36.2", "1.36.3"
HEALTH_FAILURE = "service kubelet: failed to start after upgrade (stand-in)"
CP2_MEMBER_ID = 0x101  # the shared etcd's member ids are 0x100 + the node's index
BIGGER = {"cpu": 4, "memory": 6144}  # the dev stack's nodes have 2 cores and 4096 MiB
VM_IDS = {name: 9100 + int(ip.rsplit(".", 1)[1]) for name, _, ip in NODES}  # as e2e_config numbers them


def fail_health_after_upgrade(fake: FakeTalosNode) -> None:
    """From its next install of an upgrade on (done as Talos does), the node's health check (ServiceList)
    fails hard."""

    def upgrade(node: FakeTalosNode, request, context):
        node.behaviours["ServiceList"] = failing_service_list
        return FakeTalosNode._rpc_LifecycleService_Upgrade(node, request, context)

    def failing_service_list(_node, _request, context):
        context.abort(grpc.StatusCode.INTERNAL, HEALTH_FAILURE)

    fake.behaviours["LifecycleService/Upgrade"] = upgrade


def recover(fake: FakeTalosNode) -> None:
    for rpc in ("LifecycleService/Upgrade", "ServiceList"):
        fake.behaviours.pop(rpc, None)


@pytest.fixture(scope="module")
def ups(tmp_path_factory) -> dict:
    with e2e_cluster(NODES, TALOS, tmp_path_factory) as cluster:
        url = cluster.factory.url
        done = {"first": cluster.up(e2e_config(url, NODES, TALOS))}
        done["kubernetes"] = cluster.up(e2e_config(url, NODES, TALOS, kubernetes_version=NEW_KUBERNETES))
        done["hardware"] = cluster.up(e2e_config(url, NODES, TALOS, kubernetes_version=NEW_KUBERNETES,
                                                 hardware=BIGGER))
        done["pve"] = cluster.pve
        # The VMs as the hardware up left them (later ups destroy some), and when it ended.
        done["hardware_vms"] = {name: (dict(vm.config), dict(vm.pending))
                                for name in ROLL_ORDER for vm in [cluster.pve.vm(VM_IDS[name])]}
        done["hardware_end"] = time.monotonic()
        done["kube"] = cluster.kube

        def e2e_config_now(nodes, talos):  # what the stack says from here on
            return e2e_config(url, nodes, talos, kubernetes_version=NEW_KUBERNETES, hardware=BIGGER)

        upgrade = e2e_config_now(NODES, UPGRADE)
        fail_health_after_upgrade(cluster.nodes[CP2])
        done["failed"] = cluster.up(upgrade, fails=True)
        recover(cluster.nodes[CP2])
        done["resumed"] = cluster.up(upgrade)
        without_cp3 = [node for node in NODES if node[0] != CP3]
        done["cp_removed"] = cluster.up(e2e_config_now(without_cp3, UPGRADE))
        cluster.nodes[CP2].go_down()
        without_cp2 = [node for node in without_cp3 if node[0] != CP2]
        done["unreachable"] = cluster.up(e2e_config_now(without_cp2, UPGRADE))
        done["etcd"] = {name: [m.hostname for m in cluster.nodes[name].etcd_members] for name in (CP1, CP2, CP3)}
        renamed = e2e_config_now(without_cp2, UPGRADE)
        renamed["cluster"]["name"] = "prod"
        done["renamed"] = cluster.up(renamed, fails=True)
        new_vm_ids = e2e_config_now(without_cp2, UPGRADE)
        new_vm_ids["nodes"][0]["vmId"], new_vm_ids["nodes"][1]["vmId"] = 9202, 9205  # e2e-cp-1 and the worker
        done["new_vm_ids"] = cluster.up(new_vm_ids, fails=True)
        shrunk = e2e_config_now(without_cp2, UPGRADE)
        shrunk["nodes"][0]["disk"] = 10  # e2e-cp-1, 20 GiB
        done["shrunk"] = cluster.up(shrunk, fails=True)
        yield done


def planned(up: Up, monitor_attr: str = "monitor") -> set[tuple[str, str]]:
    return {(step.name, step.op) for step in getattr(up, monitor_attr).steps}


def rpcs(calls: list[RecordedCall], *names: str) -> list[RecordedCall]:
    return [call for call in calls if call.rpc in names]


def kubelet_image(config: bytes) -> str:
    [v1alpha1] = [d for d in yaml.safe_load_all(config) if isinstance(d, dict) and d.get("version") == "v1alpha1"]
    return v1alpha1["machine"]["kubelet"]["image"]


ORDER = ["first", "kubernetes", "hardware", "failed", "resumed", "cp_removed", "unreachable"]


def test_each_preview_calls_no_node_and_plans_what_its_up_does(ups):
    counts = {"factory": 0, "pve": 0, **{n: 0 for n in ROLL_ORDER}}
    for name in ORDER:
        up = ups[name]
        assert up.after_preview == counts, name
        # one schematic, registered once
        counts = {"factory": 1, "pve": up.pve_requests, **{n: len(c) for n, c in up.calls.items()}}
        if name == "failed":  # the up stops at the failing node: it takes a part of the plan
            assert planned(up) < planned(up, "plan")
        else:
            assert planned(up) == planned(up, "plan"), name


# --- Kubernetes 1.36.2 -> 1.36.3 ------------------------------------------------------------------


def test_kubernetes_change_updates_each_nodes_config_lifecycle_and_apply_only(ups):
    up = ups["kubernetes"]
    assert up.steps("update") == {f"{kind}-{name}" for kind in ("machineconfig", "lifecycle", "apply")
                                  for name in ROLL_ORDER} | {"node-changes"}  # the latter records the version
    assert up.steps("create") == up.steps("delete") == set()
    assert {"secrets", "talosconfig", "bootstrap", "kubeconfig"} <= up.steps("same")
    assert (up.run.exports["talosconfig"], up.run.exports["kubeconfig"]) == (
        ups["first"].run.exports["talosconfig"], ups["first"].run.exports["kubeconfig"])
    for name in ROLL_ORDER:
        assert not rpcs(up.new_calls(ups["first"], name), "Upgrade", "ImageService/Pull", "LifecycleService/Upgrade",
                        "Bootstrap", "Kubeconfig", "Reset"), name


def test_kubernetes_change_reaches_one_node_at_a_time_control_planes_first(ups):
    first, up = ups["first"], ups["kubernetes"]
    new = {name: up.new_calls(first, name) for name in ROLL_ORDER}
    arrived = {}
    for name in ROLL_ORDER:
        applied = rpcs(new[name], "ApplyConfiguration")
        assert applied and all(c.request.data == up.rendered[name] for c in applied), name
        assert all((c.mode, c.roles) == ("configured", ("os:admin",)) for c in applied), name
        arrived[name] = applied[0].at
    assert [arrived[name] for name in ROLL_ORDER] == sorted(arrived.values())
    for before, after in zip(ROLL_ORDER, ROLL_ORDER[1:]):
        # healthy again (services listed after its new config) before the next node gets its own
        checked = [c.at for c in rpcs(new[before], "ServiceList") if c.at > arrived[before]]
        assert checked and min(checked) < arrived[after], (before, after)


def test_kubernetes_change_leaves_each_node_on_the_new_kubelet(ups):
    first, up = ups["first"], ups["kubernetes"]
    for name in ROLL_ORDER:
        assert kubelet_image(first.rendered[name]).endswith(f":v{KUBERNETES}"), name
        assert kubelet_image(up.rendered[name]) == f"ghcr.io/siderolabs/kubelet:v{NEW_KUBERNETES}", name
        assert up.calls[name] and rpcs(up.calls[name], "ApplyConfiguration")[-1].request.data == up.rendered[name]


# --- 2 -> 4 cores, 4096 -> 6144 MiB on every node --------------------------------------------------


def test_hardware_change_updates_each_vm_and_lifecycle_and_no_talos_config(ups):
    up = ups["hardware"]
    assert up.steps("update") == {f"lifecycle-{name}" for name in ROLL_ORDER} | {"node-changes"}
    assert {f"{kind}-{name}" for kind in ("machineconfig", "apply") for name in ROLL_ORDER} <= up.steps("same")
    for name in ROLL_ORDER:
        assert up.monitor.state_named(name).inputs["cpu"]["cores"] == 4, name
        assert up.monitor.state_named(f"lifecycle-{name}").outputs["vm"]["memory_mib"] == 6144, name
        # Talos is asked for its health and to shut down (drained), nothing else: no apply, no upgrade
        calls = up.new_calls(ups["kubernetes"], name)
        assert {c.rpc for c in calls} <= {"ServiceList", "EtcdMemberList", "Get", "Version", "Shutdown"}, name
        [shutdown] = rpcs(calls, "Shutdown")
        assert (shutdown.request.force, shutdown.roles) == (False, ("os:admin",)), name


def test_hardware_change_starts_each_vm_through_proxmox_in_roll_order(ups):
    pve = ups["pve"]
    vm = "/api2/json/nodes/pve/qemu/{}"
    puts = [(path, body) for method, path, body in pve.requests if method == "PUT"]
    # the provider's update of each running VM: the changed keys, kept pending
    assert sorted(puts) == sorted((vm.format(VM_IDS[name]) + "/config", b"cores=4&memory=6144") for name in ROLL_ORDER)
    assert pve.start_requests() == [vm.format(VM_IDS[name]) + "/status/start" for name in ROLL_ORDER]
    for name in ROLL_ORDER:
        config, pending = ups["hardware_vms"][name]
        assert (config["cores"], config["memory"]) == ("4", "6144"), name
        assert pending == {}, name


def test_hardware_change_never_has_two_nodes_down_and_each_is_healthy_before_the_next(ups):
    up, pve = ups["hardware"], ups["pve"]
    assert pve.most_down_at_once(ROLL_ORDER, until=ups["hardware_end"]) == 1
    events = {(e.name, e.what): e.at for e in pve.power_events if e.at <= ups["hardware_end"]}
    for before, after in zip(ROLL_ORDER, ROLL_ORDER[1:]):
        assert events[(before, "up")] < events[(after, "off")], (before, after)
        checked = [c.at for c in rpcs(up.new_calls(ups["kubernetes"], before), "ServiceList")
                   if events[(before, "up")] < c.at < events[(after, "off")]]
        assert checked, f"{before} was not seen healthy before {after} went down"
    for name in ROLL_ORDER:  # and seen healthy before its own reboot
        assert any(c.at < events[(name, "off")] for c in rpcs(up.new_calls(ups["kubernetes"], name), "ServiceList"))


# --- a Talos upgrade that stops at a failing node, then resumes -----------------------------------


def test_failed_upgrade_names_the_failing_node_and_upgrades_no_later_node(ups):
    before, failed = ups["hardware"], ups["failed"]
    message = str(failed.error)
    assert "e2e-cp-2 (127.0.0.3)" in message and HEALTH_FAILURE in message
    upgrades = {name: rpcs(failed.new_calls(before, name), "LifecycleService/Upgrade") for name in ROLL_ORDER}
    assert {name: len(calls) for name, calls in upgrades.items()} == {CP1: 1, CP2: 1, CP3: 0, WORKER: 0}
    assert upgrades[CP1][0].at < upgrades[CP2][0].at
    for name in (CP3, WORKER):
        assert failed.new_calls(before, name) == [], name  # not even a health check
    # e2e-cp-2 was drained and rebooted; once its health failed, it was uncordoned all the same
    since = upgrades[CP2][0].at
    until = min(c.at for name in ROLL_ORDER for c in ups["resumed"].new_calls(failed, name))
    assert upgrade_timeline({CP2: failed.new_calls(before, CP2)}, ups["kube"], since, until) == [
        (CP2, "LifecycleService/Upgrade"), ("kubernetes", f"cordon {CP2}"), ("kubernetes", f"evict default/app-{CP2}"),
        (CP2, "Reboot"), ("kubernetes", f"uncordon {CP2}")]


def test_failed_upgrade_keeps_the_first_node_upgraded_in_the_state(ups):
    failed = ups["failed"]
    installer = ups["resumed"].run.exports["installerImage"]
    assert installer.endswith(f":{UPGRADE}")
    images = {name: failed.monitor.state_named(f"lifecycle-{name}").outputs["installer_image"] for name in ROLL_ORDER}
    assert images[CP1] == installer
    assert all(images[name] != installer for name in (CP2, CP3, WORKER)), images
    assert {"lifecycle-e2e-cp-1"} <= failed.steps("update")
    assert not {f"lifecycle-{name}" for name in (CP2, CP3, WORKER)} & failed.steps("update")


def test_rerun_after_recovery_continues_at_the_failed_node(ups):
    """cp-2 had rebooted into the new version before its health failed: once healthy again it is not
    upgraded (rebooted) a second time; the roll checks it and goes on with the nodes after it."""
    failed, resumed = ups["failed"], ups["resumed"]
    upgrades = {name: rpcs(resumed.new_calls(failed, name), "LifecycleService/Upgrade") for name in ROLL_ORDER}
    assert {name: len(calls) for name, calls in upgrades.items()} == {CP1: 0, CP2: 0, CP3: 1, WORKER: 1}
    cp2_checks = rpcs(resumed.new_calls(failed, CP2), "ServiceList")
    assert cp2_checks and cp2_checks[-1].at < upgrades[CP3][0].at < upgrades[WORKER][0].at
    assert "lifecycle-e2e-cp-1" in resumed.steps("same")
    assert resumed.steps("update") >= {f"lifecycle-{name}" for name in (CP2, CP3, WORKER)}
    installer = resumed.run.exports["installerImage"]
    for name in ROLL_ORDER:
        assert resumed.monitor.state_named(f"lifecycle-{name}").outputs["installer_image"] == installer, name


# --- a control plane removed ----------------------------------------------------------------------


def test_removed_control_plane_leaves_etcd_then_is_reset_before_its_vm_goes(ups):
    before, removed = ups["resumed"], ups["cp_removed"]
    assert removed.steps("delete") == {CP3, f"machineconfig-{CP3}", f"lifecycle-{CP3}", f"apply-{CP3}"}
    assert removed.steps("create") == set()
    calls = removed.new_calls(before, CP3)
    [leave] = rpcs(calls, "EtcdLeaveCluster")
    [reset] = rpcs(calls, "Reset")
    assert (reset.request.graceful, reset.request.reboot, reset.roles) == (True, False, ("os:admin",))
    deleted = {step.name: step.at for step in removed.monitor.steps if step.op == "delete"}
    assert leave.at < reset.at < deleted[f"lifecycle-{CP3}"] < deleted[CP3]  # the VM goes last
    assert not rpcs(calls, "EtcdRemoveMemberByID")


def test_removing_a_control_plane_calls_no_other_node(ups):
    before, removed = ups["resumed"], ups["cp_removed"]
    # Beyond a Kubeconfig from a remaining control plane (to delete the Node object), nothing.
    for name in (CP1, CP2, WORKER):
        assert {c.rpc for c in removed.new_calls(before, name)} <= ({"Kubeconfig"} if name != WORKER else set()), name


def test_removing_a_control_plane_drops_it_from_the_talosconfig_only(ups):
    before, removed = ups["resumed"], ups["cp_removed"]
    assert read_talosconfig(removed.run.exports["talosconfig"]).endpoints == ("127.0.0.2", "127.0.0.3")
    # the last two: one node fewer, no wait
    assert removed.steps("update") == {"talosconfig", "node-changes", "nodes-installed"}
    assert removed.run.exports["kubeconfig"] == before.run.exports["kubeconfig"]


def test_unreachable_control_plane_is_removed_through_another_and_not_reset(ups):
    before, removed = ups["cp_removed"], ups["unreachable"]
    assert removed.error is None
    assert removed.steps("delete") == {CP2, f"machineconfig-{CP2}", f"lifecycle-{CP2}", f"apply-{CP2}"}
    # a quick look at which peers answer (Version), then the removal through the one that does
    cp1_calls = removed.new_calls(before, CP1)
    assert {c.rpc for c in cp1_calls} == {"Version", "EtcdMemberList", "EtcdRemoveMemberByID", "Kubeconfig"}
    assert rpcs(cp1_calls, "Version")[0].at < rpcs(cp1_calls, "EtcdMemberList")[0].at
    [removal] = rpcs(removed.new_calls(before, CP1), "EtcdRemoveMemberByID")
    assert (removal.request.member_id, removal.roles) == (CP2_MEMBER_ID, ("os:admin",))
    assert all(not rpcs(removed.new_calls(before, name), "Reset", "EtcdLeaveCluster") for name in ROLL_ORDER)
    assert removed.new_calls(before, WORKER) == []
    deleted = [step.name for step in removed.monitor.steps if step.op == "delete"]
    assert deleted.index(f"lifecycle-{CP2}") < deleted.index(CP2)  # the VM goes last
    assert ups["etcd"][CP1] == [CP1]
    assert read_talosconfig(removed.run.exports["talosconfig"]).endpoints == ("127.0.0.2",)


# --- what the up above needs of the providers: a talosconfig that only points elsewhere ------------


def talosconfig(bundle: dict, endpoints: list[str], certificate=None) -> str:
    cert, key = certificate or client_config.issue_admin_certificate(bundle)
    return client_config.talosconfig_with_certificate(bundle, "e2e", endpoints, endpoints[:1], cert, key)


def test_kubeconfig_is_fetched_again_for_new_credentials_not_for_other_endpoints():
    bundle = shared_bundle()
    certificate = client_config.issue_admin_certificate(bundle)
    before = talosconfig(bundle, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], certificate)
    olds = {"node": "127.0.0.2", "endpoint": None, "timeout_seconds": 600,
            "talosconfig_sha256": operations.config_sha256(before),
            "credentials_sha256": operations.credentials_sha256(before)}
    provider = talos_operations.KubeconfigProvider()
    fewer_endpoints = talosconfig(bundle, ["127.0.0.2", "127.0.0.3"], certificate)
    renewed = talosconfig(bundle, ["127.0.0.2", "127.0.0.3", "127.0.0.4"])
    assert provider.diff("k", olds, {**olds, "talosconfig": fewer_endpoints}).changes is False
    assert provider.diff("k", olds, {**olds, "talosconfig": renewed}).changes is True
    older_state = {k: v for k, v in olds.items() if k != "credentials_sha256"}  # made before the field
    assert provider.diff("k", older_state, {**older_state, "talosconfig": before}).changes is False
    assert provider.diff("k", older_state, {**older_state, "talosconfig": fewer_endpoints}).changes is True


def test_node_lifecycle_takes_an_unknown_talosconfig_as_unchanged_credentials():
    bundle = shared_bundle()
    olds = {"node_name": CP1, "address": "127.0.0.2", "endpoint": None, "role": "controlplane",
            "installer_image": "factory/installer/x:v1.13.7", "talos_version": TALOS,
            "kubernetes_version": KUBERNETES, "timeout_seconds": 1200, "reset_on_delete": True,
            "talosconfig": talosconfig(bundle, ["127.0.0.2", "127.0.0.3"])}
    provider = node_lifecycle.NodeLifecycleProvider()
    assert provider.diff(CP1, olds, {**olds, "talosconfig": Unknown()}).changes is False
    upgrade = {**olds, "talosconfig": Unknown(), "installer_image": "factory/installer/x:v1.13.8"}
    assert provider.diff(CP1, olds, upgrade).changes is True
    assert provider.diff(CP1, olds, {**olds, "talosconfig": talosconfig(bundle, ["127.0.0.2"])}).changes is True


def test_renaming_the_cluster_is_refused_before_anything_changes(ups):
    """cluster.name is in every node's config, keys discovery and owns the protected secrets: the first up
    of a new name stops in the configs' check, naming the key and the deployed name, with nothing changed."""
    before, renamed = ups["unreachable"], ups["renamed"]
    assert "talos-proxmox:cluster.name: 'prod' renames the deployed cluster 'dev'" in str(renamed.error)
    assert renamed.monitor.preview  # it stopped in the preview: the up itself never ran
    for name in ROLL_ORDER:
        assert renamed.new_calls(before, name) == [], name


def test_two_new_vms_in_one_up_are_refused_in_the_preview_before_any_vm(ups):
    before, refused = ups["renamed"], ups["new_vm_ids"]
    message = str(refused.error)
    assert ("::node-changes: check failed: nodes: nodes e2e-cp-1 (vmId 9102 -> 9202), e2e-worker-1 (vmId 9105 -> 9205) "
            "would each have their VM replaced in one up") in message
    assert "so replace one node per `pulumi up`" in message
    assert refused.monitor.preview and refused.pve_requests == before.pve_requests
    assert not [step for step in refused.monitor.steps if step.name in (CP1, WORKER)]  # no VM was planned
    for name in ROLL_ORDER:
        assert refused.new_calls(before, name) == [], name


def test_a_smaller_disk_is_refused_in_the_preview(ups):
    before, refused = ups["new_vm_ids"], ups["shrunk"]
    assert "node e2e-cp-1: disk 20 -> 10 GiB: Proxmox cannot shrink a disk" in str(refused.error)
    assert refused.monitor.preview and refused.pve_requests == before.pve_requests
    for name in ROLL_ORDER:
        assert refused.new_calls(before, name) == [], name
