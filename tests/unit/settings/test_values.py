"""The value checkers of the stack settings, at their edges: what a value parses to, or the one line that refuses
it; and how `load_stack` orders and completes the lines of a whole stack (namespace typos, the secrets bundle)."""

from __future__ import annotations

import copy

import pytest

from talos_proxmox.settings.addons import address_block_range
from talos_proxmox.settings.model import SettingsError
from talos_proxmox.settings.stack import load_settings, stack_file_values
from talos_proxmox.settings.values import top_level_key
from talos_proxmox.settings.stack_config import StackConfig, load_stack, misspelled_namespaces
from talos_proxmox.talos_config import secrets_bundle
from tests.paths import REPO
from tests.program.mocked_program import stack_config, with_sections

# 253 characters, the longest DNS name: three 63-character labels and one of 61.
LONGEST_DNS_NAME = ".".join(["a" * 63] * 3 + ["b" * 61])
NAME_EXPECTED = "is not a DNS domain (expected lowercase labels of letters, digits and '-', e.g. cluster.local)"
LB_EXPECTED = ("is not a list of CIDRs or start-stop address ranges (expected e.g. [10.10.0.60/30] or "
               "[10.10.0.60-10.10.0.69])")
URL_EXPECTED = "is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)"


def dev(**sections) -> dict:
    return with_sections(stack_config("dev"), **sections)


ACCEPTED = [
    # (sections, what the settings hold, expected)
    ({"cluster": {"domain": "k8s.example.org"}}, lambda s: s.cluster.domain, "k8s.example.org"),
    ({"cluster": {"domain": LONGEST_DNS_NAME}}, lambda s: s.cluster.domain, LONGEST_DNS_NAME),
    ({"image": {"factoryUrl": "https://factory.lab.example/"}}, lambda s: s.image.factory_url,
     "https://factory.lab.example"),
    ({"image": {"factoryUrl": "http://10.0.0.5:8080/mirror-X//"}}, lambda s: s.image.factory_url,
     "http://10.0.0.5:8080/mirror-X"),
    ({"network": {"mtu": 65535}}, lambda s: (s.network.mtu, s.nodes[0].mtu), (65535, 65535)),
    ({"network": {"mtu": 68}}, lambda s: s.network.mtu, 68),
    ({"ccm": {"replicas": 1}}, lambda s: s.ccm.replicas, 1),
    ({"ccm": {"chart": "oci://registry.lab/charts/talos-cloud-controller-manager"}}, lambda s: s.ccm.chart,
     "oci://registry.lab/charts/talos-cloud-controller-manager"),
    ({"ccm": {"chart": "oci://r"}}, lambda s: s.ccm.chart, "oci://r"),  # the shortest: one character past oci://
    ({"cilium": {"values": {"kubeProxyReplacement": True}}}, lambda s: s.cilium.values, {"kubeProxyReplacement": True}),
    ({"cilium": {"loadBalancerAddresses": ["10.10.0.60-10.10.0.60", "10.10.0.64/30"]}},
     lambda s: s.cilium.load_balancer_addresses, ("10.10.0.60-10.10.0.60", "10.10.0.64/30")),
    # A node's own subnet: IPv6 has no broadcast address, and /31, /32, /127 and /128 no network address to spare.
    ({"nodes": {1: {"ip": "fd00:10::51/64", "gateway": "fd00:10::1"}}}, lambda s: (s.nodes[1].ip, s.nodes[1].prefix),
     ("fd00:10::51", 64)),
    ({"nodes": {1: {"ip": "fd00:10::ffff:ffff:ffff:ffff/64", "gateway": "fd00:10::1"}}},
     lambda s: s.nodes[1].ip, "fd00:10::ffff:ffff:ffff:ffff"),
    ({"nodes": {1: {"ip": "fd00:10::/127", "gateway": "fd00:10::1"}}}, lambda s: (s.nodes[1].ip, s.nodes[1].prefix),
     ("fd00:10::", 127)),
    ({"nodes": {1: {"ip": "10.20.0.0/31", "gateway": "10.20.0.1"}}}, lambda s: (s.nodes[1].ip, s.nodes[1].prefix),
     ("10.20.0.0", 31)),
]


def case_id(sections: dict) -> str:
    # Without backslashes: pytest run twice in one process (mutmut's forked runner) cannot select an id
    # whose escaped control character it wrote as `\\x01`.
    return repr(sections)[:70].replace("\\", "")


@pytest.mark.parametrize("sections, held, expected", ACCEPTED, ids=[case_id(s) for s, _, _ in ACCEPTED])
def test_a_value_at_the_edge_of_what_is_allowed_loads_as(sections, held, expected):
    assert held(load_settings(dev(**sections))) == expected


