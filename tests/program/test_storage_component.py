"""The Proxmox CSI plugin as the program registers it (Pulumi mocks): a Proxmox role of exactly the plugin's
privileges, a user holding it on `/`, that user's token (a secret output) written only into a Kubernetes
Secret, the plugin's release reading that Secret, and the nodes' topology from the Talos CCM or the Proxmox
CCM. The real provider against the PVE stand-in and the real charts: tests/engine/test_storage.py."""

from __future__ import annotations

import yaml

from talos_proxmox.cluster_plan.storage_values import CSI_PRIVILEGES, PROXMOX_CCM_PRIVILEGES
from tests.program.mocked_program import MOCK_TOKEN_SECRET, ProgramRun, run_program, stack_config

ROLE, USER, ACL, TOKEN = ("proxmoxve:index/roleLegacy:RoleLegacy", "proxmoxve:index/userLegacy:UserLegacy",
                          "proxmoxve:index/acl:Acl", "proxmoxve:user/token:Token")
RELEASE, SECRET, NAMESPACE = ("kubernetes:helm.sh/v3:Release", "kubernetes:core/v1:Secret",
                              "kubernetes:core/v1:Namespace")
PROXMOX = {"proxmoxve:endpoint": "https://pve.lab.local:8006/", "proxmoxve:insecure": "false"}
CLASSES = [{"name": "proxmox-data", "datastore": "local-lvm", "default": True, "ssd": True, "cache": "none"},
           {"name": "proxmox-xfs", "datastore": "ceph-vm", "fsType": "xfs", "reclaimPolicy": "Retain"}]


def with_csi(**csi) -> ProgramRun:
    config = stack_config("test-cluster")
    config["proxmox"] = {**config["proxmox"], "datastores": ["ceph-vm"]}
    if "ccm" in csi:
        config["ccm"] = {**config.get("ccm", {}), **csi.pop("ccm")}
    config["csi"] = {"enabled": True, "region": "lab", "storageClasses": CLASSES, **csi}
    return run_program(config, other_config=PROXMOX)


def plain(value):
    """A registered input with Pulumi's secret wrapper taken off."""
    if isinstance(value, dict) and value.get("4dabf18193072939515e22adb298388d") == "1b47061264138c4ac30d75fd1eb44270":
        return value["value"]
    return value


def test_the_plugin_s_role_user_acl_and_token_exactly():
    run = with_csi()
    role = run.one(ROLE, "csi-role").inputs
    assert role == {"roleId": "k8s-test-cluster-csi", "privileges": list(CSI_PRIVILEGES)}
    assert sorted(CSI_PRIVILEGES) == ["Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.Audit",
                                      "VM.Audit", "VM.Config.Disk"]
    assert run.one(USER, "csi-user").inputs["userId"] == "test-cluster-csi@pve"
    acl = run.one(ACL, "csi-acl").inputs
    assert (acl["path"], acl["roleId"], acl["userId"], acl["propagate"]) == (
        "/", "k8s-test-cluster-csi", "test-cluster-csi@pve", True)
    token = run.one(TOKEN, "csi-token")
    assert (token.inputs["userId"], token.inputs["tokenName"], token.inputs["privilegesSeparation"]) == (
        "test-cluster-csi@pve", "kubernetes", False)
    assert run.one(ACL, "csi-acl").urn in token.dependencies  # no token before its user may do anything
    assert not run.of_type("proxmoxve:index/roleLegacy:RoleLegacy")[1:]  # no Proxmox CCM: one identity


def test_the_token_reaches_only_the_plugin_s_secret_and_the_release_reads_it():
    run = with_csi()
    secret = run.one(SECRET, "csi-config")
    assert secret.inputs["metadata"] == {"name": "proxmox-csi-plugin-config", "namespace": "csi-proxmox"}
    string_data = secret.inputs["stringData"]
    assert plain(string_data) != string_data, "the config is sent as a secret"
    assert yaml.safe_load(plain(string_data)["config.yaml"]) == {"clusters": [{
        "url": "https://pve.lab.local:8006/api2/json", "insecure": False,
        "token_id": "test-cluster-csi@pve!kubernetes", "token_secret": MOCK_TOKEN_SECRET, "region": "lab"}]}
    assert not any(MOCK_TOKEN_SECRET in repr(r.inputs) for r in run.registrations
                   if r.type not in (SECRET, TOKEN)), "the token's secret went elsewhere"
    namespace = run.one(NAMESPACE, "csi-namespace").inputs["metadata"]
    assert namespace["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    release = run.one(RELEASE, "proxmox-csi")
    assert (release.inputs["chart"], release.inputs["version"], release.inputs["namespace"]) == (
        "oci://ghcr.io/sergelogvinov/charts/proxmox-csi-plugin", "0.5.9", "csi-proxmox")
    assert secret.urn in release.dependencies
    values = release.inputs["values"]
    assert (values["existingConfigSecret"], values["existingConfigSecretKey"]) == ("proxmox-csi-plugin-config",
                                                                                  "config.yaml")
    assert "config" not in values  # the chart's own Secret would hold the token in the release's values
    assert values["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert values["storageClass"] == [
        {"name": "proxmox-data", "storage": "local-lvm", "reclaimPolicy": "Delete", "fstype": "ext4",
         "cache": "none", "ssd": True, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        {"name": "proxmox-xfs", "storage": "ceph-vm", "reclaimPolicy": "Retain", "fstype": "xfs"}]


def test_the_talos_ccm_labels_each_node_with_the_region_and_its_proxmox_host():
    run = with_csi()
    config = stack_config("test-cluster")
    hosts: dict[str, list[str]] = {}
    for node in config["nodes"]:
        hosts.setdefault(node.get("proxmoxNode", config["proxmox"]["node"]), []).append(node["name"])
    transformations = run.one(RELEASE, "talos-ccm").inputs["values"]["transformations"]
    assert transformations == [
        {"name": f"proxmox-{host}",
         "nodeSelector": [{"matchExpressions": [{"key": "hostname", "operator": "In", "values": names}]}],
         "platformMetadata": {"Region": "lab", "Zone": host}} for host, names in hosts.items()]
    assert not run.named("proxmox-ccm", RELEASE)


def test_the_proxmox_ccm_gets_its_own_identity_and_the_talos_ccm_no_transformations():
    run = with_csi(topologyLabels="proxmox-ccm", ccm={"controllers": ["node-csr-approval"]})
    assert run.one(ROLE, "ccm-role").inputs == {"roleId": "k8s-test-cluster-ccm",
                                                "privileges": list(PROXMOX_CCM_PRIVILEGES)}
    assert run.one(SECRET, "ccm-config").inputs["metadata"] == {
        "name": "proxmox-cloud-controller-manager-config", "namespace": "kube-system"}
    release = run.one(RELEASE, "proxmox-ccm").inputs
    assert (release["chart"], release["version"]) == (
        "oci://ghcr.io/sergelogvinov/charts/proxmox-cloud-controller-manager", "0.2.27")
    assert release["values"]["enabledControllers"] == ["cloud-node", "cloud-node-lifecycle"]
    assert "transformations" not in run.one(RELEASE, "talos-ccm").inputs["values"]


def test_without_csi_nothing_of_it_is_made():
    run = run_program(stack_config("test-cluster"), other_config=PROXMOX)
    assert not [r for r in run.registrations if r.type in (ROLE, USER, ACL, TOKEN, NAMESPACE, SECRET)]
    assert "transformations" not in run.one(RELEASE, "talos-ccm").inputs["values"]
