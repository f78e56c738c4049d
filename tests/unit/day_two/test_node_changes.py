"""What one up may change about the nodes (talos_proxmox.day_two.node_changes), as NodeChanges checks it
before any VM is touched, and how the node's resources take a replaced VM: its lifecycle and apply ask
to be replaced along with it (delete-before-replace), its install is waited for again.

Through the real CLI: tests/test_engine_vm_replacement.py."""

import pytest
from pulumi.output import Unknown

from providers.node_lifecycle import REMOVE_AND_ADD, NodeChangesProvider, NodeLifecycleProvider
from providers.talos_operations import ConfigurationApplyProvider, _installing, _rejoining
from talos_proxmox.day_two import node_changes

VM = dict(host="pve1", vm_id=9101, mac="bc:24:11:00:01:01", cores=2, memory_mib=4096, cpu_type="host",
          disk_gb=20, data_disk_gb=None)
INSTALLER = "factory.talos.dev/installer/abc:v1.13.7"


def vm(number: int, **changes) -> dict:
    return {**VM, "vm_id": 9100 + number, "mac": f"bc:24:11:00:01:{number:02x}", **changes}


def plan(nodes=None, **changes) -> dict:
    """cp-1..3 and w-1 as the last up left them, with `nodes` {name: vm changes} applied."""
    base = {"cp-1": ("controlplane", 1), "cp-2": ("controlplane", 2), "cp-3": ("controlplane", 3), "w-1": ("worker", 4)}
    return {"installer_image": INSTALLER, "kubernetes_version": "1.36.2",
            "nodes": {name: {"role": role, "vm": vm(number, **(nodes or {}).get(name, {}))}
                      for name, (role, number) in base.items()}, **changes}


OLD = plan()


# --- one replaced VM, alone ---------------------------------------------------------------------

@pytest.mark.parametrize("change, line", [
    ({"vm_id": 9202}, "vmId 9102 -> 9202"),
    ({"mac": "bc:24:11:00:02:02"}, "mac 'bc:24:11:00:01:02' -> 'bc:24:11:00:02:02'"),
    ({"host": "pve2"}, "proxmoxNode 'pve1' -> 'pve2'"),
])
def test_a_new_vm_id_mac_or_host_replaces_that_nodes_vm_and_is_allowed_alone(change, line):
    new = plan({"cp-2": change})
    assert node_changes.replaced_nodes(OLD, new) == {"cp-2": [line]}
    assert node_changes.problems(OLD, new) == []


def test_a_replaced_vm_may_come_with_its_own_new_hardware():
    new = plan({"w-1": {"vm_id": 9204, "cores": 4}})
    assert node_changes.problems(OLD, new) == []


def test_nothing_is_replaced_by_hardware_a_bigger_disk_or_a_vm_id_proxmox_picks():
    assert node_changes.replaced_nodes(OLD, plan({"cp-1": {"cores": 8, "disk_gb": 40}})) == {}
    picked = plan({"cp-1": {"vm_id": None}})
    assert node_changes.replaced_nodes(picked, OLD) == {} and node_changes.replaced_nodes(OLD, picked) == {}


def test_numbers_read_back_from_the_engine_as_floats_are_the_same_numbers():
    through_the_engine = plan({name: {"vm_id": float(9100 + n), "cores": 2.0, "disk_gb": 20.0}
                               for name, n in (("cp-1", 1), ("cp-2", 2), ("cp-3", 3), ("w-1", 4))})
    assert node_changes.problems(through_the_engine, OLD) == []
    assert node_changes.replaced_nodes(through_the_engine, plan({"cp-1": {"vm_id": 9201}})) == {
        "cp-1": ["vmId 9101 -> 9201"]}


def test_the_first_up_has_nothing_to_compare():
    assert node_changes.problems(None, plan({"cp-1": {"vm_id": 1}, "cp-2": {"vm_id": 2}})) == []


# --- refused ------------------------------------------------------------------------------------