REFUSED = [
    ({"cluster": {"domain": LONGEST_DNS_NAME + "b"}},
     f"talos-proxmox:cluster.domain: '{LONGEST_DNS_NAME}b' {NAME_EXPECTED}"),
    ({"ccm": {"replicas": True}}, "talos-proxmox:ccm.replicas: True is not a replica count (positive integer)"),
    ({"ccm": {"replicas": 0}}, "talos-proxmox:ccm.replicas: 0 is not a replica count (positive integer)"),
    ({"ccm": {"chart": "oci://"}},
     "talos-proxmox:ccm.chart: 'oci://' is not an OCI chart reference (expected oci://...)"),
    ({"ccm": {"chart": "https://ghcr.io/siderolabs/charts"}},
     "talos-proxmox:ccm.chart: 'https://ghcr.io/siderolabs/charts' is not an OCI chart reference (expected oci://...)"),
    ({"network": {"mtu": 65536}}, "talos-proxmox:network.mtu: 65536 is not an MTU in 68-65535"),
    # A control character or DEL in a URL: every URL parser handles them differently.
    ({"image": {"factoryUrl": "https://factory.lab/\x01"}},
     f"talos-proxmox:image.factoryUrl: 'https://factory.lab/\\x01' {URL_EXPECTED}"),
    ({"image": {"factoryUrl": "https://factory.lab/\x7f"}},
     f"talos-proxmox:image.factoryUrl: 'https://factory.lab/\\x7f' {URL_EXPECTED}"),
    ({"image": {"factoryUrl": "ftp://factory.lab"}},
     f"talos-proxmox:image.factoryUrl: 'ftp://factory.lab' {URL_EXPECTED}"),
    ({"cilium": {"loadBalancerAddresses": ["10.10.0.61/30"]}},  # host bits set: which block was meant?
     f"talos-proxmox:cilium.loadBalancerAddresses: ['10.10.0.61/30'] {LB_EXPECTED}"),
    ({"cilium": {"loadBalancerAddresses": ["10.10.0.69-10.10.0.60"]}},
     f"talos-proxmox:cilium.loadBalancerAddresses: ['10.10.0.69-10.10.0.60'] {LB_EXPECTED}"),
    ({"cilium": {"values": ["kubeProxyReplacement"]}},
     "talos-proxmox:cilium.values: ['kubeProxyReplacement'] is not a mapping of Helm values"),
    ({"nodes": {1: {"ip": "fd00:10::/64", "gateway": "fd00:10::1"}}},
     "talos-proxmox:nodes[1].ip: 'fd00:10::/64' is the network or broadcast address of fd00:10::/64"),
    ({"nodes": {1: {"ip": "fd00:10::/126", "gateway": "fd00:10::1"}}},
     "talos-proxmox:nodes[1].ip: 'fd00:10::/126' is the network or broadcast address of fd00:10::/126"),
    ({"nodes": {1: {"ip": "10.20.0.3/30", "gateway": "10.20.0.1"}}},
     "talos-proxmox:nodes[1].ip: '10.20.0.3/30' is the network or broadcast address of 10.20.0.0/30"),
]


@pytest.mark.parametrize("sections, line", REFUSED, ids=[case_id(s) for s, _ in REFUSED])
def test_a_value_just_past_the_edge_is_one_line(sections, line):
    with pytest.raises(SettingsError) as err:
        load_settings(dev(**sections))
    assert err.value.problems == [line]


def test_the_error_lists_every_line_under_one_heading():
    with pytest.raises(SettingsError) as err:
        load_settings(dev(ccm={"replicas": 0}, network={"mtu": 1}))
    assert str(err.value) == (
        "invalid stack config:\n"
        "  - talos-proxmox:network.mtu: 1 is not an MTU in 68-65535\n"
        "  - talos-proxmox:ccm.replicas: 0 is not a replica count (positive integer)")


@pytest.mark.parametrize("path, key", [
    ("nodes[3].ip", "nodes"), ("cluster.patches[0]", "cluster"), ("cluster.kubespan.mtu", "cluster"),
    ("ccm", "ccm"),
])
def test_top_level_key_of_a_path(path, key):
    assert top_level_key(path) == key


@pytest.mark.parametrize("block, first, last", [
    ("10.10.0.60/30", "10.10.0.60", "10.10.0.63"),
    ("10.10.0.60-10.10.0.69", "10.10.0.60", "10.10.0.69"),
    ("10.10.0.60 - 10.10.0.60", "10.10.0.60", "10.10.0.60"),
    ("fd00::/126", "fd00::", "fd00::3"),
])
def test_address_block_range_is_the_first_and_last_address(block, first, last):
    assert tuple(map(str, address_block_range(block))) == (first, last)


@pytest.mark.parametrize("block", ["10.10.0.61/30", "10.10.0.60-10.10.0.61-10.10.0.62", "fd00:10::60%eth0-fd00:10::69",
                                   "fd00:10::60-fd00:10::69%eth0", "fd00:10::%eth0/64", "10.10.0.60-", "x"])
def test_address_block_range_refuses_what_is_no_pool_block(block):
    with pytest.raises(ValueError):
        address_block_range(block)


# ---------------------------------------------------------------- namespaces

