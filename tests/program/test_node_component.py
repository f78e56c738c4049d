"""The Proxmox VM each node gets, and the node component's wiring (VM -> machine config -> apply)."""

from __future__ import annotations

import pulumi

import dataclasses

import pulumi_proxmoxve as proxmoxve
import pytest

from components.node import TalosNode, vm_args, vm_tags
from providers.node_lifecycle import NodeChanges
from talos_proxmox.cluster_plan.resource_inputs import node_change_plan
from talos_proxmox.settings.stack import load_settings
from tests.program.mocked_program import run_program, stack_config

ISO = "local:iso/talos-test-cluster-e142ceb080fb-v1.13.7-metal-amd64.iso"


@pytest.fixture(scope="module")
def settings():
    return load_settings(stack_config("test-cluster"))


def node(settings, name):
    return next(n for n in settings.nodes if n.name == name)


def test_control_plane_vm_is_the_seeds_1_vcpu_2_gib_15_gb_machine(settings):
    args = vm_args(settings, node(settings, "master-1"), ISO)
    assert (args["name"], args["vm_id"], args["node_name"]) == ("master-1", 201, "pve")
    assert (args["cpu"].cores, args["cpu"].type) == (1, "host")
    assert args["memory"].dedicated == 2048
    assert [(d.interface, d.datastore_id, d.size) for d in args["disks"]] == [("scsi0", "local-lvm", 15)]
    [nic] = args["network_devices"]
    assert (nic.bridge, nic.model, nic.mac_address) == ("vmbr0", "virtio", "bc:24:11:80:a1:9b")
    assert (args["cdrom"].file_id, args["cdrom"].interface) == (ISO, "ide2")
    assert args["boot_orders"] == ["scsi0", "ide2"]
    assert args["agent"].enabled is True
    assert args["operating_system"].type == "l26"
    assert args["tags"] == ["controlplane", "talos", "test-cluster"]
    # Talos's Proxmox guide: virtio-scsi-single hangs the bootstrap; the boot disk stays /dev/sda.
    assert args["scsi_hardware"] == "virtio-scsi-pci"
    assert not {"bios", "machine", "efi_disk", "tpm_state"} & set(args)  # SeaBIOS, QEMU's default machine
    # Every keyword is one VmLegacy takes: a typo here would only fail against a real Proxmox.
    proxmoxve.VmLegacyArgs(**args)


def test_secure_boot_vm_has_uefi_with_empty_key_store_and_a_tpm(settings):
    secure = dataclasses.replace(settings, image=dataclasses.replace(settings.image, secure_boot=True))
    args = vm_args(secure, node(settings, "master-1"), ISO)
    assert (args["bios"], args["machine"]) == ("ovmf", "q35")
    efi = args["efi_disk"]
    # Not Microsoft's pre-enrolled keys: the secure-boot ISO enrolls Sidero Labs' own on first boot.
    assert (efi.datastore_id, efi.type, efi.file_format, efi.pre_enrolled_keys) == ("local-lvm", "4m", "raw", False)
    assert (args["tpm_state"].datastore_id, args["tpm_state"].version) == ("local-lvm", "v2.0")
    assert args["scsi_hardware"] == "virtio-scsi-pci" and args["boot_orders"] == ["scsi0", "ide2"]
    proxmoxve.VmLegacyArgs(**args)


def test_worker_with_data_disk_gets_scsi1_of_30_gb_on_the_vm_datastore(settings):
    args = vm_args(settings, node(settings, "worker-1"), ISO)
    assert (args["cpu"].cores, args["memory"].dedicated) == (3, 6144)
    assert [(d.interface, d.datastore_id, d.size) for d in args["disks"]] == [
        ("scsi0", "local-lvm", 15), ("scsi1", "local-lvm", 30)]
    assert args["network_devices"][0].mac_address == "bc:24:11:80:a1:9e"
    assert args["tags"] == ["talos", "test-cluster", "worker"]


def test_metal_image_gets_no_cloud_init_drive(settings):
    assert "initialization" not in vm_args(settings, node(settings, "master-1"), ISO)


def test_nocloud_image_gets_the_nodes_static_address_on_a_cloud_init_drive(settings):
    nocloud = dataclasses.replace(settings, image=dataclasses.replace(settings.image, platform="nocloud"))
    args = vm_args(nocloud, node(settings, "worker-2"), ISO)
    init = args["initialization"]
    assert (init.interface, init.datastore_id) == ("ide0", "local-lvm")
    assert init.interface != args["cdrom"].interface
    [ip] = init.ip_configs
    assert (ip.ipv4.address, ip.ipv4.gateway) == ("10.255.200.205/24", "10.255.200.1")
    assert init.dns.servers == ["9.9.9.9"]
    proxmoxve.VmLegacyArgs(**args)


