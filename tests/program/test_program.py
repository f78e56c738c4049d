"""The whole program (`__main__.py`) under Pulumi mocks, for the seed's test-cluster stack."""

from __future__ import annotations

import copy

import pulumi
import pytest

from providers.kubernetes_upgrade import KubernetesUpgradeProvider

from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs
from talos_proxmox.settings.stack import load_settings
from tests.program.mocked_program import ProgramRun, Registration, run_program, stack_config

VM = "proxmoxve:index/vmLegacy:VmLegacy"
ISO = "proxmoxve:download/file:File"
DYNAMIC = "pulumi-python:dynamic:Resource"
SEED_ID = "e142ceb080fb243141b5b6891cfcf0c60bc9430d69be0adf803999d2b62dc885"
SEED_ISO_URL = f"https://factory.talos.dev/image/{SEED_ID}/v1.13.7/metal-amd64.iso"
NODES = stack_config("test-cluster")["nodes"]


@pytest.fixture(scope="module")
def run() -> ProgramRun:
    return run_program(stack_config("test-cluster"))


def by_urn(run: ProgramRun) -> dict[str, Registration]:
    return {r.urn: r for r in run.registrations}


def compared_inputs(registration: Registration) -> dict:
    """Inputs as their resource's diff compares them: a lifecycle's place in the roll ("3 of 9") only
    labels progress lines and its diff ignores it (test_node_lifecycle), so it is left out here."""
    return {key: value for key, value in registration.inputs.items() if key != "position"}


def dynamic(run: ProgramRun, name: str) -> Registration:
    return run.one(DYNAMIC, name)


def test_nine_vms_with_the_seeds_cpu_memory_disks_and_macs(run):
    vms = {r.name: r.inputs for r in run.of_type(VM)}
    assert sorted(vms) == sorted(n["name"] for n in NODES)
    for node in NODES:
        vm = vms[node["name"]]
        assert vm["vmId"] == node["vmId"]
        assert vm["nodeName"] == "pve"
        assert (vm["cpu"]["cores"], vm["cpu"]["type"]) == (node["cpu"], "host")
        assert vm["memory"]["dedicated"] == node["memory"]
        disks = [(d["interface"], d["datastoreId"], d["size"]) for d in vm["disks"]]
        expected = [("scsi0", "local-lvm", node["disk"])]
        if "dataDisk" in node:
            expected.append(("scsi1", "local-lvm", node["dataDisk"]["size"]))
        assert disks == expected
        assert vm["networkDevices"] == [{"bridge": "vmbr0", "macAddress": node["mac"], "model": "virtio"}]
        assert vm["bootOrders"] == ["scsi0", "ide2"]
        assert vm["agent"]["enabled"] is True
        assert vm["operatingSystem"] == {"type": "l26"}
    assert sum(len(v["disks"]) == 2 for v in vms.values()) == 3


def test_one_iso_download_from_the_factory_and_every_vm_boots_it(run):
    [iso] = run.of_type(ISO)
    assert iso.inputs["contentType"] == "iso"
    assert (iso.inputs["datastoreId"], iso.inputs["nodeName"]) == ("local", "pve")
    assert iso.inputs["url"] == SEED_ISO_URL
    file_id = f"local:iso/{iso.inputs['fileName']}"
    assert {r.inputs["cdrom"]["fileId"] for r in run.of_type(VM)} == {file_id}
    assert all(iso.urn in r.dependencies for r in run.of_type(VM))


def test_nine_machine_configs_rendered_from_the_same_inputs_as_the_render_command(run):
    settings = load_settings(stack_config("test-cluster"))
    installer = image_facts(settings).installer_image
    configs = run.named("machineconfig-", DYNAMIC)
    assert len(configs) == 9
    for node in settings.nodes:
        inputs = dynamic(run, f"machineconfig-{node.name}").inputs
        expected = machine_config_inputs(settings, node, installer)
        assert {k: inputs[k] for k in expected} == expected


