"""TalosImage under Pulumi mocks: the registered Schematic and proxmoxve download.File, and their wiring."""

from __future__ import annotations

import pulumi
import pytest
from pulumi.runtime.mocks import MockMonitor

from components.image import TalosImage, proxmox_iso_name
from talos_proxmox.image_factory.images import SchematicError
from providers.schematic import schematic_outputs
from tests.stand_ins.image_factory import SEED_ID, SEED_SCHEMATIC

DYNAMIC = "pulumi-python:dynamic:Resource"
FILE = "proxmoxve:download/file:File"
COMPONENT = "talos-proxmox:index:TalosImage"


class RecordingMonitor(MockMonitor):
    """Also keeps each registration's parent and dependencies, which Mocks.new_resource does not see."""

    def __init__(self, mocks):
        super().__init__(mocks)
        self.registrations: dict[str, dict] = {}

    def RegisterResource(self, request):  # noqa: N802 - the gRPC method name
        response = super().RegisterResource(request)
        self.registrations[request.name] = {"type": request.type, "parent": request.parent,
                                            "dependencies": list(request.dependencies), "urn": response.urn,
                                            "retain_on_delete": request.retainOnDelete}
        return response


class Mocks(pulumi.runtime.Mocks):
    def __init__(self):
        self.inputs: dict[str, dict] = {}

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.inputs[args.name] = dict(args.inputs)
        if args.typ == DYNAMIC:
            # What the provider's create returns, without the network.
            outs = schematic_outputs(args.inputs)
            return outs["schematic_id"], outs
        if args.typ == FILE:
            return f"{args.inputs['datastoreId']}:iso/{args.inputs['fileName']}", dict(args.inputs)
        return f"{args.name}-id", dict(args.inputs)

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


@pytest.fixture
def mocks():
    m = Mocks()
    monitor = RecordingMonitor(m)
    pulumi.runtime.set_mocks(m, project="talos-proxmox", stack="test", preview=False, monitor=monitor)
    m.monitor = monitor
    return m


@pulumi.runtime.test
def test_talos_image_downloads_the_factory_iso_into_proxmox(mocks):
    image = TalosImage("talos", SEED_SCHEMATIC, "v1.13.7", cluster="test-cluster", factory_url="https://factory.talos.dev",
                       proxmox_nodes=["pve1"], iso_datastore="local")

    def check(values):
        iso_file_id, installer, sid, iso_url = values
        file_inputs = mocks.inputs["talos-iso"]
        expected_name = f"talos-test-cluster-{SEED_ID[:12]}-v1.13.7-metal-amd64.iso"
        assert file_inputs == {
            "contentType": "iso",
            "datastoreId": "local",
            "nodeName": "pve1",
            "url": f"https://factory.talos.dev/image/{SEED_ID}/v1.13.7/metal-amd64.iso",
            "fileName": expected_name,
            "overwrite": False,
            # A file of this name is this image: another stack's copy is adopted, not an error.
            "overwriteUnmanaged": True,
            "uploadTimeout": 1800,
        }
        assert iso_file_id == f"local:iso/{expected_name}"
        assert installer == f"factory.talos.dev/installer/{SEED_ID}:v1.13.7"
        assert sid == SEED_ID
        assert iso_url == file_inputs["url"]

        schematic_inputs = mocks.inputs["talos-schematic"]
        assert schematic_inputs["schematic"] == SEED_SCHEMATIC
        assert (schematic_inputs["talos_version"], schematic_inputs["factory_url"], schematic_inputs["platform"],
                schematic_inputs["arch"], schematic_inputs["secure_boot"]) == (
                    "v1.13.7", "https://factory.talos.dev", "metal", "amd64", False)
        assert "__provider" in schematic_inputs  # the provider was serialized for the engine

        regs = mocks.monitor.registrations
        component_urn = regs["talos"]["urn"]
        assert regs["talos"]["type"] == COMPONENT
        assert regs["talos-schematic"]["parent"] == component_urn
        assert regs["talos-iso"]["parent"] == component_urn
        assert regs["talos-schematic"]["urn"] in regs["talos-iso"]["dependencies"]
        assert regs["talos-iso"]["retain_on_delete"] is True  # another stack's VMs may boot it

    return pulumi.Output.all(image.iso_file_id, image.installer_image, image.schematic_id,
                             image.iso_url).apply(check)


