"""`TalosCluster`: one stack's whole cluster, wired in the order the seed walkthrough does by hand.

    image (schematic + ISO in Proxmox)
    secrets ──┬─ talosconfig
              └─ node changes (checked) -> node x N: VM -> machine config -> lifecycle
                 -> Kubernetes upgrade (all nodes) -> apply x N (insecure first)
    bootstrap (first control plane, after its apply) -> kubeconfig -> Kubernetes provider -> add-ons

Everything is a child of the cluster component, so `pulumi preview` reads as that tree.
"""

from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_kubernetes as k8s

from components.addons import ClusterAddons
from components.backups import ClusterBackups
from components.image import TalosImage
from components.node import TalosNode
from components.storage import ClusterStorage
from talos_proxmox.cluster_plan.resource_inputs import (
    image_facts,
    iso_hosts,
    node_change_plan,
    proxmox_paths,
    talosconfig_inputs,
)
from talos_proxmox.day_two import backup_target, recovery_snapshot
from talos_proxmox.day_two.rolling import RollNode, roll_order
from talos_proxmox.proxmox_api.access import api_endpoint
from talos_proxmox.settings.model import Settings
from providers.kubernetes_upgrade import KubernetesUpgrade
from providers.node_lifecycle import NodeChanges
from providers.talos_operations import Bootstrap, Kubeconfig, NodesInstalled
from providers.secrets import MachineSecrets
from providers.talosconfig import Talosconfig


