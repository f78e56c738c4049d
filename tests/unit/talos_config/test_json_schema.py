"""Every rendered document validates against the JSON schema its Talos release publishes.

tests/data/talos-schemas/<tag>.json is siderolabs/talos pkg/machinery/config/schemas/config.schema.json
at the newest patch of each release line we render (git show <tag>:...). Talos leaves the fields it
deprecates out of that schema; what we still emit of it — `persist` (which `talosctl gen config` itself
writes), machine.network (interfaces, nameservers, kubespan) and machine.disks — are the only deviations
allowed, and this test pins that they are.
"""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

from talos_proxmox.cluster_plan.resource_inputs import image_facts, machine_config_inputs
from talos_proxmox.settings.stack import load_settings
from talos_proxmox.talos_config import machine_config, secrets_bundle
from tests.program.mocked_program import stack_config
from tests.paths import DATA

SCHEMAS = DATA / "talos-schemas"
RELEASES = {"v1.12": "v1.12.9", "v1.13": "v1.13.7", "v1.14": "v1.14.0-rc.1"}
# Deprecated v1alpha1 fields we still render (to move to LinkConfig/ResolverConfig/KubeSpanConfig and
# UserVolumeConfig documents); nothing else may fall outside the schema.
DEPRECATED_FIELDS = (("persist",), ("machine", "disks"))

# Kinds a release's schema spells otherwise than Talos registers them (v1.14.0-rc.1's schemaMeta says
# UnattendedInstall; Talos decodes only UnattendedInstallConfig, as its own gen config writes).
SCHEMA_KIND_MISTAKES = {"UnattendedInstallConfig": "UnattendedInstall"}

VARIANTS = {
    "test-cluster": ("test-cluster", {}),
    "dev (VIP)": ("dev", {}),
    "kubespan on": ("dev", {"cluster": {"kubespan": {"enabled": True, "mtu": 1420}}}),
    "ccm with node ipam": ("dev", {"ccm": {"enabled": True, "nodeIpam": {"maskSizeIpv4": 24}}}),
    "nocloud": ("dev", {"image": {"platform": "nocloud"}}),
    "secure boot + tpm": ("dev", {"image": {"secureBoot": True}, "cluster": {"systemDiskEncryption": "tpm"}}),
    "no cilium": ("dev", {"cilium": {"enabled": False}}),
    "extra patches": ("dev", {"cluster": {"patches": [
        {"machine": {"sysctls": {"vm.max_map_count": "262144"}}},
        [{"op": "add", "path": "/machine/kubelet/extraArgs", "value": {"max-pods": "150"}}]]}}),
}


def _variant(name: str, line: str):
    stack, changes = VARIANTS[name]
    raw = copy.deepcopy(stack_config(stack))
    for key, value in changes.items():
        raw[key] = {**(raw.get(key) or {}), **value}
    raw["cluster"]["talosVersion"] = RELEASES[line]
    raw["cluster"].pop("kubernetesVersion", None)
    if line == "v1.14":  # the data disk is a user volume, and the kubelet's arguments are in its own document
        for node in raw["nodes"]:
            if node.get("dataDisk"):
                node["dataDisk"] = {**node["dataDisk"], "mountpoint": "/var/mnt/longhorn"}
        if raw["cluster"].get("patches"):  # "extra patches" in the documents that hold those settings from v1.14
            raw["cluster"]["patches"] = [
                {"apiVersion": "v1alpha1", "kind": "SysctlConfig", "params": {"vm.max_map_count": "262144"}},
                {"apiVersion": "v1alpha1", "kind": "KubeletConfig", "extraArgs": {"max-pods": "150"}}]
    return load_settings(raw)


@pytest.fixture(scope="module")
def bundles():
    return {line: secrets_bundle.generate_secrets(tag) for line, tag in RELEASES.items()}


