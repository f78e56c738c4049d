"""One Talos node: its Proxmox VM, its rendered machine configuration, its lifecycle, and the apply.

Every resource here is named after the node, so adding or removing a node in the stack adds or
removes exactly that node's resources and leaves the others' inputs alone.
"""

from __future__ import annotations

from typing import Optional

import pulumi
import pulumi_proxmoxve as proxmoxve

from talos_proxmox.cluster_plan.resource_inputs import machine_config_inputs, vm_facts
from talos_proxmox.day_two import backup_target
from providers.machine_configuration import MachineConfiguration
from providers.node_lifecycle import NodeLifecycle
from talos_proxmox.settings.model import NodeSettings, Settings
from providers.talos_operations import ConfigurationApply

# The CD-ROM sits on ide2, Proxmox's own default slot for it and one that q35 machines also have.
CDROM_INTERFACE = "ide2"
# The cloud-init drive (nocloud images only) needs a slot of its own, away from the CD-ROM.
CLOUD_INIT_INTERFACE = "ide0"
BOOT_DISK_INTERFACE = "scsi0"
DATA_DISK_INTERFACE = "scsi1"
# A new VM to Proxmox. The provider re-creates the VM for the first two; a new MAC it would re-plug
# (the node would drop off the network before its config names the new MAC), so it replaces for that too.
# Replaced delete-before-replace: the node's lifecycle (leave etcd, reset) and apply go first, the new
# VM gets a first apply. NodeChanges allows one such node per up, alone (node_changes.problems).
VM_IDENTITY_INPUTS = ["vmId", "nodeName", "networkDevices[0].macAddress"]
# The Pulumi bridge fills each disk's `speed` with its Terraform default (all zeros) while the provider
# reads an unlimited disk back as no speed block: without this every preview shows each VM as changed
# (muhlba91/pulumi-proxmoxve#664). The program never sets disk speed limits. One path per disk (boot, data):
# the bridge's diff honours exact paths only, not `disks[*].speed`.
VM_IGNORED_DRIFT = [f"disks[{index}].speed" for index in range(2)]


def vm_tags(settings: Settings, node: NodeSettings) -> list[str]:
    """Cluster, role and the stack's extra tags; sorted and unique because Proxmox stores them that way."""
    return sorted({"talos", settings.cluster.name, node.role, *settings.proxmox.tags})


def vm_args(settings: Settings, node: NodeSettings, iso_file_id: pulumi.Input[str]) -> dict:
    """Keyword arguments of the node's `proxmoxve.VmLegacy`, as the seed builds its VMs by hand."""
    px = settings.proxmox
    # No iothread: behind virtio-scsi-pci (below) PVE ignores it and warns at every start; an I/O thread
    # per disk needs virtio-scsi-single, which Talos's bootstrap does not survive.
    disks = [proxmoxve.VmLegacyDiskArgs(
        interface=BOOT_DISK_INTERFACE, datastore_id=px.vm_datastore, size=node.disk_gb,
        file_format="raw", ssd=True, discard="on", iothread=False)]
    if node.data_disk is not None:
        disks.append(proxmoxve.VmLegacyDiskArgs(
            interface=DATA_DISK_INTERFACE, datastore_id=px.vm_datastore, size=node.data_disk.size_gb,
            file_format="raw", ssd=True, discard="on", iothread=False))
    extra = {}
    if settings.image.platform == "nocloud":
        extra["initialization"] = maintenance_network(settings, node)
    if settings.image.secure_boot:
        extra.update(secure_boot_firmware(settings))
    return dict(
        **extra,
        name=node.name,
        vm_id=node.vm_id,
        node_name=node.proxmox_node,
        description=f"Talos {node.role} of cluster {settings.cluster.name}, managed by Pulumi",
        tags=vm_tags(settings, node),
        cpu=proxmoxve.VmLegacyCpuArgs(cores=node.cpu, sockets=1, type=px.cpu_type),
        # Ballooning off: Talos and the kubelet plan around the memory they see at boot.
        memory=proxmoxve.VmLegacyMemoryArgs(dedicated=node.memory_mib, floating=0),
        # Not virtio-scsi-single: with it Talos's bootstrap hangs (Talos's Proxmox guide, siderolabs/talos#11173).
        # virtio-scsi-pci keeps the boot disk /dev/sda, the install disk.
        scsi_hardware="virtio-scsi-pci",
        disks=disks,
        network_devices=[proxmoxve.VmLegacyNetworkDeviceArgs(
            bridge=px.bridge, model="virtio", mac_address=node.mac)],
        cdrom=proxmoxve.VmLegacyCdromArgs(file_id=iso_file_id, interface=CDROM_INTERFACE),
        # Disk first: empty on first boot, so the VM falls through to the ISO (maintenance mode); once
        # Talos has installed itself the disk boots and the ISO is never used again.
        boot_orders=[BOOT_DISK_INTERFACE, CDROM_INTERFACE],
        # The qemu-guest-agent extension answers once Talos runs; the node's address is fixed in the
        # stack, so VM creation need not wait for the agent to report one.
        agent=proxmoxve.VmLegacyAgentArgs(
            enabled=True, trim=True, type="virtio",
            wait_for_ip=proxmoxve.VmLegacyAgentWaitForIpArgs(disabled=True)),
        operating_system=proxmoxve.VmLegacyOperatingSystemArgs(type="l26"),
        on_boot=True,
        started=True,
        # Talos is reset through its API before the VM goes (day-two hooks); then a hard stop is safe.
        stop_on_destroy=True,
        # A change of cores, memory or CPU type waits as pending config: rebooting every changed VM at
        # once would take etcd's quorum down. The node's lifecycle reboots them one at a time, health-gated.
        reboot_after_update=False,
    )


