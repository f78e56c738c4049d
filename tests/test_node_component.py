"""The Proxmox VM each node gets, and the node component's wiring (VM -> machine config -> apply)."""

from __future__ import annotations

import dataclasses

import pulumi_proxmoxve as proxmoxve
import pytest

from components.node import vm_args, vm_tags
from providers.settings import load_settings
from tests.mocked_program import stack_config

ISO = "local:iso/talos-e142ceb080fb-v1.13.7-metal-amd64.iso"


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
    # Every keyword is one VmLegacy takes: a typo here would only fail against a real Proxmox.
    proxmoxve.VmLegacyArgs(**args)


def test_worker_with_data_disk_gets_scsi1_of_30_gb_on_the_vm_datastore(settings):
    args = vm_args(settings, node(settings, "worker-1"), ISO)
    assert (args["cpu"].cores, args["memory"].dedicated) == (3, 6144)
    assert [(d.interface, d.datastore_id, d.size) for d in args["disks"]] == [
        ("scsi0", "local-lvm", 15), ("scsi1", "local-lvm", 30)]
    assert args["network_devices"][0].mac_address == "bc:24:11:80:a1:9e"
    assert args["tags"] == ["talos", "test-cluster", "worker"]


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
