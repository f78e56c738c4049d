"""Helm values of the add-ons: the seed's cilium-values.yaml exactly, Hubble and CCM from settings, overrides."""

import copy

import pytest
import yaml

from talos_proxmox.cluster_plan.addon_values import (
    ccm_extra_args,
    ccm_values,
    cilium_load_balancer_manifests,
    cilium_mtu,
    cilium_values,
    hubble_ui_address,
    hubble_ui_exposure,
    hubble_ui_load_balancer_service,
    load_balancer_host,
)
from talos_proxmox.talos_config.merge import deep_merge
from talos_proxmox.settings.stack import load_settings, stack_file_config
from tests.paths import STACKS


# cilium-values.yaml of the seed walkthrough (talos-proxmox-cilium-walkthrough.ru.txt), verbatim.
SEED_CILIUM_VALUES = """\
ipam:
  mode: kubernetes

routingMode: tunnel
tunnelProtocol: vxlan
autoDirectNodeRoutes: false

kubeProxyReplacement: true
k8sServiceHost: localhost
k8sServicePort: 7445

bpf:
  masquerade: true

cgroup:
  autoMount:
    enabled: false
  hostRoot: /sys/fs/cgroup

securityContext:
  capabilities:
    ciliumAgent:
      - CHOWN
      - KILL
      - NET_ADMIN
      - NET_RAW
      - IPC_LOCK
      - SYS_ADMIN
      - SYS_RESOURCE
      - DAC_OVERRIDE
      - FOWNER
      - SETGID
      - SETUID
    cleanCiliumState:
      - NET_ADMIN
      - SYS_ADMIN
      - SYS_RESOURCE

hubble:
  enabled: true
  relay:
    enabled: true
  ui:
    enabled: true

MTU: 1370
"""

# talos-ccm.yaml of the CCM overview, with the test-cluster stack's replicas.
SEED_CCM_VALUES = """\
replicaCount: 2
enabledControllers:
  - cloud-node
  - node-csr-approval
"""


def raw_stack(name="test-cluster"):
    return copy.deepcopy(stack_file_config(str(STACKS / f"Pulumi.{name}.yaml")))


def settings_with(**sections):
    raw = raw_stack()
    for key, value in sections.items():
        raw[key] = {**(raw.get(key) or {}), **value}
    return load_settings(raw)


def seed_cilium_values() -> dict:
    """The seed's values plus the one deliberate change: legacy host routing, without which pods' DNS to
    outside names fails behind Talos's host DNS forwarding (cilium/cilium#36737, siderolabs/talos#10002)."""
    values = yaml.safe_load(SEED_CILIUM_VALUES)
    values["bpf"]["hostLegacyRouting"] = True
    return values


def seed_ccm_values() -> dict:
    """The seed's values plus replicas spread over control planes (one pod per node)."""
    return {**yaml.safe_load(SEED_CCM_VALUES), "affinity": {"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "talos-cloud-controller-manager",
                                              "app.kubernetes.io/instance": "talos-cloud-controller-manager"}},
            "topologyKey": "kubernetes.io/hostname"}]}}}


def test_seed_stack_gives_the_seed_cilium_values_with_pod_dns_fixed():
    values = cilium_values(load_settings(raw_stack()))
    assert values == seed_cilium_values()
    assert values["bpf"] == {"masquerade": True, "hostLegacyRouting": True}
    # Same key order as the seed file, so a rendered values file reads like it.
    assert list(values) == list(yaml.safe_load(SEED_CILIUM_VALUES))


def test_seed_stack_gives_the_seed_ccm_values_spread_over_control_planes():
    values = ccm_values(load_settings(raw_stack()))
    assert values == seed_ccm_values()
    assert "daemonSet" not in values


def test_replicas_on_every_control_plane_are_recreated_since_no_node_is_free_for_a_surge_pod():
    """The seed's 2 replicas on 3 control planes roll (a surge pod fits on the third); 3 on 3, or the dev
    stack's 1 on 1, would leave a rolling update's new pod Pending under the anti-affinity until Helm's
    timeout, so the old pods go first."""
    assert "updateStrategy" not in ccm_values(load_settings(raw_stack()))
    assert ccm_values(settings_with(ccm={"replicas": 3}))["updateStrategy"] == {"type": "Recreate"}
    single = stack_file_config(str(STACKS / "Pulumi.dev.yaml"))
    single["ccm"] = {"enabled": True}
    assert ccm_values(load_settings(single))["updateStrategy"] == {"type": "Recreate"}