class KindValidator:
    """The release's schema, applied to one document through the definition of its kind (the top-level
    oneOf only says "none matched"). Messages name paths and rules, never values (documents hold keys)."""

    def __init__(self, schema: dict):
        self.schema = schema

    def errors(self, document: dict) -> list:
        kind = document.get("kind")
        name = "v1alpha1.Config" if kind is None else next(
            d for d in self.schema["$defs"] if d.split(".")[-1] == f"{kind}V1Alpha1")
        if kind in SCHEMA_KIND_MISTAKES:
            document = {**document, "kind": SCHEMA_KIND_MISTAKES[kind]}
        schema = {k: v for k, v in self.schema.items() if k != "oneOf"}
        validator = jsonschema.Draft202012Validator({**schema, "$ref": f"#/$defs/{name}"})
        return sorted(validator.iter_errors(document), key=lambda e: e.json_path)


def describe(errors: list) -> str:
    return "; ".join(f"{e.json_path}: {e.validator} {e.validator_value if e.validator != 'additionalProperties' else ''}"
                     f"{sorted(set(e.instance) - set(e.schema.get('properties', {}))) if e.validator == 'additionalProperties' else ''}"
                     for e in errors)


@pytest.fixture(scope="module")
def validators():
    return {line: KindValidator(json.loads((SCHEMAS / f"{tag}.json").read_text())) for line, tag in RELEASES.items()}


@pytest.mark.parametrize("line", sorted(RELEASES))
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_document_of_every_node_is_in_the_releases_schema(variant, line, bundles, validators):
    settings = _variant(variant, line)
    installer = image_facts(settings).installer_image
    for node in settings.nodes:
        text = machine_config.render(bundles[line], **machine_config_inputs(settings, node, installer))
        for document in machine_config.parse_config(text):
            kind = document.get("kind", "v1alpha1")
            if kind == "v1alpha1":
                document = copy.deepcopy(document)
                for *parents, field in DEPRECATED_FIELDS:
                    container = document
                    for parent in parents:
                        container = container[parent]
                    container.pop(field, None)
            assert (node.name, kind, describe(validators[line].errors(document))) == (node.name, kind, "")


def test_the_deprecated_fields_are_the_only_deviation_and_the_schema_sees_them(bundles, validators):
    settings = _variant("test-cluster", "v1.13")
    worker = next(n for n in settings.nodes if n.data_disk is not None)
    text = machine_config.render(bundles["v1.13"], **machine_config_inputs(
        settings, worker, image_facts(settings).installer_image))
    v1alpha1 = machine_config.parse_config(text)[0]
    assert describe(validators["v1.13"].errors(v1alpha1)) == (
        "$: additionalProperties ['persist']; $.machine: additionalProperties ['disks']")
    # And a field the schema does not know is caught, with its path.
    v1alpha1["machine"]["kubelet"]["extraArgz"] = {}
    assert "$.machine.kubelet: additionalProperties ['extraArgz']" in describe(validators["v1.13"].errors(v1alpha1))


def test_from_v1_14_persist_is_the_only_deviation(bundles, validators):
    settings = _variant("test-cluster", "v1.14")
    worker = next(n for n in settings.nodes if n.data_disk is not None)
    text = machine_config.render(bundles["v1.14"], **machine_config_inputs(
        settings, worker, image_facts(settings).installer_image))
    documents = machine_config.parse_config(text)
    assert describe(validators["v1.14"].errors(documents[0])) == "$: additionalProperties ['persist']"
    assert [describe(validators["v1.14"].errors(d)) for d in documents[1:]] == [""] * (len(documents) - 1)
    volume = next(d for d in documents if d.get("kind") == "UserVolumeConfig")
    assert volume == {"apiVersion": "v1alpha1", "kind": "UserVolumeConfig", "name": "longhorn", "provisioning": {
        "diskSelector": {"match": 'disk.dev_path == "/dev/sdb"'}, "minSize": "30GB"}}