class TalosCluster(pulumi.ComponentResource):
    """Outputs: `endpoint`, `node_ips`, `schematic_id`, `installer_image`, `talosconfig` and
    `kubeconfig` (both secrets), and the parts: `image`, `secrets`, `nodes` (by node name), `bootstrap`,
    `kubeconfig_resource`, `k8s_provider`, `addons`."""

    def __init__(self, name: str, settings: Settings, opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("talos-proxmox:index:TalosCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        c, px, img = settings.cluster, settings.proxmox, settings.image
        facts = image_facts(settings)

        # The cluster's identity: losing or replacing it orphans every node, hence protect.
        self.secrets = MachineSecrets(
            "secrets", talos_version=c.talos_version, secrets_file=c.secrets_file,
            opts=pulumi.ResourceOptions(parent=self, protect=c.deletion_protection))

        self.talosconfig_resource = Talosconfig(
            "talosconfig", secrets=self.secrets.bundle, **talosconfig_inputs(settings), opts=child)

        # What this up changes about the nodes, whether the API token may make the calls it takes, whether
        # the backup bucket takes snapshots, and whether stored objects block a Kubernetes minor upgrade:
        # refused here (in the preview, before the ISO or any VM).
        target = backup_target.target_of(settings)
        backup_props = target.props() if target is not None else None
        self.node_changes = NodeChanges("node-changes", **node_change_plan(settings, facts.installer_image),
                                        proxmox_paths=proxmox_paths(settings), backup_target=backup_props,
                                        talosconfig=self.talosconfig_resource.talosconfig,
                                        control_planes=[{"name": n.name, "address": n.ip}
                                                        for n in settings.control_planes],
                                        opts=child)

        self.image = TalosImage(
            "image", img.schematic, c.talos_version, cluster=c.name, factory_url=img.factory_url, platform=img.platform,
            arch=img.arch, secure_boot=img.secure_boot, proxmox_nodes=iso_hosts(settings), iso_datastore=px.iso_datastore,
            after=[self.node_changes], opts=child)

        # Keyed by node name: removing a node from the stack removes only its resources. Made in roll
        # order (control planes first) so each node's lifecycle can follow the one before it.
        by_name = {node.name: node for node in settings.nodes}
        self.nodes: dict[str, TalosNode] = {}
        previous = None
        rolled_nodes = roll_order(RollNode(n.name, n.ip, n.role) for n in settings.nodes)
        for index, rolled in enumerate(rolled_nodes, start=1):
            node = by_name[rolled.name]
            self.nodes[node.name] = TalosNode(
                node.name, settings, node,
                # Shared datastore: the one copy, whatever host the VM is on.
                iso_file_id=self.image.iso_file_ids.get(node.proxmox_node, self.image.iso_file_id),
                installer_image=facts.installer_image,
                secrets=self.secrets.bundle,
                talosconfig=self.talosconfig_resource.talosconfig,
                node_changes=self.node_changes,
                previous=previous,
                position=f"{index} of {len(rolled_nodes)}",
                opts=child)
            previous = self.nodes[node.name]

        # A Kubernetes version change, as talosctl upgrade-k8s makes it, after every node's Talos upgrade and
        # before any node's apply; the bootstrap manifests' sync after it or a Talos version change.
        self.kubernetes_upgrade = KubernetesUpgrade(
            "kubernetes-upgrade", kubernetes_version=c.kubernetes_version, talos_version=c.talos_version,
            nodes=[{"name": n.name, "address": n.address, "role": n.role} for n in rolled_nodes],
            configurations={name: node.machine_configuration.machine_configuration
                            for name, node in self.nodes.items()},
            talosconfig=self.talosconfig_resource.talosconfig, timeout_seconds=settings.lifecycle.timeout_seconds,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[node.lifecycle for node in self.nodes.values()]))
        for node in self.nodes.values():
            node.send_configuration(after=self.kubernetes_upgrade)

        # Every node installs at once after its first apply; this waits for all of them together.
        self.nodes_installed = NodesInstalled(
            "nodes-installed",
            nodes=[{"name": n.name, "address": n.address, "role": n.role, "vm_id": self.nodes[n.name].vm.vm_id}
                   for n in rolled_nodes],
            talosconfig=self.talosconfig_resource.talosconfig,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[node.apply for node in self.nodes.values()]))

        first = settings.bootstrap_node
        self.bootstrap = Bootstrap(
            "bootstrap", node=first.ip, talosconfig=self.talosconfig_resource.talosconfig,
            recover_from=c.recover_from, recover_from_sha256=c.recover_from_sha256,
            recover_identity_file=c.recover_identity_file,
            recover_target=backup_props if c.recover_from and recovery_snapshot.is_object(c.recover_from) else None,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.nodes[first.name].apply]))
        self.kubeconfig_resource = Kubeconfig(
            "kubeconfig", node=first.ip, talosconfig=self.talosconfig_resource.talosconfig,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.bootstrap]))

        self.talosconfig = pulumi.Output.secret(self.talosconfig_resource.talosconfig)
        self.kubeconfig = pulumi.Output.secret(self.kubeconfig_resource.kubeconfig)
        # Only the add-ons need the Kubernetes provider (and its plugin): a stack without any has none.
        in_kubernetes = (settings.cilium.enabled, settings.ccm.enabled, settings.csi.enabled, settings.backups.enabled)
        self.k8s_provider = k8s.Provider("k8s", kubeconfig=self.kubeconfig, opts=child) if any(in_kubernetes) else None
        in_cluster = [self.bootstrap, self.kubeconfig_resource, self.nodes_installed]
        self.addons = ClusterAddons("addons", settings, self.k8s_provider, depends_on=in_cluster,
                                    kubeconfig=self.kubeconfig, opts=child)
        self.storage: Optional[ClusterStorage] = None
        if settings.csi.enabled:
            # The plugins reach Proxmox where the provider does (its endpoint setting, or the environment's).
            api_url, verify_tls = api_endpoint(lambda key: pulumi.Config(key.split(":")[0]).get(key.split(":")[1]))
            self.storage = ClusterStorage("storage", settings, self.k8s_provider, api_url, verify_tls,
                                          depends_on=in_cluster, opts=child)
        self.backups: Optional[ClusterBackups] = None
        if settings.backups.enabled:
            self.backups = ClusterBackups("backups", settings, self.k8s_provider, depends_on=in_cluster, opts=child)

        # `pulumi destroy` deletes dependents first and fails only when it reaches a protected resource: the
        # protected secrets alone would stop it after every node was reset and every VM destroyed. This
        # component depends on everything the cluster has, so the engine must delete it before anything
        # else; protected, it stops a destroy before anything is touched. (A component is never part of a
        # replacement, so it does not stand in the way of a node moving to a new VM.)
        self.deletion_protection = pulumi.ComponentResource(
            "talos-proxmox:index:DeletionProtection", "deletion-protection", None, pulumi.ResourceOptions(
                parent=self, protect=c.deletion_protection,
                depends_on=[self.image, self.secrets, self.talosconfig_resource, self.node_changes,
                            *self.nodes.values(), self.kubernetes_upgrade, self.nodes_installed, self.bootstrap,
                            self.kubeconfig_resource,
                            self.addons, *([self.storage] if self.storage is not None else []),
                            *([self.backups] if self.backups is not None else []),
                            *([self.k8s_provider] if self.k8s_provider is not None else [])]))
        self.deletion_protection.register_outputs({})

        self.endpoint = c.endpoint
        self.node_ips = {node.name: node.ip for node in settings.nodes}
        self.schematic_id = facts.schematic_id
        self.installer_image = facts.installer_image
        self.register_outputs({
            "endpoint": self.endpoint,
            "node_ips": self.node_ips,
            "schematic_id": self.schematic_id,
            "installer_image": self.installer_image,
            "talosconfig": self.talosconfig,
            "kubeconfig": self.kubeconfig,
        })