def test_two_replaced_vms_in_one_up_are_refused_naming_both():
    new = plan({"cp-2": {"vm_id": 9202}, "w-1": {"mac": "bc:24:11:00:02:04"}})
    reordered = {**new, "nodes": dict(reversed(new["nodes"].items()))}  # as the engine may hand them over
    assert node_changes.problems(OLD, reordered) == node_changes.problems(OLD, new)
    [problem] = node_changes.problems(OLD, new)
    assert problem == ("nodes cp-2 (vmId 9102 -> 9202), w-1 (mac 'bc:24:11:00:01:04' -> 'bc:24:11:00:02:04') would "
                       "each have their VM replaced in one up; a replaced VM takes its node out of the cluster (etcd "
                       "leave, reset) and back in (a first apply on the new VM), so replace one node per `pulumi up`")


@pytest.mark.parametrize("other, named", [
    ({"installer_image": "factory.talos.dev/installer/abc:v1.13.8"},
     f"the Talos installer {INSTALLER} -> factory.talos.dev/installer/abc:v1.13.8"),
    ({"kubernetes_version": "1.36.3"}, "kubernetesVersion 1.36.2 -> 1.36.3"),
    ({"nodes": {"cp-1": {"cores": 4}}}, "node cp-1's cpu 2 -> 4"),
    ({"nodes": {"w-1": {"cpu_type": "x86-64-v3"}}}, "node w-1's proxmox.cpuType host -> x86-64-v3"),
])
def test_a_replaced_vm_with_another_change_that_rolls_nodes_is_refused_naming_it(other, named):
    changes = dict(other)
    nodes = {"cp-2": {"vm_id": 9202}, **changes.pop("nodes", {})}
    [problem] = node_changes.problems(OLD, plan(nodes, **changes))
    assert problem == ("node cp-2: vmId 9102 -> 9202 replaces its VM, which takes the node out of the cluster and "
                       f"back in; make that the only node change of its `pulumi up` (this one also changes: {named})")


def test_a_data_disk_is_checked_when_the_boot_disk_was_not_recorded():
    unrecorded = plan({"w-1": {"disk_gb": None, "data_disk_gb": 50}})
    [shrunk] = node_changes.problems(unrecorded, plan({"w-1": {"disk_gb": None, "data_disk_gb": 40}}))
    assert shrunk.startswith("node w-1: dataDisk.size 50 -> 40 GiB")


def test_every_change_is_named_when_there_are_several():
    both = plan({"cp-2": {"vm_id": 9202, "mac": "bc:24:11:00:02:02"}},
                installer_image="factory.talos.dev/installer/abc:v1.13.8", kubernetes_version="1.36.3")
    [problem] = node_changes.problems(OLD, both)
    assert problem.startswith("node cp-2: vmId 9102 -> 9202, mac 'bc:24:11:00:01:02' -> 'bc:24:11:00:02:02' replaces")
    assert problem.endswith(f"(this one also changes: the Talos installer {INSTALLER} -> "
                            "factory.talos.dev/installer/abc:v1.13.8; kubernetesVersion 1.36.2 -> 1.36.3)")


def test_a_replaced_vm_with_a_node_added_or_removed_is_refused():
    added = plan({"cp-2": {"vm_id": 9202}})
    added["nodes"]["w-2"] = {"role": "worker", "vm": vm(5)}
    removed = plan({"cp-2": {"vm_id": 9202}})
    del removed["nodes"]["w-1"]
    assert node_changes.problems(OLD, added)[0].endswith("(this one also changes: node w-2 added)")
    assert node_changes.problems(OLD, removed)[0].endswith("(this one also changes: node w-1 removed)")


def test_the_only_control_planes_vm_is_never_replaced():
    old = {**OLD, "nodes": {"cp-1": OLD["nodes"]["cp-1"], "w-1": OLD["nodes"]["w-1"]}}
    new = {**old, "nodes": {**old["nodes"], "cp-1": {"role": "controlplane", "vm": vm(1, vm_id=9201)}}}
    assert node_changes.problems(old, new) == [
        "node cp-1: vmId 9101 -> 9201 would replace the VM of the cluster's only control plane, and etcd with it; "
        "add a second control plane first (one `pulumi up`), then replace this one"]


