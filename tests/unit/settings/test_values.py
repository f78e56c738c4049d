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
    ({"image": {"factoryUrl": "http://10.0.0.5:8080/mirror-x//"}}, lambda s: s.image.factory_url,
     "http://10.0.0.5:8080/mirror-x"),
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


# ---------------------------------------------------------------- values a later layer parses again (issue 39)
# Each of these loaded before, and a later layer refused it: a traceback under `pulumi up` (or in load_stack's own
# machine-config preflight), or Talos, Proxmox or Kubernetes refusing half-way through the first up. `later`, where
# it is Python, is that layer refusing the value; the rest name the refusal (Talos's as `.tools/bin/talos-oracle-v1.NN
# validate` prints it).

FACTORY_EXPECTED = ("does not name a container registry the installer image can be pulled from (expected a host with "
                    "a '.' or a port, and a lowercase path, e.g. https://factory.talos.dev)")
ENDPOINT_EXPECTED = "is not an endpoint with scheme, host and port (expected e.g. https://10.0.0.10:6443)"
TALOS_VERSION_EXPECTED = "is not a supported Talos version (expected v1.12.x, v1.13.x or v1.14.x, e.g. v1.13.7)"
NOCLOUD_EXPECTED = "which the nocloud image's cloud-init drive cannot carry (expected {}, or image.platform: metal)"
HUBBLE_VALUES_EXPECTED = "is not a mapping (expected Helm values under it, as the Cilium chart has them)"


def _refused_by_the_image_layer():
    from talos_proxmox.image_factory.images import SchematicError, installer_image

    with pytest.raises(SchematicError):  # the installer tag and ISO path (config_preflight computes both)
        installer_image("https://factory.talos.dev", "0" * 64, "v1.13.7+build.1")


def _refused_by_the_machine_config():
    from talos_proxmox.cluster_plan.config_preflight import _placeholder_bundle
    from talos_proxmox.talos_config.machine_config import MachineConfigError, default_documents

    with pytest.raises(MachineConfigError):  # load_stack's preflight renders every node from these
        default_documents(_placeholder_bundle("v1.13.7"), "dev", "https://10.10.0.50:6443", "worker", "v1.13.7",
                          "1.35.0+k3s1")


def _refused_by_the_schematic_registration():
    import http.client

    from talos_proxmox.image_factory.images import register_schematic

    with pytest.raises(http.client.InvalidURL):  # not a FactoryError: a traceback from the Schematic resource
        register_schematic("https://factory.lab:abc", {"customization": {}}, timeout=1)


def _installer(factory_url: str) -> str:
    from talos_proxmox.image_factory.images import installer_image

    return installer_image(factory_url, "0" * 64, "v1.13.7").rsplit("/", 2)[0]


def _hubble_exposure_fails(values: dict, error: type):
    """Without the settings' check: the values reach addon_values, which the Cilium component calls under `pulumi up`."""
    import dataclasses

    from talos_proxmox.cluster_plan.addon_values import cilium_values, hubble_ui_address, hubble_ui_exposure

    def later():
        settings = load_settings(dev())
        settings = dataclasses.replace(settings, cilium=dataclasses.replace(settings.cilium, values=values))
        with pytest.raises(error):
            hubble_ui_address(settings, hubble_ui_exposure(cilium_values(settings)))
    return later