def test_node_ipam_runs_the_ccm_as_a_host_network_daemonset_tolerating_not_ready_nodes():
    """The CCM allocates pod CIDRs; Cilium needs them; so the CCM must not need Cilium's pod network."""
    values = ccm_values(settings_with(ccm={"nodeIpam": {"maskSizeIpv4": 24}}))
    assert values["daemonSet"] == {"enabled": True}  # the chart adds hostNetwork and the not-ready toleration
    assert "tolerations" not in values  # the chart's own (control-plane, uninitialized) stay
    assert "affinity" not in values
    assert "--node-cidr-mask-size-ipv4=24" in values["extraArgs"]


def test_mtu_is_kubespan_mtu_minus_vxlan_and_absent_without_kubespan():
    s = settings_with(cluster={"kubespan": {"enabled": True, "mtu": 1500}})
    assert cilium_mtu(s) == 1450 and cilium_values(s)["MTU"] == 1450
    s = settings_with(cluster={"kubespan": {"enabled": False, "mtu": 1420}})
    assert cilium_mtu(s) is None and "MTU" not in cilium_values(s)


def test_hubble_off_changes_only_the_hubble_values():
    on = cilium_values(load_settings(raw_stack()))
    off = cilium_values(settings_with(hubble={"enabled": False}))
    # The chart turns Hubble on by default, so off has to be said.
    assert off["hubble"] == {"enabled": False}
    assert {k: v for k, v in on.items() if k != "hubble"} == {k: v for k, v in off.items() if k != "hubble"}
    assert hubble_ui_exposure(off) is None


def test_relay_and_ui_follow_settings():
    values = cilium_values(settings_with(hubble={"relay": True, "ui": False}))
    assert values["hubble"] == {"enabled": True, "relay": {"enabled": True}, "ui": {"enabled": False}}
    assert hubble_ui_exposure(values) is None


def test_cluster_ip_ui_exports_its_in_cluster_name():
    s = load_settings(raw_stack())
    values = cilium_values(s)
    assert "service" not in values["hubble"]["ui"]  # ClusterIP is the chart's own default
    exposure = hubble_ui_exposure(values)
    assert hubble_ui_address(s, exposure) == "http://hubble-ui.kube-system.svc.cluster.local:80"


def test_node_port_ui_sets_the_service_and_exports_a_node_address():
    s = settings_with(hubble={"uiServiceType": "NodePort"})
    values = cilium_values(s)
    assert values["hubble"]["ui"] == {"enabled": True, "service": {"type": "NodePort", "nodePort": 31235}}
    assert hubble_ui_address(s, hubble_ui_exposure(values)) == "http://10.255.200.201:31235"
    # A nodePort overridden in the stack's values is the one exported; a VIP is preferred over a node.
    raw = raw_stack("dev")
    raw["hubble"] = {"uiServiceType": "NodePort"}
    raw["cilium"] = {"values": {"hubble": {"ui": {"service": {"nodePort": 30080}}}}}
    dev = load_settings(raw)
    assert hubble_ui_address(dev, hubble_ui_exposure(cilium_values(dev))) == "http://10.10.0.50:30080"


def test_load_balancer_ui_is_our_service_on_the_pool_not_the_charts():
    s = settings_with(hubble={"uiServiceType": "LoadBalancer"}, cilium={"loadBalancerAddresses": ["10.255.200.240/29"]})
    values = cilium_values(s)
    assert values["hubble"]["ui"] == {"enabled": True}  # the chart's Service stays ClusterIP: no Helm wait on it
    assert values["l2announcements"] == {"enabled": True} and "externalIPs" not in values
    assert values["k8sClientRateLimit"] == {"qps": 20, "burst": 40}
    assert hubble_ui_load_balancer_service(s) == {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "hubble-ui-lb", "namespace": "kube-system"},
        "spec": {"type": "LoadBalancer", "selector": {"k8s-app": "hubble-ui"},
                 "ports": [{"name": "http", "port": 80, "targetPort": 8081}]}}
    assert cilium_load_balancer_manifests(s) == [
        {"apiVersion": "cilium.io/v2", "kind": "CiliumLoadBalancerIPPool", "metadata": {"name": "test-cluster"},
         "spec": {"blocks": [{"cidr": "10.255.200.240/29"}]}},
        {"apiVersion": "cilium.io/v2alpha1", "kind": "CiliumL2AnnouncementPolicy",
         "metadata": {"name": "test-cluster"}, "spec": {"loadBalancerIPs": True, "externalIPs": True}}]
    ranges = settings_with(cilium={"loadBalancerAddresses": ["10.255.200.240-10.255.200.250"]})
    assert cilium_load_balancer_manifests(ranges)[0]["spec"]["blocks"] == [
        {"start": "10.255.200.240", "stop": "10.255.200.250"}]
    assert hubble_ui_load_balancer_service(ranges) is None  # a pool alone: for the user's own Services
    assert "l2announcements" not in cilium_values(settings_with())
    assert cilium_load_balancer_manifests(settings_with()) == []