def test_other_providers_namespaces_are_not_misspellings():
    """Near enough to one this program reads to look alike, but real packages' namespaces."""
    assert misspelled_namespaces(["pulumiservice:organization", "kubernetes-cert-manager:version", "talos:x",
                                  "random:seed"]) == []


def test_the_namespace_is_what_comes_before_the_first_colon():
    """Pulumi's legacy `<namespace>:config:<name>` keys: the namespace ends at the first colon."""
    assert misspelled_namespaces(["talos-proxmox:config:nodes", "talos-proxmx:config:nodes"]) == [
        "talos-proxmx:config:nodes: namespace 'talos-proxmx' is not one this program reads, so the key would be "
        "ignored (expected talos-proxmox:config:nodes)"]


# ---------------------------------------------------------------- load_stack: the whole stack

DEV = stack_file_values(str(REPO / "stacks" / "Pulumi.dev.yaml"))


def test_a_stack_file_that_cannot_be_read_is_one_line_with_the_systems_reason(tmp_path):
    with pytest.raises(SettingsError) as err:
        stack_file_values(str(tmp_path))  # a directory
    assert err.value.problems == [f"{tmp_path}: cannot be read (Is a directory)"]


def dev_stack(keys: dict) -> StackConfig:
    """The dev stack file's config with whole `<namespace>:<key>` keys set."""
    return StackConfig({**copy.deepcopy(DEV), **keys}, frozenset())


TYPO = ("talos-proxmx:ccm: namespace 'talos-proxmx' is not one this program reads, so the key would be ignored "
        "(expected talos-proxmox:ccm)")


def test_a_namespace_typo_and_a_bad_setting_are_both_reported():
    cluster = {**DEV["talos-proxmox:cluster"], "name": "Dev"}
    with pytest.raises(SettingsError) as err:
        load_stack(dev_stack({"talos-proxmx:ccm": {"enabled": True}, "talos-proxmox:cluster": cluster}), base_dir=REPO)
    assert err.value.problems == [
        TYPO, "talos-proxmox:cluster.name: 'Dev' is not a cluster name (expected lowercase letters, digits and '-', "
              "at most 63)"]


def test_the_secrets_bundle_is_read_only_once_every_key_is_right(tmp_path):
    cluster = {**DEV["talos-proxmox:cluster"], "secretsFile": "missing.yaml"}
    with pytest.raises(SettingsError) as err:
        load_stack(dev_stack({"talos-proxmx:ccm": {"enabled": True}, "talos-proxmox:cluster": cluster}),
                   base_dir=tmp_path)
    assert err.value.problems == [TYPO]


@pytest.fixture(scope="module")
def bundle() -> dict:
    return secrets_bundle.generate_secrets("v1.13.7")


def test_a_secrets_file_relative_to_the_project_is_loaded_as_its_full_path(tmp_path, bundle):
    (tmp_path / "bundle.yaml").write_text(secrets_bundle.dump_secrets(bundle))
    cluster = {**DEV["talos-proxmox:cluster"], "secretsFile": "bundle.yaml"}
    settings = load_stack(dev_stack({"talos-proxmox:cluster": cluster}), base_dir=tmp_path)
    assert settings.cluster.secrets_file == str(tmp_path / "bundle.yaml")
    assert settings.cluster.name == "dev" and [n.name for n in settings.nodes] == ["dev-cp-1", "dev-worker-1"]


def _broken_bundle(bundle: dict, *fields: str) -> str:
    broken = copy.deepcopy(bundle)
    for path in fields:
        section, key = path.split(".")
        broken[section][key] = "not-it"
    return secrets_bundle.dump_secrets(broken)


@pytest.mark.parametrize("text, problem", [
    (lambda b: "- a\n- b\n", "secrets bundle: expected a mapping at the top level, got list"),
    (lambda b: _broken_bundle(b, "cluster.id"), "cluster.id: expected base64 of 32 bytes"),
    (lambda b: _broken_bundle(b, "cluster.id", "trustdinfo.token"),
     "cluster.id: expected base64 of 32 bytes (and 1 more)"),
    (lambda b: _broken_bundle(b, "cluster.id", "cluster.secret", "trustdinfo.token"),
     "cluster.id: expected base64 of 32 bytes (and 2 more)"),
], ids=["not-a-mapping", "one-problem", "two-problems", "three-problems"])
def test_a_secrets_file_that_is_no_bundle_is_one_line_with_its_first_problem(tmp_path, bundle, text, problem):
    (tmp_path / "bundle.yaml").write_text(text(bundle))
    cluster = {**DEV["talos-proxmox:cluster"], "secretsFile": "bundle.yaml"}
    with pytest.raises(SettingsError) as err:
        load_stack(dev_stack({"talos-proxmox:cluster": cluster}), base_dir=tmp_path)
    assert err.value.problems == [
        f"talos-proxmox:cluster.secretsFile: 'bundle.yaml' is not a Talos secrets bundle: {problem}"]
