"""What one `pulumi up` changes about the cluster's nodes, and whether it may: decided before any VM is
touched (the NodeChanges resource, which every VM depends on, runs `problems` in its check).

A node whose VM Proxmox can only change by re-creating it (a new Proxmox host, VM id or MAC address) is
replaced as a node removed and added: its lifecycle leaves etcd and resets it, the old VM goes, the new
VM boots the ISO and gets a first apply. That takes the node out of the cluster for a while, so such a
replacement is allowed one node per up, with no other node change beside it (an upgrade, a Kubernetes
roll, a hardware roll, a node added or removed would take a second node down meanwhile), and never for
the cluster's only control plane (etcd would go with it). Changes that lose data (a smaller or removed
disk, a data disk mounted anew) are refused outright, with the way to make them.

The plan this reads, old (from the last up, or None) and new: {"installer_image", "kubernetes_version",
"nodes": {name: {"role", "vm": the VM's facts (talos_proxmox.day_two.vm_hardware), "data_volume": its data disk's
form and mountpoint or None}}}; a plan recorded before a fact was has none, which is no change. No Pulumi here.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from talos_proxmox.day_two.vm_hardware import HARDWARE, hardware_changes
from talos_proxmox.engine_values import with_integers
from talos_proxmox.settings.model import KUBERNETES_RANGES

# fact -> its stack key: a change of any of them makes a new VM.
IDENTITY = {"host": "proxmoxNode", "vm_id": "vmId", "mac": "mac"}
DISKS = {"disk_gb": "disk", "data_disk_gb": "dataDisk.size"}


def identity_changes(old_vm: Optional[Mapping[str, Any]], new_vm: Mapping[str, Any]) -> list[str]:
    """`vmId 9101 -> 9201`-style lines for each identity fact that changed. A fact unset on either side
    (Proxmox picks the VM id; a VM recorded before the fact was tracked) is no change."""
    if not old_vm:
        return []
    old, new = with_integers(old_vm), with_integers(new_vm)
    return [f"{key} {old[fact]!r} -> {new[fact]!r}" for fact, key in IDENTITY.items()
            if old.get(fact) is not None and new.get(fact) is not None and old[fact] != new[fact]]


def replaced_nodes(old: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> dict[str, list[str]]:
    """name -> its identity changes, for each node kept in the stack whose VM this up replaces."""
    old_nodes = (old or {}).get("nodes") or {}
    # By name: through the engine a mapping's keys lose their order.
    changes = {name: identity_changes(old_nodes[name].get("vm"), node.get("vm") or {})
               for name, node in sorted(new["nodes"].items()) if name in old_nodes}
    return {name: found for name, found in changes.items() if found}


def _two_ups(node: str, setting: str) -> str:
    return (f"to change it, take {node} out of nodes and `pulumi up` (it leaves etcd and is reset), then add it "
            f"back with the new {setting} and `pulumi up` again")


def disk_problems(node: str, old_vm: Optional[Mapping[str, Any]], new_vm: Mapping[str, Any]) -> list[str]:
    """A smaller or removed disk: Proxmox cannot shrink one, and a removed one takes its data along."""
    if not old_vm:
        return []
    old, new = with_integers(old_vm), with_integers(new_vm)
    problems = []
    for fact, key in DISKS.items():
        before, after = old.get(fact), new.get(fact)
        if before is None:
            continue
        if after is None:
            problems.append(f"node {node}: {key.split('.')[0]} removed (was {before} GiB): its data would be lost; "
                            f"{_two_ups(node, 'disks')}")
        elif after < before:
            problems.append(f"node {node}: {key} {before} -> {after} GiB: Proxmox cannot shrink a disk; keep "
                            f"{before} GiB or more, or {_two_ups(node, key)}")
    return problems


def data_volume_problems(node: str, old_volume: Optional[Mapping[str, Any]],
                         new_volume: Optional[Mapping[str, Any]]) -> list[str]:
    """A data disk mounted anew (another mountpoint, or moved from machine.disks to a Talos 1.14 user volume):
    Talos would look for a volume the disk does not have, and the node's data would stay on the disk,
    unmounted, while its workloads start on an empty directory."""
    if not old_volume or not new_volume:
        return []
    if old_volume.get("form") == new_volume.get("form") and \
            old_volume.get("mountpoint") in (None, new_volume.get("mountpoint")):
        return []
    before = f"{old_volume.get('form')} at {old_volume.get('mountpoint') or 'its mountpoint then'}"
    after = f"{new_volume.get('form')} at {new_volume.get('mountpoint')}"
    return [f"node {node}: its data disk would be mounted anew ({before} -> {after}), and Talos would not find "
            f"its data there; keep the data disk as it is, or {_two_ups(node, 'data disk')} (it comes back "
            f"empty: move the data off first, e.g. let Longhorn re-replicate, one node at a time)"]


def recorded_data_volume(node: Mapping[str, Any]) -> Optional[Mapping[str, Any]]:
    """The data disk's form and mountpoint as the last up recorded them. A plan from before they were
    recorded predates Talos 1.14 support, so a data disk it has was `machine.disks` (mountpoint unknown)."""
    if "data_volume" in node:
        return node["data_volume"]
    if (node.get("vm") or {}).get("data_disk_gb") is not None:
        return {"form": "machine.disks", "mountpoint": None}
    return None


# vm_made_with fact -> (stack key, why it cannot change under running VMs)
MADE_WITH = {
    "vm_datastore": ("proxmox.vmDatastore",
                     "Proxmox would have to move the disks of running VMs, which the Proxmox provider refuses "
                     "after the up's earlier changes have landed (\"cannot move disks between datastores while the "
                     "VM is running\")"),
    "secure_boot": ("image.secureBoot",
                    "running VMs would get or lose their TPM state and EFI disk, which the Proxmox provider refuses "
                    "after the up's earlier changes have landed (\"cannot add, remove, or update the TPM device "
                    "while the VM is running\"), and installed nodes would need another boot chain"),
    "platform": ("image.platform",
                 "running VMs would get or lose their cloud-init drive, which the Proxmox provider refuses after "
                 "the up's earlier changes have landed (\"cannot move the Cloud-Init drive while the VM is "
                 "running\"), and installed nodes run the other platform's image"),
    "bridge": ("proxmox.bridge",
               "PVE applies a NIC change to a running VM at once, so every node would move to the new bridge at "
               "the same moment: the whole cluster, etcd with it, would drop off the network together"),
}


def made_with_problems(old_nodes: Mapping[str, Any], new_nodes: Mapping[str, Any]) -> list[str]:
    """A setting every VM is made with, changed under VMs that exist: one line per setting, naming the nodes.
    Such a setting is fixed for a cluster's VMs once they are made: the way is to keep it."""
    changed: dict[str, dict[tuple, list[str]]] = {}
    for name, node in sorted(new_nodes.items()):
        before = (old_nodes.get(name) or {}).get("vm_made_with")
        after = node.get("vm_made_with") or {}
        if not before:
            continue  # a new node, or a plan recorded before this was
        for fact in MADE_WITH:
            if fact in before and before[fact] != after.get(fact):
                changed.setdefault(fact, {}).setdefault((before[fact], after.get(fact)), []).append(name)
    problems = []
    for fact, by_change in changed.items():
        key, why = MADE_WITH[fact]
        for (before, after), names in by_change.items():
            problems.append(f"{key} {before!r} -> {after!r} would change the VMs of {', '.join(names)}: {why}; "
                            f"keep {key}: {before!r} for this cluster (new VMs take it only when made, and a "
                            f"cluster on another setting is a new stack)")
    return problems