@pytest.mark.parametrize("change, expected", [
    ({"disk_gb": 10}, "node cp-1: disk 20 -> 10 GiB: Proxmox cannot shrink a disk; keep 20 GiB or more, or to change "
                      "it, take cp-1 out of nodes and `pulumi up` (it leaves etcd and is reset), then add it back with "
                      "the new disk and `pulumi up` again"),
    ({"disk_gb": 10.0}, "node cp-1: disk 20 -> 10 GiB: Proxmox cannot shrink a disk"),
])
def test_a_smaller_disk_is_refused_with_the_way_to_do_it(change, expected):
    [problem] = node_changes.problems(OLD, plan({"cp-1": change}))
    assert problem.startswith(expected)


def test_a_data_disk_may_be_added_or_grown_but_not_removed_or_shrunk():
    with_data = plan({"w-1": {"data_disk_gb": 50}})
    assert node_changes.problems(OLD, with_data) == []
    assert node_changes.problems(with_data, plan({"w-1": {"data_disk_gb": 80}})) == []
    [removed] = node_changes.problems(with_data, OLD)
    assert removed == ("node w-1: dataDisk removed (was 50 GiB): its data would be lost; to change it, take w-1 out "
                       "of nodes and `pulumi up` (it leaves etcd and is reset), then add it back with the new disks "
                       "and `pulumi up` again")
    [shrunk] = node_changes.problems(with_data, plan({"w-1": {"data_disk_gb": 40}}))
    assert shrunk.startswith("node w-1: dataDisk.size 50 -> 40 GiB: Proxmox cannot shrink a disk; keep 50 GiB or more")


def _with_volume(volume, **vm_changes):
    with_data = plan({"w-1": {"data_disk_gb": 50, **vm_changes}})
    with_data["nodes"]["w-1"]["data_volume"] = volume
    return with_data


LEGACY_VOLUME = {"form": "machine.disks", "mountpoint": "/var/lib/longhorn"}
USER_VOLUME = {"form": "user volume", "mountpoint": "/var/mnt/longhorn"}


@pytest.mark.parametrize("new_volume, shown", [
    (USER_VOLUME, "machine.disks at /var/lib/longhorn -> user volume at /var/mnt/longhorn"),
    ({"form": "machine.disks", "mountpoint": "/var/lib/data"},
     "machine.disks at /var/lib/longhorn -> machine.disks at /var/lib/data"),
])
def test_a_data_disk_mounted_anew_is_refused_naming_both_mounts(new_volume, shown):
    # Talos 1.13 -> 1.14 moves a data disk to a user volume: Talos would look for a volume the disk lacks.
    [problem] = node_changes.problems(_with_volume(LEGACY_VOLUME), _with_volume(new_volume))
    assert problem == (f"node w-1: its data disk would be mounted anew ({shown}), and Talos would not find its "
                       "data there; keep the data disk as it is, or to change it, take w-1 out of nodes and "
                       "`pulumi up` (it leaves etcd and is reset), then add it back with the new data disk and "
                       "`pulumi up` again (it comes back empty: move the data off first, e.g. let Longhorn "
                       "re-replicate, one node at a time)")


def test_a_data_disk_kept_grown_added_or_recorded_before_its_mount_is_no_problem():
    assert node_changes.problems(_with_volume(LEGACY_VOLUME), _with_volume(dict(LEGACY_VOLUME), data_disk_gb=80)) == []
    assert node_changes.problems(OLD, _with_volume(USER_VOLUME)) == []  # a new data disk
    unrecorded = plan({"w-1": {"data_disk_gb": 50}})  # a plan from before data volumes were recorded
    assert node_changes.problems(unrecorded, _with_volume(LEGACY_VOLUME)) == []


def test_a_plan_from_before_data_volumes_were_recorded_had_machine_disks():
    [problem] = node_changes.problems(plan({"w-1": {"data_disk_gb": 50}}), _with_volume(USER_VOLUME))
    assert problem.startswith("node w-1: its data disk would be mounted anew (machine.disks at its mountpoint "
                              "then -> user volume at /var/mnt/longhorn)")


# --- the NodeChanges provider -------------------------------------------------------------------