REFUSED_LATER = [
    # (sections, the line at load, the later layer refusing it, or None where that layer is not Python)
    ({"cluster": {"talosVersion": "v1.13.7+build.1"}},
     f"talos-proxmox:cluster.talosVersion: 'v1.13.7+build.1' {TALOS_VERSION_EXPECTED}", _refused_by_the_image_layer),
    ({"cluster": {"kubernetesVersion": "1.35.0+k3s1"}},
     "talos-proxmox:cluster.kubernetesVersion: '1.35.0+k3s1' is not a Kubernetes version (expected e.g. 1.35.0)",
     _refused_by_the_machine_config),
    # Talos: "invalid controlplane endpoint: port number must be between 1 and 65535".
    ({"cluster": {"endpoint": "https://10.10.0.50:0"}},
     f"talos-proxmox:cluster.endpoint: 'https://10.10.0.50:0' {ENDPOINT_EXPECTED}", None),
    # Talos (Go's url.Parse, decoding the config): 'invalid character "{" in host name'.
    ({"cluster": {"endpoint": "https://k8s{1}.lab:6443"}},
     f"talos-proxmox:cluster.endpoint: 'https://k8s{{1}}.lab:6443' {ENDPOINT_EXPECTED}", None),
    # Talos 1.14 selects the disk with the CEL `disk.dev_path == "<device>"`: "Syntax error: extraneous input".
    ({"cluster": {"talosVersion": "v1.14.1", "installDisk": '/dev/sd"a'}},
     "talos-proxmox:cluster.installDisk: '/dev/sd\"a' is not a device path (expected /dev/...)", None),
    ({"cluster": {"installDisk": "/dev/disk/by-label/talos disk"}},
     "talos-proxmox:cluster.installDisk: '/dev/disk/by-label/talos disk' is not a device path (expected /dev/...)", None),
    ({"cluster": {"talosVersion": "v1.14.1"}, "nodes": {1: {"dataDisk": {"size": 30, "device": '/dev/s"b'}}}},
     "talos-proxmox:nodes[1].dataDisk.device: '/dev/s\"b' is not a device path (expected /dev/...)", None),
    # kube-controller-manager (--cluster-cidr) and kube-apiserver (--service-cluster-ip-range) refuse to start.
    ({"cluster": {"podSubnets": ["10.244.0.0/16", "10.245.0.0/16"]}},
     "talos-proxmox:cluster.podSubnets: ['10.244.0.0/16', '10.245.0.0/16'] is not one subnet, or one IPv4 and one IPv6 "
     "subnet (kube-controller-manager takes at most one per IP family)", None),
    ({"cluster": {"serviceSubnets": ["10.96.0.0/12", "fd00:96::/112", "fd00:97::/112"]}},
     "talos-proxmox:cluster.serviceSubnets: ['10.96.0.0/12', 'fd00:96::/112', 'fd00:97::/112'] is not one subnet, or "
     "one IPv4 and one IPv6 subnet (kube-apiserver takes at most one per IP family)", None),
    # kube-apiserver 1.33: "specified --service-cluster-ip-range is too large; for 32-bit addresses, the mask must be >= 12".
    ({"cluster": {"kubernetesVersion": "1.33.4", "serviceSubnets": ["10.96.0.0/11"]}},
     "talos-proxmox:cluster.serviceSubnets: '10.96.0.0/11' is larger than kube-apiserver 1.33.4 allocates Service "
     "addresses from (expected a prefix of /12 or longer; Kubernetes 1.34 and later take any size)", None),
    ({"image": {"factoryUrl": "https://factory.lab:abc"}},
     f"talos-proxmox:image.factoryUrl: 'https://factory.lab:abc' {URL_EXPECTED}", _refused_by_the_schematic_registration),
    ({"image": {"factoryUrl": "https://factory.lab:0"}},
     f"talos-proxmox:image.factoryUrl: 'https://factory.lab:0' {URL_EXPECTED}", None),
    # containerd, pulling the installer: "repository name must be lowercase"; a host with no '.' or port is a
    # Docker Hub path (docker.io/factory/installer); '_' is no domain name.
    ({"image": {"factoryUrl": "http://10.0.0.5:8080/mirror-X"}},
     f"talos-proxmox:image.factoryUrl: 'http://10.0.0.5:8080/mirror-X' {FACTORY_EXPECTED}",
     lambda: _installer("http://10.0.0.5:8080/mirror-X") == "10.0.0.5:8080/mirror-X"),
    ({"image": {"factoryUrl": "https://factory"}}, f"talos-proxmox:image.factoryUrl: 'https://factory' {FACTORY_EXPECTED}",
     lambda: _installer("https://factory") == "factory"),
    ({"image": {"factoryUrl": "https://image_factory.lab"}},
     f"talos-proxmox:image.factoryUrl: 'https://image_factory.lab' {FACTORY_EXPECTED}", None),
    # Proxmox: `ipconfig0: ip=` takes IPv4 only; the provider's DNS servers are Go's net.ParseIP, which has no zones.
    ({"image": {"platform": "nocloud"}, "cluster": {"vip": None},
      "nodes": {1: {"ip": "fd00:10::52/64", "gateway": "fd00:10::1"}}},
     "talos-proxmox:nodes[1].ip: 'fd00:10::52/64' is an IPv6 address, " + NOCLOUD_EXPECTED.format("an IPv4 address"),
     None),
    ({"image": {"platform": "nocloud"}, "network": {"nameservers": ["fe80::1%eth0"]}},
     "talos-proxmox:network.nameservers: ['fe80::1%eth0'] holds an address with a zone, "
     + NOCLOUD_EXPECTED.format("addresses without %<zone>"), None),
    ({"image": {"platform": "nocloud"}, "nodes": {1: {"nameservers": ["fe80::1%eth0"]}}},
     "talos-proxmox:nodes[1].nameservers: ['fe80::1%eth0'] holds an address with a zone, "
     + NOCLOUD_EXPECTED.format("addresses without %<zone>"), None),
    # What the Cilium component reads back of the values to export the Hubble UI's address.
    ({"cilium": {"values": {"hubble": True}}}, f"talos-proxmox:cilium.values.hubble: True {HUBBLE_VALUES_EXPECTED}",
     _hubble_exposure_fails({"hubble": True}, AttributeError)),
    ({"cilium": {"values": {"hubble": {"ui": {"service": "NodePort"}}}}},
     f"talos-proxmox:cilium.values.hubble.ui.service: 'NodePort' {HUBBLE_VALUES_EXPECTED}",
     _hubble_exposure_fails({"hubble": {"ui": {"service": "NodePort"}}}, AttributeError)),
    ({"cilium": {"values": {"hubble": {"ui": {"service": {"type": "LoadBalancer"}}}}}},
     "talos-proxmox:cilium.values.hubble.ui.service.type: 'LoadBalancer' is not a Service type the program can give "
     "the Hubble UI's address for (expected ClusterIP or NodePort; for LoadBalancer set hubble.uiServiceType)",
     _hubble_exposure_fails({"hubble": {"ui": {"service": {"type": "LoadBalancer"}}}}, ValueError)),
    ({"cilium": {"values": {"hubble": {"ui": {"service": {"type": "NodePort", "nodePort": "http"}}}}}},
     "talos-proxmox:cilium.values.hubble.ui.service.nodePort: 'http' is not a port (expected an integer in 1-65535)",
     _hubble_exposure_fails({"hubble": {"ui": {"service": {"type": "NodePort", "nodePort": "http"}}}}, ValueError)),
]