def test_nine_applies_each_after_its_own_vm_and_config(run):
    urns = by_urn(run)
    applies = run.named("apply-", DYNAMIC)
    assert len(applies) == 9
    for node in NODES:
        apply = dynamic(run, f"apply-{node['name']}")
        assert apply.inputs["node"] == node["ip"]
        assert apply.inputs["mode"] == "auto"
        deps = {(urns[u].type, urns[u].name) for u in apply.dependencies}
        assert (VM, node["name"]) in deps
        assert (DYNAMIC, f"machineconfig-{node['name']}") in deps
        # Another node's VM is no reason to wait.
        assert not {name for t, name in deps if t == VM} - {node["name"]}


def test_one_bootstrap_on_node_201_after_its_apply_then_kubeconfig_then_addons(run):
    urns = by_urn(run)
    [bootstrap] = run.named("bootstrap", DYNAMIC)
    assert bootstrap.inputs["node"] == "10.255.200.201"
    assert dynamic(run, "apply-master-1").urn in bootstrap.dependencies
    [kubeconfig] = run.named("kubeconfig", DYNAMIC)
    assert kubeconfig.inputs["node"] == "10.255.200.201"
    assert bootstrap.urn in kubeconfig.dependencies
    assert "kubeconfig" in kubeconfig.additional_secret_outputs
    [provider] = run.of_type("pulumi:providers:kubernetes")
    assert kubeconfig.urn in provider.dependencies
    releases = run.of_type("kubernetes:helm.sh/v3:Release")
    assert sorted(r.name for r in releases) == ["cilium", "talos-ccm"]
    for release in releases:
        assert {bootstrap.urn, kubeconfig.urn} <= set(release.dependencies)
        assert urns[release.parent].type == "talos-proxmox:index:ClusterAddons"


def test_secrets_are_protected_and_secret_outputs_are_marked_secret(run):
    secrets = dynamic(run, "secrets")
    assert secrets.protect is True
    assert {"bundle", "secrets_yaml"} <= set(secrets.additional_secret_outputs)
    assert "talosconfig" in dynamic(run, "talosconfig").additional_secret_outputs
    assert all("machine_configuration" in r.additional_secret_outputs for r in run.named("machineconfig-", DYNAMIC))
    assert {"talosconfig", "kubeconfig"} <= run.secret_exports
    assert not {"endpoint", "nodeIps", "schematicId", "installerImage"} & run.secret_exports


def test_deletion_protection_depends_on_every_resource_and_is_protected(run):
    """`pulumi destroy` deletes dependents first: a protected resource that depends on everything is the
    first it reaches, so it stops before anything is touched. Unprotected when the stack says so, and the
    secrets with it."""
    [guard] = run.of_type("talos-proxmox:index:DeletionProtection")
    assert guard.protect is True
    custom = {r.urn for r in run.registrations if r.custom and not r.type.startswith("pulumi:providers:")}
    assert custom <= set(guard.dependencies)
    config = stack_config("test-cluster")
    config["cluster"]["deletionProtection"] = False
    unprotected = run_program(config)
    [guard] = unprotected.of_type("talos-proxmox:index:DeletionProtection")
    assert guard.protect is False and dynamic(unprotected, "secrets").protect is False


def test_no_kubernetes_provider_without_an_add_on(run):
    assert run.of_type("pulumi:providers:kubernetes")
    config = stack_config("test-cluster")
    config["cilium"] = {"enabled": False}
    config["ccm"] = {"enabled": False}
    assert not run_program(config).of_type("pulumi:providers:kubernetes")


def test_exports(run):
    assert run.exports["endpoint"] == "https://10.255.200.201:6443"
    assert run.exports["nodeIps"] == {n["name"]: n["ip"] for n in NODES}
    assert run.exports["schematicId"] == SEED_ID
    assert run.exports["installerImage"] == f"factory.talos.dev/installer/{SEED_ID}:v1.13.7"
    assert run.exports["hubbleUiAddress"] == "http://hubble-ui.kube-system.svc.cluster.local:80"