@pulumi.runtime.test
def test_private_factory_secure_boot_arm64(mocks):
    image = TalosImage("img", SEED_SCHEMATIC, "1.13.7", cluster="test-cluster", factory_url="http://127.0.0.1:8080/",
                       platform="metal", arch="arm64", secure_boot=True, proxmox_nodes=["pve2"],
                       iso_datastore="isos")

    def check(values):
        iso_file_id, installer = values
        file_inputs = mocks.inputs["img-iso"]
        assert file_inputs["url"] == f"http://127.0.0.1:8080/image/{SEED_ID}/v1.13.7/metal-arm64-secureboot.iso"
        assert file_inputs["fileName"] == f"talos-test-cluster-{SEED_ID[:12]}-v1.13.7-metal-arm64-secureboot.iso"
        assert (file_inputs["nodeName"], file_inputs["datastoreId"]) == ("pve2", "isos")
        assert iso_file_id == f"isos:iso/{file_inputs['fileName']}"
        assert installer == f"127.0.0.1:8080/installer-secureboot/{SEED_ID}:v1.13.7"

    return pulumi.Output.all(image.iso_file_id, image.installer_image).apply(check)


@pulumi.runtime.test
def test_a_new_schematic_or_version_gets_a_new_file_name(mocks):
    other = {"customization": {"extraKernelArgs": ["net.ifnames=0"]}}
    names = {proxmox_iso_name("test-cluster", SEED_ID, "v1.13.7", "metal", "amd64", False),
             proxmox_iso_name("test-cluster", SEED_ID, "v1.13.8", "metal", "amd64", False),
             proxmox_iso_name("test-cluster", SEED_ID, "v1.13.7", "nocloud", "amd64", False),
             # another cluster's copy of the same image: the provider never deletes the other's file as unmanaged
             proxmox_iso_name("prod", SEED_ID, "v1.13.7", "metal", "amd64", False)}
    assert len(names) == 4
    image = TalosImage("other", other, "v1.13.7", cluster="test-cluster", proxmox_nodes=["pve1"])

    def check(values):
        sid, iso_file_id = values
        assert sid != SEED_ID
        assert iso_file_id == f"local:iso/talos-test-cluster-{sid[:12]}-v1.13.7-metal-amd64.iso"

    return pulumi.Output.all(image.schematic_id, image.iso_file_id).apply(check)


def test_bad_settings_fail_before_anything_is_registered(mocks):
    @pulumi.runtime.test
    def attempt():  # runs the program and waits for every registration it started
        with pytest.raises(SchematicError, match="customization: unknown key 'systemExtension'"):
            TalosImage("bad", {"customization": {"systemExtension": {}}}, "v1.13.7", cluster="test-cluster", proxmox_nodes=["pve1"])
        with pytest.raises(SchematicError, match="arch: 'x86_64' is not one of amd64, arm64"):
            TalosImage("bad2", SEED_SCHEMATIC, "v1.13.7", cluster="test-cluster", arch="x86_64", proxmox_nodes=["pve1"])
        with pytest.raises(SchematicError, match="factory_url: 'factory.talos.dev' is not an http"):
            TalosImage("bad3", SEED_SCHEMATIC, "v1.13.7", cluster="test-cluster", factory_url="factory.talos.dev", proxmox_nodes=["pve1"])
        TalosImage("good", SEED_SCHEMATIC, "v1.13.7", cluster="test-cluster", proxmox_nodes=["pve1"])

    attempt()
    assert sorted(mocks.monitor.registrations) == ["good", "good-iso", "good-schematic"]


@pulumi.runtime.test
def test_every_proxmox_host_gets_its_own_copy_under_a_stable_name(mocks):
    """VMs on other hosts boot a copy on their host; the first host keeps the single-host resource name."""
    image = TalosImage("talos", SEED_SCHEMATIC, "v1.13.7", cluster="test-cluster", proxmox_nodes=["pve1", "pve2", "pve3", "pve2"])

    def check(ids):
        assert set(image.iso_file_ids) == {"pve1", "pve2", "pve3"}
        assert [mocks.inputs[n]["nodeName"] for n in ("talos-iso", "talos-iso-pve2", "talos-iso-pve3")] == [
            "pve1", "pve2", "pve3"]
        assert len({mocks.inputs[n]["fileName"] for n in ("talos-iso", "talos-iso-pve2", "talos-iso-pve3")}) == 1
        assert ids[0] == ids[1]  # iso_file_id is the first host's

    # every copy's id, so that the check runs once all three are registered (not only the first)
    return pulumi.Output.all(image.iso_file_id, *(image.iso_file_ids[host] for host in ("pve1", "pve2", "pve3"))
                             ).apply(check)