def test_node_changes_checks_the_new_plan_against_the_recorded_one():
    provider = NodeChangesProvider()
    recorded = provider.create(OLD).outs
    assert recorded == {**OLD, "talos_version": None, "allow_downgrade": None} and provider.check({}, plan({"cp-1": {"vm_id": 1}, "cp-2": {"vm_id": 2}})).failures == []
    failures = provider.check(recorded, plan({"cp-1": {"vm_id": 1}, "cp-2": {"vm_id": 2}})).failures
    assert [(f.property, f.reason.split(" would ")[0]) for f in failures] == [
        ("nodes", "nodes cp-1 (vmId 9101 -> 1), cp-2 (vmId 9102 -> 2)")]
    assert provider.diff("id", recorded, OLD).changes is False
    assert provider.diff("id", recorded, plan({"w-1": {"cores": 4}})).changes is True
    assert provider.update("id", recorded, plan({"w-1": {"cores": 4}})).outs["nodes"]["w-1"]["vm"]["cores"] == 4


# --- the node's own resources with a replaced VM ------------------------------------------------

def lifecycle_props(**changes) -> dict:
    return {"node_name": "cp-2", "address": "10.5.0.2", "endpoint": None, "role": "controlplane",
            "installer_image": INSTALLER, "talos_version": "v1.13.7", "kubernetes_version": "1.36.2",
            "timeout_seconds": 10, "reset_on_delete": True, "etcd_snapshots": None, "vm": vm(2), "vm_id": 9102.0,
            "vm_replacement": REMOVE_AND_ADD, "position": "2 of 4", "talosconfig": "context: x\n", **changes}


def test_the_lifecycle_is_replaced_first_when_its_vm_is():
    provider = NodeLifecycleProvider()
    olds = lifecycle_props()
    # What the engine asks when it works out a delete-before-replace of the VM: the VM's id unknown.
    asked = provider.diff("id", olds, {**olds, "vm_id": Unknown()})
    assert (asked.replaces, asked.delete_before_replace) == (["vm_id"], True)
    assert provider.diff("id", olds, {**olds, "vm_id": 9202}).replaces == ["vm_id"]
    unchanged = provider.diff("id", olds, {**olds, "vm_id": 9102})
    assert (unchanged.changes, unchanged.replaces) == (False, [])
    moved = provider.diff("id", olds, {**olds, "address": "10.5.0.9"})  # anything else is an update
    assert (moved.changes, moved.replaces) == (True, [])


def test_a_lifecycle_from_before_replacements_stops_the_plan_until_it_is_recorded():
    provider = NodeLifecycleProvider()
    older = {key: value for key, value in lifecycle_props().items() if key != "vm_replacement"}
    with pytest.raises(ValueError) as refused:
        provider.diff("id", older, {**lifecycle_props(), "vm_id": Unknown()})
    assert str(refused.value) == (
        "node cp-2: its VM would be replaced, and its state comes from a version of this program that kept VMs "
        "instead; `pulumi up` once without this change (it records the node as this version does), then make it")
    recorded = provider.diff("id", older, lifecycle_props())  # the first up records it
    assert (recorded.changes, recorded.replaces) == (True, [])


def test_the_apply_is_replaced_with_its_vm_and_a_state_without_the_id_only_records_it():
    provider = ConfigurationApplyProvider()
    config = "version: v1alpha1\n"
    from talos_proxmox.talos_api import operations
    olds = {"node": "10.5.0.2", "endpoint": None, "mode": "auto", "try_timeout_seconds": None, "timeout_seconds": 600,
            "vm_id": 9102.0, "config_sha256": operations.config_sha256(config)}
    news = {**olds, "machine_configuration": config}
    asked = provider.diff("id", olds, {**news, "vm_id": Unknown()})
    assert (asked.replaces, asked.delete_before_replace) == (["vm_id"], True)
    assert provider.diff("id", olds, {**news, "vm_id": 9202}).replaces == ["vm_id"]
    assert provider.diff("id", olds, news).changes is False
    older = {key: value for key, value in olds.items() if key != "vm_id"}
    recorded = provider.diff("id", older, news)
    assert (recorded.changes, recorded.replaces) == (True, [])
    assert provider.update("id", older, news).outs["vm_id"] == 9102.0  # recorded, nothing sent (same config)