def test_preview_reads_as_a_tree_under_the_cluster(run):
    urns = by_urn(run)
    [cluster] = run.of_type("talos-proxmox:index:TalosCluster")
    assert cluster.parent.endswith("pulumi:pulumi:Stack::talos-proxmox-test-cluster")
    for vm in run.of_type(VM):
        node = urns[vm.parent]
        assert (node.type, node.name) == ("talos-proxmox:index:TalosNode", vm.name)
        assert node.parent == cluster.urn
    for name in ("secrets", "talosconfig", "bootstrap", "kubeconfig"):
        assert dynamic(run, name).parent == cluster.urn
    [iso] = run.of_type(ISO)
    assert urns[iso.parent].type == "talos-proxmox:index:TalosImage"
    assert urns[iso.parent].parent == cluster.urn


def test_preview_registers_the_same_resources_with_the_configs_inputs_known(run):
    """In a preview the cluster's own values are known (computed locally), so the diff shows them."""
    preview = run_program(stack_config("test-cluster"), preview=True)
    assert sorted(r.urn for r in preview.registrations) == sorted(r.urn for r in run.registrations)
    config = preview.one(DYNAMIC, "machineconfig-worker-1").inputs
    assert config["role"] == "worker" and config["patches"] == dynamic(run, "machineconfig-worker-1").inputs["patches"]
    assert preview.exports["schematicId"] == SEED_ID


def test_changing_one_workers_memory_changes_only_that_vm(run):
    config = stack_config("test-cluster")
    config["nodes"][4]["memory"] = 8192  # worker-2
    changed = run_program(config)
    before, after = by_urn(run), by_urn(changed)
    assert before.keys() == after.keys()
    differing = {(after[u].type, after[u].name): after[u] for u in before
                 if compared_inputs(before[u]) != compared_inputs(after[u])}
    # The VM takes it as pending config; its lifecycle records it and reboots that VM in its turn; the
    # cluster's node plan records it too.
    assert differing.keys() == {(VM, "worker-2"), (DYNAMIC, "lifecycle-worker-2"), (DYNAMIC, "node-changes")}
    vm = differing[(VM, "worker-2")]
    assert vm.inputs["memory"]["dedicated"] == 8192 and vm.inputs["rebootAfterUpdate"] is False
    assert differing[(DYNAMIC, "lifecycle-worker-2")].inputs["vm"]["memory_mib"] == 8192
    assert differing[(DYNAMIC, "node-changes")].inputs["nodes"]["worker-2"]["vm"]["memory_mib"] == 8192


def test_a_vm_is_replaced_delete_first_on_a_new_id_host_or_mac_after_the_node_plan_is_checked(run):
    regs = by_urn(run)
    [changes] = [r for r in regs.values() if r.name == "node-changes"]
    vms = [r for r in regs.values() if r.type == VM]
    assert len(vms) == 9
    for vm in vms:
        assert vm.replace_on_changes == ["vmId", "nodeName", "networkDevices[0].macAddress"], vm.name
        # only the disks' speed blocks, which the bridge defaults and the provider reads back empty
        assert vm.delete_before_replace and vm.ignore_changes == ["disks[0].speed", "disks[1].speed"], vm.name
        assert changes.urn in vm.dependencies, vm.name
    # The node's apply and lifecycle follow the VM through its id; the install wait counts it.
    [apply] = [r for r in regs.values() if r.name == "apply-worker-2"]
    assert apply.inputs["vm_id"] == [vm for vm in vms if vm.name == "worker-2"][0].inputs["vmId"]
    [installed] = [r for r in regs.values() if r.name == "nodes-installed"]
    assert {node["name"]: node["vm_id"] for node in installed.inputs["nodes"]} == {
        vm.name: vm.inputs["vmId"] for vm in vms}
    assert changes.inputs["nodes"]["master-1"] == {"role": "controlplane", "vm": regs[next(
        u for u, r in regs.items() if r.name == "lifecycle-master-1")].inputs["vm"], "vm_made_with": {
        "vm_datastore": "local-lvm", "bridge": "vmbr0", "secure_boot": False, "platform": "metal"}}