def live_change_problems(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Changes PVE applies to running VMs the moment the provider sends them, or that the provider cannot
    make together: allowed one node per up, or one kind per up."""
    old_nodes, new_nodes = old.get("nodes") or {}, new["nodes"]
    problems = []
    # (through the engine a None fact comes back absent: no data disk either way)
    added_disks = [name for name, node in sorted(new_nodes.items()) if name in old_nodes
                   and (old_nodes[name].get("vm") or {}).get("data_disk_gb") is None
                   and (node.get("vm") or {}).get("data_disk_gb") is not None]
    if len(added_disks) > 1:
        problems.append(f"nodes {', '.join(added_disks)} would each get a data disk in one up: PVE hot-plugs a new "
                        f"disk into every running VM the moment the provider sends it, and each node's config "
                        f"then changes to use it; add data disks one node per `pulumi up`")
    for name, node in sorted(new_nodes.items()):
        if name not in old_nodes:
            continue
        old_vm, new_vm = with_integers(old_nodes[name].get("vm") or {}), with_integers(node.get("vm") or {})
        grown = [f"{key} {old_vm[fact]} -> {new_vm[fact]} GiB" for fact, key in DISKS.items()
                 if old_vm.get(fact) is not None and new_vm.get(fact) is not None and new_vm[fact] > old_vm[fact]]
        rolled = hardware_changes(old_nodes[name].get("vm"), node.get("vm") or {})
        if grown and rolled:
            what = ", ".join(f"{HARDWARE[fact]} {before} -> {after}" for fact, (before, after) in rolled.items())
            problems.append(f"node {name}: {', '.join(grown)} and {what} in one up: the Proxmox provider grows a "
                            f"running VM's disk only in an update with no change that waits for a restart (\"cannot "
                            f"resize disks while the VM is running\"); grow the disk in one `pulumi up`, then "
                            f"change {what} in the next")
    return problems


def _version(text: Optional[str]) -> Optional[tuple[int, int, int]]:
    """(major, minor, patch) of v1.13.7 / 1.36.2 / v1.15.0-beta.1; None when unknown."""
    if not text:
        return None
    parts = str(text).lstrip("v").split("-", 1)[0].split(".")
    try:
        return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0
    except (ValueError, IndexError):
        return None


def version_problems(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Version paths Talos and Kubernetes do not support, refused before any node is touched: Kubernetes
    moves one minor version at a time and never down (talosctl upgrade-k8s refuses both); Talos upgrades
    one minor release at a time (Talos's upgrade guide: through each minor release) and goes down only when
    the stack says so (cluster.allowDowngrade); a Kubernetes version the nodes' Talos cannot run waits until
    the nodes have the new Talos."""
    problems = []
    old_k8s, new_k8s = _version(old.get("kubernetes_version")), _version(new.get("kubernetes_version"))
    if old_k8s and new_k8s and old_k8s[:2] != new_k8s[:2]:
        before, after = old.get("kubernetes_version"), new.get("kubernetes_version")
        if new_k8s[:2] < old_k8s[:2]:
            problems.append(f"cluster.kubernetesVersion {before} -> {after} is a downgrade, which Kubernetes does not "
                            f"support (talosctl upgrade-k8s refuses it); keep {before} or later")
        elif new_k8s[1] > old_k8s[1] + 1:
            step = f"{old_k8s[0]}.{old_k8s[1] + 1}"
            problems.append(f"cluster.kubernetesVersion {before} -> {after} skips a minor version: Kubernetes moves one "
                            f"minor version at a time (its version skew policy; talosctl upgrade-k8s refuses more); "
                            f"upgrade to the newest {step}.x first, then to {after}")
    old_talos, new_talos = _version(old.get("talos_version")), _version(new.get("talos_version"))
    if old_talos and new_talos and old_talos != new_talos:
        before, after = old.get("talos_version"), new.get("talos_version")
        if new_talos < old_talos and not new.get("allow_downgrade"):
            problems.append(f"cluster.talosVersion {before} -> {after} is a downgrade: each node would install the "
                            f"older Talos; if that is meant (a rollback), set cluster.allowDowngrade: true for this up")
        elif new_talos[:2] > old_talos[:2] and new_talos[1] > old_talos[1] + 1:
            step = f"v{old_talos[0]}.{old_talos[1] + 1}"
            problems.append(f"cluster.talosVersion {before} -> {after} skips a minor release: Talos upgrades through "
                            f"each minor release (its upgrade guide); upgrade to the newest {step}.x first, then to "
                            f"{after}")
        line = f"v{old_talos[0]}.{old_talos[1]}"
        if new_k8s and old_k8s != new_k8s and line in KUBERNETES_RANGES:
            low, high = KUBERNETES_RANGES[line]
            if not low <= new_k8s[:2] <= high:
                problems.append(f"cluster.kubernetesVersion {new.get('kubernetes_version')} is not one the nodes' Talos "
                                f"{before} runs ({low[0]}.{low[1]}-{high[0]}.{high[1]}), and they keep it until each "
                                f"is upgraded; change cluster.talosVersion in one `pulumi up`, "
                                f"cluster.kubernetesVersion in the next (pin cluster.kubernetesVersion: "
                                f"{old.get('kubernetes_version')} meanwhile if the stack takes the Talos line's default)")
    return problems


def other_changes(old: Mapping[str, Any], new: Mapping[str, Any], replaced: str) -> list[str]:
    """What else this up does to nodes besides replacing `replaced`'s VM, each a short phrase."""
    found = []
    for key, what in (("installer_image", "the Talos installer"), ("kubernetes_version", "kubernetesVersion")):
        if old.get(key) != new.get(key):
            found.append(f"{what} {old.get(key)} -> {new.get(key)}")
    old_nodes, new_nodes = old.get("nodes") or {}, new["nodes"]
    found += [f"node {name} added" for name in sorted(new_nodes) if name not in old_nodes]
    found += [f"node {name} removed" for name in sorted(old_nodes) if name not in new_nodes]
    for name, node in sorted(new_nodes.items()):
        if name == replaced or name not in old_nodes:
            continue
        rolled = hardware_changes(old_nodes[name].get("vm"), node.get("vm") or {})
        found += [f"node {name}'s {HARDWARE[fact]} {before} -> {after}" for fact, (before, after) in rolled.items()]
    return found


def problems(old: Optional[Mapping[str, Any]], new: Mapping[str, Any]) -> list[str]:
    """Why this up may not make its node changes; empty when it may. `old` None: the first up (or the
    first since this was recorded), which has nothing to compare."""
    if not old:
        return []
    old_nodes = old.get("nodes") or {}
    found = [problem for name, node in sorted(new["nodes"].items()) if name in old_nodes
             for problem in disk_problems(name, old_nodes[name].get("vm"), node.get("vm") or {})
             + data_volume_problems(name, recorded_data_volume(old_nodes[name]), node.get("data_volume"))]
    found += version_problems(old, new)
    found += made_with_problems(old_nodes, new["nodes"])
    found += live_change_problems(old, new)
    replaced = replaced_nodes(old, new)
    described = {name: ", ".join(changes) for name, changes in replaced.items()}
    if len(replaced) > 1:
        found.append(f"nodes {', '.join(f'{name} ({what})' for name, what in described.items())} would each have "
                     f"their VM replaced in one up; a replaced VM takes its node out of the cluster (etcd leave, reset) "
                     f"and back in (a first apply on the new VM), so replace one node per `pulumi up`")
        return found
    control_planes = [name for name, node in new["nodes"].items() if node.get("role") == "controlplane"]
    for name, what in described.items():
        if control_planes == [name]:
            found.append(f"node {name}: {what} would replace the VM of the cluster's only control plane, and "
                         f"etcd with it; add a second control plane first (one `pulumi up`), then replace this one")
        others = other_changes(old, new, name)
        if others:
            found.append(f"node {name}: {what} replaces its VM, which takes the node out of the cluster and back "
                         f"in; make that the only node change of its `pulumi up` (this one also changes: "
                         f"{'; '.join(others)})")
    return found
