"""Every key of the Helm values we render exists in the chart we install (../shared/charts, the real
Cilium and Talos CCM charts at the versions the stacks pin).

Helm ignores a key the chart's templates never read, so a misspelt or wrong-version key installs fine and
does nothing (the CCM's node-IPAM values once set `useDaemonSet`, which chart 0.5.4 does not have: it
reads `daemonSet.enabled`). Each rendered value is walked against the chart's own defaults
(values.yaml): a key must be there, except below a default that is an empty map or null (free-form, e.g.
annotations). Where the chart has a values.schema.json (Cilium), the values must also pass it.
"""

from __future__ import annotations

import copy
import json
import tarfile
from typing import Any, Iterator

import jsonschema
import pytest
import yaml

from talos_proxmox.cluster_plan.addon_values import ccm_values, cilium_values
from talos_proxmox.cluster_plan.storage_values import csi_values, proxmox_ccm_values
from talos_proxmox.settings.stack import load_settings, stack_file_config
from tests.paths import SHARED, STACKS

CHARTS = SHARED / "charts"


def chart_file(chart: str, version: str, name: str) -> bytes:
    archive = CHARTS / f"{chart}-{version}.tgz"
    if not archive.exists():
        pytest.fail(f"{archive} is missing: the real charts are in ../shared/charts beside the checkout")
    with tarfile.open(archive) as tar:
        member = tar.extractfile(f"{chart}/{name}")
        assert member is not None, (archive, name)
        return member.read()


def unknown_keys(values: Any, defaults: Any, path: str = "") -> Iterator[str]:
    """Paths of `values` the chart's `defaults` do not have."""
    if not isinstance(values, dict) or not isinstance(defaults, dict) or not defaults:
        return  # a leaf, a list, or a free-form map (default {} or null)
    for key, value in values.items():
        child = f"{path}.{key}" if path else key
        if key not in defaults:
            yield child
        else:
            yield from unknown_keys(value, defaults[key], child)


def settings_of(stack: str, **sections):
    raw = copy.deepcopy(stack_file_config(str(STACKS / f"Pulumi.{stack}.yaml")))
    for key, value in sections.items():
        raw[key] = {**(raw.get(key) or {}), **value}
    return load_settings(raw)


# Settings that reach every branch of the values functions.
VARIANTS = {
    "test-cluster": settings_of("test-cluster"),
    "dev": settings_of("dev"),
    "node-ipam": settings_of("test-cluster", ccm={"enabled": True, "nodeIpam": {"maskSizeIpv4": 24}}),
    "hubble-off": settings_of("test-cluster", hubble={"enabled": False}),
    "hubble-nodeport": settings_of("test-cluster", hubble={"enabled": True, "ui": True, "uiServiceType": "NodePort"}),
    "load-balancer": settings_of("test-cluster", cilium={"loadBalancerAddresses": ["10.255.200.60-10.255.200.69"]}),
    "kubespan": settings_of("test-cluster", cluster={"kubespan": {"enabled": True}}),
    "csi": settings_of("test-cluster", proxmox={"datastores": ["ceph-vm"]}, csi={
        "enabled": True, "storageClasses": [
            {"name": "a", "datastore": "local-lvm", "default": True, "ssd": True, "cache": "writeback"},
            {"name": "b", "datastore": "ceph-vm", "fsType": "xfs", "reclaimPolicy": "Retain"}]}),
    "csi-proxmox-ccm": settings_of("test-cluster", ccm={"controllers": ["node-csr-approval"]}, csi={
        "enabled": True, "topologyLabels": "proxmox-ccm", "storageClasses": [{"name": "a", "datastore": "local-lvm"}]}),
}
CSI_VARIANTS = ("csi", "csi-proxmox-ccm")


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_cilium_value_is_a_key_of_the_chart_and_passes_its_schema(variant):
    settings = VARIANTS[variant]
    version = settings.cilium.version
    values = cilium_values(settings)
    defaults = yaml.safe_load(chart_file("cilium", version, "values.yaml"))
    assert list(unknown_keys(values, defaults)) == []
    schema = json.loads(chart_file("cilium", version, "values.schema.json"))
    jsonschema.validate(values, schema)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_ccm_value_is_a_key_of_the_chart(variant):
    settings = VARIANTS[variant]
    values = ccm_values(settings)
    defaults = yaml.safe_load(chart_file("talos-cloud-controller-manager", settings.ccm.version, "values.yaml"))
    assert list(unknown_keys(values, defaults)) == []


def test_node_ipam_turns_on_the_daemonset_the_chart_template_reads():
    """The chart's template, not only its defaults: `daemonSet.enabled` is what makes it a host-network
    DaemonSet that tolerates not-ready nodes."""
    template = chart_file("talos-cloud-controller-manager", VARIANTS["node-ipam"].ccm.version,
                          "templates/deployment.yaml").decode()
    assert "{{- if .Values.daemonSet.enabled }}\nkind: DaemonSet" in template
    assert "useDaemonSet" not in template
    assert ccm_values(VARIANTS["node-ipam"])["daemonSet"] == {"enabled": True}


def test_the_walk_finds_a_key_the_chart_does_not_have():
    defaults = {"daemonSet": {"enabled": False}, "podAnnotations": {}, "extraArgs": []}
    assert list(unknown_keys({"useDaemonSet": True, "daemonSet": {"enabld": True}}, defaults)) == [
        "useDaemonSet", "daemonSet.enabld"]
    assert list(unknown_keys({"podAnnotations": {"any": "thing"}, "extraArgs": ["--x"]}, defaults)) == []


@pytest.mark.parametrize("variant", CSI_VARIANTS)
def test_every_csi_and_proxmox_ccm_value_is_a_key_of_its_chart(variant):
    settings = VARIANTS[variant]
    csi_defaults = yaml.safe_load(chart_file("proxmox-csi-plugin", settings.csi.version, "values.yaml"))
    assert list(unknown_keys(csi_values(settings), csi_defaults)) == []
    ccm_defaults = yaml.safe_load(chart_file("proxmox-cloud-controller-manager", settings.csi.proxmox_ccm_version,
                                             "values.yaml"))
    assert list(unknown_keys(proxmox_ccm_values(settings), ccm_defaults)) == []


def test_each_storage_class_key_is_one_the_chart_s_template_reads():
    """`storageClass` is a list (default examples only): its items' keys are checked against the template."""
    version = VARIANTS["csi"].csi.version
    template = (chart_file("proxmox-csi-plugin", version, "templates/storageclass.yaml")
                + chart_file("proxmox-csi-plugin", version, "templates/_storage.tpl")).decode()
    keys = {key for item in csi_values(VARIANTS["csi"])["storageClass"] for key in item}
    assert keys == {"name", "storage", "reclaimPolicy", "fstype", "cache", "ssd", "annotations"}
    for key in keys:
        assert f"$storage.{key}" in template or f".{key} " in template or f".{key} |" in template, key
