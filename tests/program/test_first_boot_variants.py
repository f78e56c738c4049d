"""What the program registers for each first-boot variant of the dev stack, and the Cilium and CCM values it
sends: default, secure boot with TPM disk encryption, two Proxmox hosts, a shared ISO datastore, a Hubble UI
behind a LoadBalancer with an LB-IPAM pool, and CCM node IPAM."""

from __future__ import annotations


import pytest

from talos_proxmox.talos_config import machine_config, secrets_bundle
from tests.program.mocked_program import run_program, stack_config, with_sections

VM = "proxmoxve:index/vmLegacy:VmLegacy"
ISO = "proxmoxve:download/file:File"
RELEASE = "kubernetes:helm.sh/v3:Release"
POOL = "kubernetes:cilium.io/v2:CiliumLoadBalancerIPPool"
L2_POLICY = "kubernetes:cilium.io/v2alpha1:CiliumL2AnnouncementPolicy"
SERVICE = "kubernetes:core/v1:Service"


def dev(**sections) -> dict:
    return with_sections(stack_config("dev"), **sections)


@pytest.fixture(scope="module")
def bundle():
    return secrets_bundle.generate_secrets("v1.13.7")


def rendered(run, node: str, bundle) -> list[dict]:
    """The node's machine config as its MachineConfiguration renders it from the registered inputs."""
    inputs = {k: v for k, v in run.one("pulumi-python:dynamic:Resource", f"machineconfig-{node}").inputs.items()
              if k not in ("secrets", "__provider")}
    return machine_config.parse_config(machine_config.render(bundle, **inputs))


def test_default_one_iso_virtio_scsi_pci_seabios_and_pod_dns_that_works(bundle):
    run = run_program(dev(), stack="dev")
    [iso] = run.of_type(ISO)
    assert (iso.name, iso.inputs["nodeName"]) == ("image-iso", "pve")
    for vm in run.of_type(VM):
        assert vm.inputs["scsiHardware"] == "virtio-scsi-pci"
        assert [disk["iothread"] for disk in vm.inputs["disks"]] == [False]  # ignored behind virtio-scsi-pci
        assert not {"bios", "machine", "efiDisk", "tpmState"} & set(vm.inputs)
    cilium = run.one(RELEASE, "cilium").inputs
    assert cilium["values"]["bpf"] == {"masquerade": True, "hostLegacyRouting": True}
    assert "l2announcements" not in cilium["values"]
    assert not run.of_type(POOL) and not run.of_type(SERVICE)
    assert not [d for d in rendered(run, "dev-cp-1", bundle) if d.get("kind") == "VolumeConfig"]


def test_secure_boot_with_tpm_encryption(bundle):
    run = run_program(dev(image={"secureBoot": True}, cluster={"systemDiskEncryption": "tpm"}), stack="dev")
    for vm in run.of_type(VM):
        assert (vm.inputs["bios"], vm.inputs["machine"]) == ("ovmf", "q35")
        assert vm.inputs["efiDisk"] == {"datastoreId": "local-lvm", "fileFormat": "raw", "type": "4m",
                                        "preEnrolledKeys": False}
        assert vm.inputs["tpmState"] == {"datastoreId": "local-lvm", "version": "v2.0"}
    [iso] = run.of_type(ISO)
    assert iso.inputs["url"].endswith("/metal-amd64-secureboot.iso")
    for node in ("dev-cp-1", "dev-worker-1"):
        volumes = [d for d in rendered(run, node, bundle) if d.get("kind") == "VolumeConfig"]
        assert volumes == [
            {"apiVersion": "v1alpha1", "kind": "VolumeConfig", "name": name, "encryption": {
                "provider": "luks2", "keys": [{"slot": 0, "tpm": {"checkSecurebootStatusOnEnroll": True}}]}}
            for name in ("STATE", "EPHEMERAL")]
    v1alpha1 = rendered(run, "dev-cp-1", bundle)[0]
    assert "secureboot" in v1alpha1["machine"]["install"]["image"]


def test_two_proxmox_hosts_each_get_the_iso_and_each_vm_boots_its_hosts_copy():
    run = run_program(dev(nodes={1: {"proxmoxNode": "pve2"}}), stack="dev")
    isos = {iso.name: iso.inputs["nodeName"] for iso in run.of_type(ISO)}
    assert isos == {"image-iso": "pve", "image-iso-pve2": "pve2"}
    by_host = {iso.inputs["nodeName"]: f"{iso.inputs['datastoreId']}:iso/{iso.inputs['fileName']}"
               for iso in run.of_type(ISO)}
    for vm in run.of_type(VM):
        assert vm.inputs["cdrom"]["fileId"] == by_host[vm.inputs["nodeName"]]
    assert {vm.name: vm.inputs["nodeName"] for vm in run.of_type(VM)} == {"dev-cp-1": "pve", "dev-worker-1": "pve2"}


def test_a_shared_iso_datastore_has_one_copy_for_every_host():
    run = run_program(dev(nodes={1: {"proxmoxNode": "pve2"}}, proxmox={"isoDatastoreShared": True}), stack="dev")
    [iso] = run.of_type(ISO)
    assert iso.inputs["nodeName"] == "pve"
    assert {vm.inputs["cdrom"]["fileId"] for vm in run.of_type(VM)} == {
        f"{iso.inputs['datastoreId']}:iso/{iso.inputs['fileName']}"}


def test_load_balancer_ui_with_a_pool_announced_over_l2():
    run = run_program(dev(hubble={"uiServiceType": "LoadBalancer"},
                          cilium={"loadBalancerAddresses": ["10.10.0.60-10.10.0.69"]}), stack="dev")
    values = run.one(RELEASE, "cilium").inputs["values"]
    assert values["l2announcements"] == {"enabled": True} and "externalIPs" not in values
    assert values["hubble"]["ui"] == {"enabled": True}  # the chart's own Service stays ClusterIP
    [pool] = run.of_type(POOL)
    assert pool.inputs["spec"] == {"blocks": [{"start": "10.10.0.60", "stop": "10.10.0.69"}]}
    [policy] = run.of_type(L2_POLICY)
    assert policy.inputs["spec"] == {"loadBalancerIPs": True, "externalIPs": True}
    [service] = run.of_type(SERVICE)
    assert service.inputs["spec"]["type"] == "LoadBalancer"
    assert service.inputs["spec"]["selector"] == {"k8s-app": "hubble-ui"}


def test_node_ipam_runs_the_ccm_on_the_host_network():
    run = run_program(dev(ccm={"enabled": True, "nodeIpam": {"maskSizeIpv4": 24}}), stack="dev")
    values = run.one(RELEASE, "talos-ccm").inputs["values"]
    assert values["daemonSet"] == {"enabled": True}
    assert "node-ipam-controller" in values["enabledControllers"]
    spread = run_program(dev(ccm={"enabled": True}), stack="dev").one(RELEASE, "talos-ccm").inputs["values"]
    assert "daemonSet" not in spread
    assert spread["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "topologyKey"] == "kubernetes.io/hostname"