@pytest.mark.parametrize("sections, line, later", REFUSED_LATER, ids=[case_id(s) for s, _, _ in REFUSED_LATER])
def test_a_value_a_later_layer_would_refuse_is_refused_at_load(sections, line, later):
    with pytest.raises(SettingsError) as err:
        load_settings(dev(**sections))
    assert err.value.problems == [line]
    if later is not None:
        assert later() in (None, True)


ACCEPTED_LATER = [
    # (sections, what the settings hold, expected): the edges the checks above leave open
    ({"cluster": {"endpoint": "https://K8s-API.lab.example:443"}}, lambda s: s.cluster.endpoint,
     "https://K8s-API.lab.example:443"),
    ({"cluster": {"endpoint": "https://[fd00:10::50]:65535"}}, lambda s: s.cluster.endpoint, "https://[fd00:10::50]:65535"),
    ({"cluster": {"talosVersion": "1.14.0-beta.1"}}, lambda s: s.cluster.talos_version, "v1.14.0-beta.1"),
    ({"cluster": {"kubernetesVersion": "v1.35.0-rc.1"}}, lambda s: s.cluster.kubernetes_version, "1.35.0-rc.1"),
    ({"cluster": {"talosVersion": "v1.14.1",
                  "installDisk": "/dev/disk/by-path/pci-0000:00:05.0-scsi-0:0:0:0"}},
     lambda s: s.cluster.install_disk, "/dev/disk/by-path/pci-0000:00:05.0-scsi-0:0:0:0"),
    ({"cluster": {"podSubnets": ["10.244.0.0/16", "fd00:10:244::/56"],
                  "serviceSubnets": ["fd00:10:96::/112", "10.96.0.0/12"]}},
     lambda s: (s.cluster.pod_subnets, s.cluster.service_subnets),
     (("10.244.0.0/16", "fd00:10:244::/56"), ("fd00:10:96::/112", "10.96.0.0/12"))),
    ({"cluster": {"kubernetesVersion": "1.33.4", "serviceSubnets": ["10.96.0.0/12"]}},
     lambda s: s.cluster.service_subnets, ("10.96.0.0/12",)),
    ({"cluster": {"kubernetesVersion": "1.34.0", "serviceSubnets": ["10.64.0.0/10"]}},
     lambda s: s.cluster.service_subnets, ("10.64.0.0/10",)),
    ({"image": {"factoryUrl": "http://factory:8080/mirror/v-1"}}, lambda s: s.image.factory_url,
     "http://factory:8080/mirror/v-1"),
    ({"image": {"factoryUrl": "http://localhost"}}, lambda s: s.image.factory_url, "http://localhost"),
    ({"image": {"factoryUrl": "https://[fd00::5]:8443"}}, lambda s: s.image.factory_url, "https://[fd00::5]:8443"),
    ({"image": {"platform": "nocloud"}, "network": {"nameservers": ["1.1.1.1", "2606:4700:4700::1111"]}},
     lambda s: s.nodes[0].nameservers, ("1.1.1.1", "2606:4700:4700::1111")),
    ({"network": {"nameservers": ["fe80::1%net0"]}}, lambda s: s.network.nameservers, ("fe80::1%net0",)),  # metal
    ({"cilium": {"values": {"hubble": {"ui": {"service": {"type": "NodePort", "nodePort": 30080}}}}}},
     lambda s: s.cilium.values["hubble"]["ui"]["service"]["nodePort"], 30080),
    ({"cilium": {"enabled": False, "values": {"hubble": True}}}, lambda s: s.cilium.values, {"hubble": True}),
]


@pytest.mark.parametrize("sections, held, expected", ACCEPTED_LATER, ids=[case_id(s) for s, _, _ in ACCEPTED_LATER])
def test_a_value_every_later_layer_takes_loads_as(sections, held, expected):
    assert held(load_settings(dev(**sections))) == expected


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