def test_the_install_wait_takes_a_node_in_a_new_vm_as_a_new_node():
    olds = {"nodes": [{"name": "cp-1", "address": "10.5.0.1", "vm_id": 9101.0},
                      {"name": "cp-2", "address": "10.5.0.2", "vm_id": 9102.0}]}
    replaced = {"nodes": [{"name": "cp-1", "address": "10.5.0.1", "vm_id": 9101},
                          {"name": "cp-2", "address": "10.5.0.2", "vm_id": 9202}]}
    assert _installing(olds, replaced) == {"cp-2": "10.5.0.2"}
    assert _installing(olds, olds) == {}
    older = {"nodes": [{"name": "cp-1", "address": "10.5.0.1"}, {"name": "cp-2", "address": "10.5.0.2"}]}
    assert _installing(older, replaced) == {}  # recorded before VM ids were: not a new VM


def test_a_node_in_a_new_vm_at_its_address_rejoins_and_is_waited_for_until_healthy():
    olds = {"nodes": [{"name": "cp-1", "address": "10.5.0.1", "role": "controlplane", "vm_id": 9101.0},
                      {"name": "w-1", "address": "10.5.0.4", "role": "worker", "vm_id": 9104.0}]}
    news = {"nodes": [{"name": "cp-1", "address": "10.5.0.1", "role": "controlplane", "vm_id": 9201},
                      {"name": "w-1", "address": "10.5.0.9", "role": "worker", "vm_id": 9204},
                      {"name": "w-2", "address": "10.5.0.5", "role": "worker", "vm_id": 9105}]}
    assert [(n.name, n.address, n.role) for n in _rejoining(olds, news)] == [("cp-1", "10.5.0.1", "controlplane")]
    assert _rejoining(olds, olds) == [] and _rejoining({}, news) == []


# --- what the Proxmox provider cannot change on running VMs, or PVE applies to all at once -------------

MADE_WITH = dict(vm_datastore="local-lvm", bridge="vmbr0", secure_boot=False, platform="metal")


def made_with(**changes) -> dict:
    """OLD's nodes, each VM made with MADE_WITH and `changes`."""
    found = plan()
    for node in found["nodes"].values():
        node["vm_made_with"] = {**MADE_WITH, **changes}
    return found


@pytest.mark.parametrize("change, key, quoted", [
    ({"vm_datastore": "ceph-vm"}, "proxmox.vmDatastore 'local-lvm' -> 'ceph-vm'",
     "cannot move disks between datastores while the VM is running"),
    ({"secure_boot": True}, "image.secureBoot False -> True",
     "cannot add, remove, or update the TPM device while the VM is running"),
    ({"platform": "nocloud"}, "image.platform 'metal' -> 'nocloud'", "cannot move the Cloud-Init drive"),
    ({"bridge": "vmbr1"}, "proxmox.bridge 'vmbr0' -> 'vmbr1'", "drop off the network together"),
])
def test_a_setting_every_vm_is_made_with_is_refused_once_naming_every_vm(change, key, quoted):
    [problem] = node_changes.problems(made_with(), made_with(**change))
    assert problem.startswith(f"{key} would change the VMs of cp-1, cp-2, cp-3, w-1: ")
    assert quoted in problem
    before = key.split(" ")[1]
    assert problem.endswith(f"keep {key.split(' ')[0]}: {before} for this cluster (new VMs take it only when made, "
                            f"and a cluster on another setting is a new stack)")


def test_a_plan_from_before_vms_were_recorded_with_their_settings_has_nothing_to_compare():
    assert node_changes.problems(plan(), made_with(vm_datastore="ceph-vm")) == []
    new_node = made_with(bridge="vmbr1")
    new_node["nodes"]["w-2"] = {**new_node["nodes"]["w-1"], "vm": vm(5)}
    del new_node["nodes"]["w-1"]
    old = made_with()
    del old["nodes"]["w-1"]
    assert [p.split(":")[0] for p in node_changes.problems(old, new_node)] == [
        "proxmox.bridge 'vmbr0' -> 'vmbr1' would change the VMs of cp-1, cp-2, cp-3"]  # w-2 is new