def etcd_snapshot_inputs(settings: Settings) -> Optional[pulumi.Input[dict]]:
    """Where each pre-upgrade or pre-removal snapshot goes: the directory, and the backup bucket when the
    stack has one (its credentials make the whole input a secret)."""
    snapshots = settings.lifecycle.etcd_snapshots
    if snapshots is None:
        return None
    inputs = {"directory": snapshots.directory, "keep": snapshots.keep, "cluster": settings.cluster.name}
    target = backup_target.target_of(settings)
    if target is None:
        return inputs
    return pulumi.Output.secret({**inputs, "target": target.props()})


def secure_boot_firmware(settings: Settings) -> dict:
    """UEFI with an empty key store and a TPM 2.0: the secure-boot ISO enrolls Sidero Labs' keys itself
    (Microsoft's pre-enrolled keys would refuse its UKI), and Talos seals disk keys to the TPM."""
    store = settings.proxmox.vm_datastore
    return dict(
        bios="ovmf",
        machine="q35",
        efi_disk=proxmoxve.VmLegacyEfiDiskArgs(datastore_id=store, file_format="raw", type="4m",
                                               pre_enrolled_keys=False),
        tpm_state=proxmoxve.VmLegacyTpmStateArgs(datastore_id=store, version="v2.0"),
    )


def maintenance_network(settings: Settings, node: NodeSettings) -> proxmoxve.VmLegacyInitializationArgs:
    """A cloud-init drive with the node's static address: Talos's nocloud image reads it in maintenance
    mode, so the first (insecure) apply can reach the node at its stack IP without a DHCP reservation."""
    return proxmoxve.VmLegacyInitializationArgs(
        datastore_id=settings.proxmox.vm_datastore,
        interface=CLOUD_INIT_INTERFACE,
        ip_configs=[proxmoxve.VmLegacyInitializationIpConfigArgs(
            ipv4=proxmoxve.VmLegacyInitializationIpConfigIpv4Args(address=node.address, gateway=node.gateway))],
        dns=proxmoxve.VmLegacyInitializationDnsArgs(servers=list(node.nameservers)),
    )


class TalosNode(pulumi.ComponentResource):
    """A Proxmox VM booted from the factory ISO, its machine configuration, its day-two lifecycle
    (upgrades, leave + reset on removal) and the apply that sends the configuration.

    `node_changes` is the cluster's NodeChanges: the VM waits for its check.
    `previous` is the node before this one in roll order (control planes first): its lifecycle must
    finish before this node's, so upgrades run one node at a time. `position` ("2 of 4") is its place
    in that order, for progress lines. Parts: `vm`, `machine_configuration`, `lifecycle`, and `apply`
    once `send_configuration` has made it.
    """

    def __init__(
        self,
        name: str,
        settings: Settings,
        node: NodeSettings,
        *,
        iso_file_id: pulumi.Input[str],
        installer_image: str,
        secrets: pulumi.Input[dict],
        talosconfig: pulumi.Input[str],
        node_changes: pulumi.Resource,
        previous: Optional["TalosNode"] = None,
        position: Optional[str] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("talos-proxmox:index:TalosNode", name, None, opts)
        self._name = name
        child = pulumi.ResourceOptions(parent=self)
        c = settings.cluster

        self.vm = proxmoxve.VmLegacy(name, **vm_args(settings, node, iso_file_id), opts=pulumi.ResourceOptions(
            parent=self, depends_on=[node_changes], replace_on_changes=VM_IDENTITY_INPUTS, delete_before_replace=True,
            ignore_changes=VM_IGNORED_DRIFT))

        inputs = machine_config_inputs(settings, node, installer_image)
        self.machine_configuration = MachineConfiguration(f"machineconfig-{name}", secrets=secrets, **inputs,
                                                          opts=child)

        # Depends on the VM, so a removed node leaves etcd and is reset before its VM is destroyed; the VM's
        # id as an input makes it go (and come back) with a replaced VM too.
        self.lifecycle = NodeLifecycle(
            f"lifecycle-{name}", node_name=node.name, address=node.ip, role=node.role,
            installer_image=installer_image, talos_version=c.talos_version, talosconfig=talosconfig,
            timeout_seconds=settings.lifecycle.timeout_seconds, reset_on_delete=settings.lifecycle.reset_on_delete,
            etcd_snapshots=etcd_snapshot_inputs(settings),
            vm=vm_facts(settings, node), vm_id=self.vm.vm_id, position=position,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[self.vm, *([previous.lifecycle] if previous else [])]))

        self._talosconfig = talosconfig
        self._role = node.role
        self._ip = node.ip

    def send_configuration(self, after: pulumi.Resource) -> None:
        """The apply that sends the node its configuration, after `after` (the cluster's KubernetesUpgrade,
        which runs after every node's lifecycle): a configuration that needs the new Talos or Kubernetes
        reaches the node only once the upgrade has brought it there, one node at a time."""
        # The VM must exist (and boot the ISO) before anything can be sent to its Talos API.
        self.apply = ConfigurationApply(
            f"apply-{self._name}",
            node=self._ip,
            machine_configuration=self.machine_configuration.machine_configuration,
            talosconfig=self._talosconfig,
            vm_id=self.vm.vm_id,
            role=self._role,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.vm, self.lifecycle, after]),
        )
        self.register_outputs({"vm_id": self.vm.vm_id, "ip": self._ip})