def test_removing_a_worker_removes_only_its_resources(run):
    config = stack_config("test-cluster")
    config["nodes"] = [n for n in config["nodes"] if n["name"] != "worker-6"]
    smaller = run_program(config)
    before, after = by_urn(run), by_urn(smaller)
    gone = {(before[u].type, before[u].name) for u in before.keys() - after.keys()}
    assert gone == {("talos-proxmox:index:TalosNode", "worker-6"), (VM, "worker-6"),
                    (DYNAMIC, "machineconfig-worker-6"), (DYNAMIC, "apply-worker-6"),
                    (DYNAMIC, "lifecycle-worker-6")}
    assert not after.keys() - before.keys()
    # Everything else is untouched, the talosconfig included; only the node plan, the health and install
    # waits and the Kubernetes upgrade (whose diff compares the versions only) count nodes.
    changed = {(after[u].type, after[u].name) for u in after
               if compared_inputs(after[u]) != compared_inputs(before[u])}
    assert changed == {(DYNAMIC, "health"), (DYNAMIC, "nodes-installed"), (DYNAMIC, "node-changes"),
                       (DYNAMIC, "kubernetes-upgrade")}
    upgrade = dynamic(smaller, "kubernetes-upgrade")
    assert not KubernetesUpgradeProvider().diff("id", dynamic(run, "kubernetes-upgrade").inputs, upgrade.inputs).changes
    assert dynamic(smaller, "lifecycle-worker-5").inputs["position"] == "8 of 8"


def test_bad_stack_registers_nothing_and_raises_the_settings_error():
    config = copy.deepcopy(stack_config("test-cluster"))
    config["nodes"][1]["ip"] = "10.255.200.201"
    config["nodes"][7]["mac"] = "not-a-mac"
    with pytest.raises(pulumi.RunError) as caught:  # printed by Pulumi as the message alone, no traceback
        run_program(config)
    message = str(caught.value)
    assert "talos-proxmox:nodes[1].ip: '10.255.200.201' duplicates nodes[0].ip (expected unique values)" in message
    assert "talos-proxmox:nodes[7].mac: 'not-a-mac' is not a MAC address" in message
    assert caught.value.program_run.registrations == []


def test_plain_text_proxmox_token_registers_nothing_and_is_never_printed():
    token = "root@pam!pulumi=0b7c4c3e-7f0e-4c8e-9d7a-2f5d3a1b9c11"
    with pytest.raises(pulumi.RunError) as caught:
        run_program(stack_config("test-cluster"), other_config={"proxmoxve:apiToken": token})
    assert "proxmoxve:apiToken" in str(caught.value)
    assert token not in str(caught.value)
    assert caught.value.program_run.registrations == []
    # The same token set with --secret is fine.
    run = run_program(stack_config("test-cluster"), other_config={"proxmoxve:apiToken": token},
                      secret_keys=["proxmoxve:apiToken"])
    assert len(run.of_type(VM)) == 9


def test_settings_warnings_reach_pulumi_log():
    config = stack_config("test-cluster")
    config["nodes"] = [n for n in config["nodes"] if n["name"] != "master-3"]
    run = run_program(config)
    assert any("2 control-plane nodes is an even number" in w for w in run.warnings)


def test_hubble_ui_address_is_null_when_the_ui_is_off():
    config = stack_config("test-cluster")
    config["hubble"] = {**config["hubble"], "ui": False}
    assert run_program(config).exports["hubbleUiAddress"] is None


def test_lifecycle_settings_reach_every_nodes_lifecycle(run):
    for node in NODES:
        inputs = dynamic(run, f"lifecycle-{node['name']}").inputs
        assert (inputs["timeout_seconds"], inputs["reset_on_delete"]) == (1200, True)
        assert inputs["position"] == f"{NODES.index(node) + 1} of {len(NODES)}"
    config = stack_config("test-cluster")
    config["lifecycle"] = {"timeoutSeconds": 2400, "resetOnDelete": False}
    changed = run_program(config)
    for node in NODES:
        inputs = dynamic(changed, f"lifecycle-{node['name']}").inputs
        assert (inputs["timeout_seconds"], inputs["reset_on_delete"]) == (2400, False)