def test_data_disks_are_added_one_node_per_up():
    assert node_changes.problems(OLD, plan({"w-1": {"data_disk_gb": 50}})) == []
    through_the_engine = plan()  # None facts come back absent
    for node in through_the_engine["nodes"].values():
        del node["vm"]["data_disk_gb"]
    assert len(node_changes.problems(through_the_engine, plan({"w-1": {"data_disk_gb": 50},
                                                                "cp-1": {"data_disk_gb": 50}}))) == 1
    [problem] = node_changes.problems(OLD, plan({"w-1": {"data_disk_gb": 50}, "cp-3": {"data_disk_gb": 50}}))
    assert problem.startswith("nodes cp-3, w-1 would each get a data disk in one up: PVE hot-plugs")
    assert problem.endswith("add data disks one node per `pulumi up`")


def test_a_disk_grown_with_a_hardware_change_of_the_same_vm_is_refused_with_the_order_to_do_them_in():
    [problem] = node_changes.problems(OLD, plan({"w-1": {"disk_gb": 30, "cores": 4}}))
    assert problem == ("node w-1: disk 20 -> 30 GiB and cpu 2 -> 4 in one up: the Proxmox provider grows a running "
                       "VM's disk only in an update with no change that waits for a restart (\"cannot resize disks "
                       "while the VM is running\"); grow the disk in one `pulumi up`, then change cpu 2 -> 4 in the "
                       "next")
    # each on its own, or on different nodes, is fine
    assert node_changes.problems(OLD, plan({"w-1": {"disk_gb": 30}, "cp-1": {"cores": 4}})) == []


# --- version paths -----------------------------------------------------------------------------------

def versions(talos="v1.13.7", kubernetes="1.36.2", allow_downgrade=False) -> dict:
    return {**plan(), "talos_version": talos, "kubernetes_version": kubernetes, "allow_downgrade": allow_downgrade}


def test_kubernetes_moves_one_minor_version_at_a_time_and_never_down():
    assert node_changes.problems(versions(kubernetes="1.35.4"), versions(kubernetes="1.36.2")) == []
    assert node_changes.problems(versions(kubernetes="1.36.2"), versions(kubernetes="1.36.5")) == []
    [skipped] = node_changes.problems(versions(kubernetes="1.34.1"), versions(kubernetes="1.36.2"))
    assert skipped == ("cluster.kubernetesVersion 1.34.1 -> 1.36.2 skips a minor version: Kubernetes moves one minor "
                       "version at a time (its version skew policy; talosctl upgrade-k8s refuses more); upgrade to "
                       "the newest 1.35.x first, then to 1.36.2")
    [down] = node_changes.problems(versions(kubernetes="1.36.2"), versions(kubernetes="1.35.9"))
    assert down.startswith("cluster.kubernetesVersion 1.36.2 -> 1.35.9 is a downgrade")


def test_talos_upgrades_through_each_minor_release_and_goes_down_only_when_asked():
    assert node_changes.problems(versions(talos="v1.13.7"), versions(talos="v1.14.0")) == []
    [skipped] = node_changes.problems(versions(talos="v1.12.7"), versions(talos="v1.14.1"))
    assert skipped.startswith("cluster.talosVersion v1.12.7 -> v1.14.1 skips a minor release")
    assert "upgrade to the newest v1.13.x first" in skipped
    [down] = node_changes.problems(versions(talos="v1.13.8"), versions(talos="v1.13.7"))
    assert down.endswith("set cluster.allowDowngrade: true for this up")
    assert node_changes.problems(versions(talos="v1.13.8"), versions(talos="v1.13.7", allow_downgrade=True)) == []
    assert node_changes.problems(versions(talos="v1.14.0"), versions(talos="v1.15.0-beta.1")) == []


def test_a_kubernetes_version_the_nodes_talos_cannot_run_waits_for_their_upgrade():
    [problem] = node_changes.problems(versions(talos="v1.13.7", kubernetes="1.36.2"),
                                      versions(talos="v1.14.1", kubernetes="1.37.0"))
    assert problem == ("cluster.kubernetesVersion 1.37.0 is not one the nodes' Talos v1.13.7 runs (1.31-1.36), and "
                       "they keep it until each is upgraded; change cluster.talosVersion in one `pulumi up`, "
                       "cluster.kubernetesVersion in the next (pin cluster.kubernetesVersion: 1.36.2 meanwhile if the "
                       "stack takes the Talos line's default)")


def test_a_plan_recorded_before_talos_versions_were_has_no_talos_path_to_compare():
    assert node_changes.problems(plan(), versions(talos="v1.15.0")) == []
