"""What each resource of a cluster is made from, derived from the stack settings. No Pulumi import.

The Pulumi components and the offline render command (talos_proxmox/commands/render.py) both call these, so the
files the command writes are the ones `pulumi up` sends, given the same secrets bundle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from talos_proxmox.image_factory import images
from talos_proxmox.cluster_plan import node_patches as derived_patches
from talos_proxmox.cluster_plan import storage_values
from talos_proxmox.cluster_plan.node_patches import node_patches
from talos_proxmox.settings.model import NodeSettings, Settings


@dataclass(frozen=True)
class ImageFacts:
    schematic_yaml: str
    schematic_id: str
    installer_image: str
    iso_url: str


def image_facts(settings: Settings) -> ImageFacts:
    """The schematic's canonical YAML and id, and the installer and ISO it names for this Talos version."""
    img, version = settings.image, settings.cluster.talos_version
    sid = images.schematic_id(img.schematic)
    return ImageFacts(
        schematic_yaml=images.marshal_schematic(img.schematic),
        schematic_id=sid,
        installer_image=images.installer_image(img.factory_url, sid, version, img.platform, img.secure_boot),
        iso_url=images.iso_url(img.factory_url, sid, version, img.platform, img.arch, img.secure_boot),
    )


def iso_hosts(settings: Settings) -> list[str]:
    """The Proxmox hosts that get the ISO: the stack's own first, then every other host a VM runs on,
    unless the ISO datastore is shared (then the one copy serves them all)."""
    own = settings.proxmox.node
    if settings.proxmox.iso_datastore_shared:
        return [own]
    return [own, *sorted({n.proxmox_node for n in settings.nodes} - {own})]


def machine_config_inputs(settings: Settings, node: NodeSettings, installer_image: str) -> dict[str, Any]:
    """Everything but the secrets bundle that `machine_config.render` takes for `node`."""
    return dict(
        cluster_name=settings.cluster.name,
        endpoint=settings.cluster.endpoint,
        role=node.role,
        talos_version=settings.cluster.talos_version,
        kubernetes_version=settings.cluster.kubernetes_version,
        patches=node_patches(settings, node, installer_image),
    )


def talosconfig_inputs(settings: Settings) -> dict[str, Any]:
    """talosctl context: control planes as endpoints (apid forwards to the rest), the bootstrap node as the
    default target. Workers are left out so that adding or removing one changes neither the talosconfig
    nor what is fetched with it (kubeconfig); `talosctl -n <ip>` reaches any node."""
    return dict(
        context=settings.cluster.name,
        endpoints=[n.ip for n in settings.control_planes],
        nodes=[settings.bootstrap_node.ip],
    )


def vm_facts(settings: Settings, node: NodeSettings) -> dict[str, Any]:
    """The node's VM as its NodeLifecycle records it (talos_proxmox.day_two.vm_hardware): what may roll
    (cores, memory, CPU type) and what may not change in place (host, VM id, MAC, smaller disks)."""
    return dict(
        host=node.proxmox_node, vm_id=node.vm_id, mac=node.mac, cores=node.cpu, memory_mib=node.memory_mib,
        cpu_type=settings.proxmox.cpu_type, disk_gb=node.disk_gb,
        data_disk_gb=node.data_disk.size_gb if node.data_disk is not None else None,
    )


def node_change_plan(settings: Settings, installer_image: str) -> dict[str, Any]:
    """What NodeChanges records and checks (talos_proxmox.day_two.node_changes): the versions every node
    runs, and each node's role, VM, data volume and what its VM is made with."""
    return dict(
        installer_image=installer_image,
        kubernetes_version=settings.cluster.kubernetes_version,
        talos_version=settings.cluster.talos_version, allow_downgrade=settings.cluster.allow_downgrade,
        nodes={node.name: {"role": node.role, "vm": vm_facts(settings, node),
                           "data_volume": data_volume_facts(settings, node),
                           "vm_made_with": vm_made_with(settings)} for node in settings.nodes},
    )


def proxmox_paths(settings: Settings) -> dict[str, Any]:
    """The Proxmox paths the cluster's PVE calls touch, for the token's privilege check
    (talos_proxmox.proxmox_api.privileges.needs)."""
    px = settings.proxmox
    return dict(hosts=list(dict.fromkeys([*iso_hosts(settings), *(n.proxmox_node for n in settings.nodes)])),
                vm_datastore=px.vm_datastore, iso_datastore=px.iso_datastore, bridge=px.bridge,
                vm_ids=[n.vm_id for n in settings.nodes], access_users=storage_values.proxmox_users(settings))


def vm_made_with(settings: Settings) -> dict[str, Any]:
    """What a node's VM is made with that Proxmox cannot change on it while it runs, or that PVE applies to
    every running VM at once (talos_proxmox.day_two.node_changes.made_with_problems)."""
    return dict(vm_datastore=settings.proxmox.vm_datastore, bridge=settings.proxmox.bridge,
                secure_boot=settings.image.secure_boot, platform=settings.image.platform)


def data_volume_facts(settings: Settings, node: NodeSettings) -> Optional[dict[str, str]]:
    """Where the node's data disk is mounted and in which form (node_patches.node_storage_patches):
    `machine.disks` before Talos 1.14, a user volume from it. None without a data disk."""
    if node.data_disk is None:
        return None
    form = "user volume" if derived_patches.multidoc(settings) else "machine.disks"
    return {"form": form, "mountpoint": node.data_disk.mountpoint}