def test_load_balancer_ui_needs_the_assigned_address():
    s = settings_with(hubble={"uiServiceType": "LoadBalancer"}, cilium={"loadBalancerAddresses": ["10.255.200.240/29"]})
    exposure = hubble_ui_exposure(cilium_values(s), load_balancer=True)
    host = load_balancer_host({"loadBalancer": {"ingress": [{"hostname": ""}, {"ip": "10.255.200.240"}]}})
    assert hubble_ui_address(s, exposure, host) == "http://10.255.200.240:80"
    assert load_balancer_host({"loadBalancer": {}}) is None
    with pytest.raises(ValueError, match="hubble-ui Service of type LoadBalancer has no load balancer address"):
        hubble_ui_address(s, exposure, None)


def test_user_values_deep_merge_on_top():
    s = settings_with(cilium={"values": {
        "bpf": {"hostLegacyRouting": True},
        "securityContext": {"capabilities": {"cleanCiliumState": ["NET_ADMIN"]}},
        "k8sServicePort": 6443,
        "hubble": {"relay": {"replicas": 2}},
        "MTU": None,
    }})
    values = cilium_values(s)
    assert values["bpf"] == {"masquerade": True, "hostLegacyRouting": True}  # maps merge
    assert values["securityContext"]["capabilities"]["cleanCiliumState"] == ["NET_ADMIN"]  # lists replace
    assert values["securityContext"]["capabilities"]["ciliumAgent"][0] == "CHOWN"
    assert values["k8sServicePort"] == 6443
    assert values["hubble"]["relay"] == {"enabled": True, "replicas": 2}
    assert "MTU" not in values  # null removes, as with helm -f


@pytest.mark.parametrize("base, override, expected", [
    ({"a": {"b": 1, "c": 2}}, {"a": {"c": 3, "d": 4}}, {"a": {"b": 1, "c": 3, "d": 4}}),  # maps merge
    ({"a": [1, 2], "b": 1}, {"a": [3], "b": 2}, {"a": [3], "b": 2}),  # lists and scalars replace
    ({"a": 1}, {"a": {"b": 1}}, {"a": {"b": 1}}),  # a map replaces a scalar
    ({"a": {"b": 1}}, {"a": "x"}, {"a": "x"}),  # and a scalar a map
    ({"a": 1, "b": 2}, {"a": None, "c": None}, {"b": 2}),  # null removes; nothing to remove is no error
    ({}, {"a": {"b": {"c": None, "d": 1}, "e": None}}, {"a": {"b": {"d": 1}}}),  # a new map brings no nulls
])
def test_deep_merge_follows_helms_rules_for_user_values(base, override, expected):
    assert deep_merge(base, override) == expected


def test_deep_merge_shares_nothing_with_its_inputs():
    base = {"a": {"b": [1, 2]}, "c": 1}
    override = {"a": {"d": {"e": None, "f": [{"g": 1}]}}, "c": None, "h": [{"i": 1}]}
    merged = deep_merge(base, override)
    assert merged == {"a": {"b": [1, 2], "d": {"f": [{"g": 1}]}}, "h": [{"i": 1}]}
    merged["a"]["b"].append(3)
    merged["a"]["d"]["f"][0]["g"] = 2
    merged["h"][0]["i"] = 2
    assert base == {"a": {"b": [1, 2]}, "c": 1}
    assert override == {"a": {"d": {"e": None, "f": [{"g": 1}]}}, "c": None, "h": [{"i": 1}]}


def test_ccm_node_ipam_adds_the_controller_and_its_flags():
    s = settings_with(ccm={"nodeIpam": {"maskSizeIpv4": 25}})
    values = ccm_values(s)
    assert values["enabledControllers"] == ["cloud-node", "node-csr-approval", "node-ipam-controller"]
    assert values["extraArgs"] == [
        "--allocate-node-cidrs",
        "--cidr-allocator-type=CloudAllocator",
        "--node-cidr-mask-size-ipv4=25",
        "--node-cidr-mask-size-ipv6=80",
    ]
    ranged = settings_with(ccm={"nodeIpam": {"cidrAllocatorType": "RangeAllocator"}})
    assert ccm_extra_args(ranged)[1] == "--cidr-allocator-type=RangeAllocator"
    assert ccm_extra_args(ranged)[-1] == "--cluster-cidr=10.244.0.0/16"


def test_ccm_user_values_override():
    s = settings_with(ccm={"values": {"replicaCount": 3, "daemonSet": {"enabled": True}, "affinity": None}})
    assert ccm_values(s) == {"replicaCount": 3, "enabledControllers": ["cloud-node", "node-csr-approval"],
                             "daemonSet": {"enabled": True}}