def test_worker_without_data_disk_has_only_the_boot_disk(settings):
    args = vm_args(settings, node(settings, "worker-4"), ISO)
    assert [d.interface for d in args["disks"]] == ["scsi0"]


def test_proxmox_settings_reach_the_vm(settings):
    px = dataclasses.replace(settings.proxmox, vm_datastore="ceph-vm", bridge="vmbr1", cpu_type="x86-64-v2-AES",
                             tags=("lab", "talos"))
    custom = dataclasses.replace(settings, proxmox=px)
    worker = dataclasses.replace(node(settings, "worker-2"), proxmox_node="pve2")
    args = vm_args(custom, worker, ISO)
    assert args["node_name"] == "pve2"
    assert args["cpu"].type == "x86-64-v2-AES"
    assert {d.datastore_id for d in args["disks"]} == {"ceph-vm"}
    assert args["network_devices"][0].bridge == "vmbr1"
    assert vm_tags(custom, worker) == ["lab", "talos", "test-cluster", "worker"]


INSTALLER = "factory.talos.dev/installer/e142ceb080fb243141b5b6891cfcf0c60bc9430d69be0adf803999d2b62dc885:v1.13.7"


def test_node_component_wires_vm_config_lifecycle_and_apply_in_order():
    def program():
        s = load_settings(stack_config("test-cluster"))
        changes = NodeChanges("node-changes", **node_change_plan(s, INSTALLER))
        first = TalosNode("master-1", s, node(s, "master-1"), iso_file_id=ISO, installer_image=INSTALLER,
                          secrets={"cluster": {}}, talosconfig="talosconfig-text", node_changes=changes)
        second = TalosNode("master-2", s, node(s, "master-2"), iso_file_id=ISO, installer_image=INSTALLER,
                           secrets={"cluster": {}}, talosconfig="talosconfig-text", node_changes=changes,
                           previous=first)
        upgrade = pulumi.CustomResource("test:index:Upgrade", "kubernetes-upgrade", {})
        for talos_node in (first, second):
            talos_node.send_configuration(after=upgrade)

    run = run_program(stack_config("test-cluster"), program=program)
    urns = {r.urn: r for r in run.registrations}
    named = {(r.type.split(":")[-1], r.name): r for r in run.registrations}
    component = named[("TalosNode", "master-2")]
    vm = named[("VmLegacy", "master-2")]
    config = named[("Resource", "machineconfig-master-2")]
    lifecycle = named[("Resource", "lifecycle-master-2")]
    apply = named[("Resource", "apply-master-2")]
    assert {vm.parent, config.parent, lifecycle.parent, apply.parent} == {component.urn}

    assert config.inputs["role"] == "controlplane"
    assert {"machine": {"install": {"disk": "/dev/sda", "image": INSTALLER}}} in config.inputs["patches"]
    assert {"apiVersion": "v1alpha1", "kind": "LinkAliasConfig", "name": "net0",
            "selector": {"match": 'mac(link.permanent_addr) == "bc:24:11:80:a1:9c"'}} in config.inputs["patches"]
    assert "machine_configuration" in config.additional_secret_outputs

    assert (lifecycle.inputs["address"], lifecycle.inputs["role"]) == ("10.255.200.202", "controlplane")
    assert lifecycle.inputs["installer_image"] == INSTALLER
    assert {vm.urn, named[("Resource", "lifecycle-master-1")].urn} <= set(lifecycle.dependencies)
    # The first node in roll order waits for its own VM only; every VM waits for the node plan's check.
    first_deps = {urns[d].name for d in named[("Resource", "lifecycle-master-1")].dependencies}
    assert first_deps <= {"master-1", "machineconfig-master-1"}
    assert {urns[d].name for d in vm.dependencies} == {"node-changes"}

    assert apply.inputs["node"] == "10.255.200.202"
    assert {vm.urn, config.urn, lifecycle.urn, named[("Upgrade", "kubernetes-upgrade")].urn} <= set(apply.dependencies)
    assert all(urns[d].name.endswith("master-2") for d in apply.dependencies if urns[d].name != "kubernetes-upgrade")
