"""Helm values of the cluster add-ons (Cilium with Hubble, Talos CCM), derived from the stack settings.

Cilium's values are the seed walkthrough's cilium-values.yaml; the Talos CCM's follow the chart's
values.yaml (siderolabs/talos-cloud-controller-manager charts/). The stack's `values` are merged on
top with Helm's rules, so a user override always has the last word. No Pulumi import here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from talos_proxmox.cluster_plan.storage_values import ccm_topology_values
from talos_proxmox.talos_config.merge import deep_merge
from talos_proxmox.settings.model import HubbleSettings, Settings

NAMESPACE = "kube-system"
CILIUM_RELEASE = "cilium"
CILIUM_CHART = "cilium"
CCM_RELEASE = "talos-cloud-controller-manager"

# KubePrism: Talos serves the API server on localhost:7445 on every node, so Cilium's kube-proxy
# replacement reaches it before any Service works.
KUBEPRISM_HOST = "localhost"
KUBEPRISM_PORT = 7445
VXLAN_OVERHEAD = 50  # bytes of VXLAN encapsulation inside the KubeSpan (WireGuard) MTU

# Talos forbids SYS_MODULE in pods; these are Cilium's agent capabilities without it.
CILIUM_AGENT_CAPABILITIES = ("CHOWN", "KILL", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "SYS_ADMIN", "SYS_RESOURCE",
                             "DAC_OVERRIDE", "FOWNER", "SETGID", "SETUID")
CLEAN_CILIUM_STATE_CAPABILITIES = ("NET_ADMIN", "SYS_ADMIN", "SYS_RESOURCE")

# The cilium chart's hubble-ui Service: name, port 80, `hubble.ui.service.{type,nodePort}`.
HUBBLE_UI_SERVICE = "hubble-ui"
HUBBLE_UI_PORT = 80
HUBBLE_UI_NODE_PORT = 31235  # the chart's default nodePort, pinned so the exported address is known


def release_sha256(chart: str, version: str, values: Mapping[str, Any], repository: Optional[str] = None) -> str:
    """A fingerprint of what a Helm release installs: it changes exactly when an upgrade would run."""
    document = {"chart": chart, "version": version, "values": values, "repository": repository}
    return hashlib.sha256(json.dumps(document, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def cilium_mtu(settings: Settings) -> Optional[int]:
    """Pod MTU inside the VXLAN tunnel over KubeSpan; None lets Cilium detect it when KubeSpan is off."""
    kubespan = settings.cluster.kubespan
    return kubespan.mtu - VXLAN_OVERHEAD if kubespan.enabled else None


def hubble_values(hubble: HubbleSettings) -> dict[str, Any]:
    """The `hubble` section. Off is written out, since the chart enables Hubble by default."""
    if not hubble.enabled:
        return {"enabled": False}
    ui: dict[str, Any] = {"enabled": hubble.ui}
    # LoadBalancer is a Service of our own (hubble_ui_load_balancer_service), not the chart's: Helm would
    # hold the Cilium release until it had an address, which only the pool made after Cilium gives.
    if hubble.ui and hubble.ui_service_type == "NodePort":
        ui["service"] = {"type": "NodePort", "nodePort": HUBBLE_UI_NODE_PORT}
    return {"enabled": True, "relay": {"enabled": hubble.relay}, "ui": ui}


def cilium_values(settings: Settings) -> dict[str, Any]:
    """Values of the Cilium release: the seed's, Hubble from settings, then `cilium.values` on top."""
    values: dict[str, Any] = {
        "ipam": {"mode": "kubernetes"},
        "routingMode": "tunnel",
        "tunnelProtocol": "vxlan",
        "autoDirectNodeRoutes": False,
        "kubeProxyReplacement": True,
        "k8sServiceHost": KUBEPRISM_HOST,
        "k8sServicePort": KUBEPRISM_PORT,
        # Talos forwards pods' DNS to its host resolver (hostDNS.forwardKubeDNSToHost); with eBPF host
        # routing and masquerading those replies never reach the pod (cilium/cilium#36737). Legacy host
        # routing, as Cilium's Talos install page sets it, keeps pod DNS to outside names working.
        "bpf": {"masquerade": True, "hostLegacyRouting": True},
        # Talos mounts the cgroup2 filesystem itself.
        "cgroup": {"autoMount": {"enabled": False}, "hostRoot": "/sys/fs/cgroup"},
        "securityContext": {"capabilities": {
            "ciliumAgent": list(CILIUM_AGENT_CAPABILITIES),
            "cleanCiliumState": list(CLEAN_CILIUM_STATE_CAPABILITIES),
        }},
        "hubble": hubble_values(settings.hubble),
    }
    mtu = cilium_mtu(settings)
    if mtu is not None:
        values["MTU"] = mtu
    if settings.cilium.load_balancer_addresses:
        # LoadBalancer Services get addresses from the pool below, answered for by ARP from one node each;
        # the leases that elect that node are API calls, hence the higher client rate limit. (External IPs
        # need no value: chart 1.19 has no `externalIPs` key; kube-proxy replacement serves them.)
        values["l2announcements"] = {"enabled": True}
        values["k8sClientRateLimit"] = {"qps": 20, "burst": 40}
    return deep_merge(values, settings.cilium.values)


LOAD_BALANCER_POOL_API = "cilium.io/v2"
L2_POLICY_API = "cilium.io/v2alpha1"


def cilium_load_balancer_manifests(settings: Settings) -> list[dict[str, Any]]:
    """Cilium's LB-IPAM pool of the stack's addresses and the L2 policy that announces them; [] without."""
    blocks = settings.cilium.load_balancer_addresses
    if not blocks:
        return []
    name = settings.cluster.name
    return [
        {"apiVersion": LOAD_BALANCER_POOL_API, "kind": "CiliumLoadBalancerIPPool", "metadata": {"name": name},
         "spec": {"blocks": [_pool_block(b) for b in blocks]}},
        {"apiVersion": L2_POLICY_API, "kind": "CiliumL2AnnouncementPolicy", "metadata": {"name": name},
         "spec": {"loadBalancerIPs": True, "externalIPs": True}},
    ]


# The chart's hubble-ui pods and their HTTP port (templates/hubble-ui/deployment.yaml).
HUBBLE_UI_SELECTOR = {"k8s-app": "hubble-ui"}
HUBBLE_UI_TARGET_PORT = 8081
HUBBLE_UI_LOAD_BALANCER_SERVICE = "hubble-ui-lb"


def hubble_ui_load_balancer_service(settings: Settings) -> Optional[dict[str, Any]]:
    """The LoadBalancer Service in front of the Hubble UI, or None when the UI is not served that way."""
    hubble = settings.hubble
    if not (settings.cilium.enabled and hubble.enabled and hubble.ui and hubble.ui_service_type == "LoadBalancer"):
        return None
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": HUBBLE_UI_LOAD_BALANCER_SERVICE, "namespace": NAMESPACE},
        "spec": {"type": "LoadBalancer", "selector": dict(HUBBLE_UI_SELECTOR),
                 "ports": [{"name": "http", "port": HUBBLE_UI_PORT, "targetPort": HUBBLE_UI_TARGET_PORT}]},
    }


def _pool_block(block: str) -> dict[str, str]:
    if "-" in block:
        start, stop = (part.strip() for part in block.split("-", 1))
        return {"start": start, "stop": stop}
    return {"cidr": block}


def ccm_extra_args(settings: Settings) -> list[str]:
    """Command-line flags for the CCM's node-ipam-controller, when `ccm.nodeIpam` is set."""
    ipam = settings.ccm.node_ipam
    if ipam is None:
        return []
    args = [
        "--allocate-node-cidrs",
        f"--cidr-allocator-type={ipam.cidr_allocator_type}",
        f"--node-cidr-mask-size-ipv4={ipam.mask_size_ipv4}",
        f"--node-cidr-mask-size-ipv6={ipam.mask_size_ipv6}",
    ]
    if ipam.cidr_allocator_type == "RangeAllocator":
        # Only CloudAllocator takes ranges from Talos metadata; RangeAllocator carves the pod subnets.
        args.append(f"--cluster-cidr={','.join(settings.cluster.pod_subnets)}")
    return args


# The chart's selector labels (templates/_helpers.tpl), for spreading its pods.
CCM_CHART = "talos-cloud-controller-manager"
CCM_SELECTOR = {"app.kubernetes.io/name": CCM_CHART, "app.kubernetes.io/instance": CCM_RELEASE}


def ccm_values(settings: Settings) -> dict[str, Any]:
    """Values of the Talos CCM release: replicas, enabled controllers, node IPAM flags, the nodes' topology
    transformations (with the Proxmox CSI plugin), then `ccm.values`.

    With node IPAM the CCM is the only pod-CIDR allocator, so it cannot wait for the pod network (which
    waits for pod CIDRs): it runs as the chart's DaemonSet (`daemonSet.enabled`), on the control planes'
    host network, tolerating not-ready nodes (the chart adds that toleration in this mode). Otherwise
    it is a Deployment whose replicas go to different control planes, so one node's loss keeps one,
    replaced by Recreate when its replicas take every control plane.
    """
    ccm = settings.ccm
    values: dict[str, Any] = {"replicaCount": ccm.replicas, "enabledControllers": list(ccm.controllers)}
    extra_args = ccm_extra_args(settings)
    if extra_args:
        values["extraArgs"] = extra_args
    if ccm.node_ipam is not None:
        values["daemonSet"] = {"enabled": True}
    else:
        values["affinity"] = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": dict(CCM_SELECTOR)}, "topologyKey": "kubernetes.io/hostname"}]}}
        if ccm.replicas >= len(settings.control_planes):
            # A rolling update surges a new pod before an old one goes, and no control plane is free of a
            # CCM pod for it: every values change would hang until Helm rolled it back. The chart writes
            # only the strategy's type, so the old pods go first (the CCM is away for a pod's start).
            values["updateStrategy"] = {"type": "Recreate"}
    values.update(ccm_topology_values(settings))  # the nodes' region and zone, for the Proxmox CSI plugin
    return deep_merge(values, ccm.values)


@dataclass(frozen=True)
class HubbleUiExposure:
    """How the hubble-ui Service is reachable: its type and the port to dial (nodePort for NodePort)."""
    service_type: str
    port: int


def hubble_ui_exposure(values: Mapping[str, Any], load_balancer: bool = False) -> Optional[HubbleUiExposure]:
    """Read from the final Cilium values, so user overrides of the Service are honoured; None: no UI.
    `load_balancer`: the UI is served by our LoadBalancer Service (hubble_ui_load_balancer_service)."""
    hubble = values.get("hubble") or {}
    ui = hubble.get("ui") or {}
    if not hubble.get("enabled", True) or not ui.get("enabled", False):
        return None
    if load_balancer:
        return HubbleUiExposure("LoadBalancer", HUBBLE_UI_PORT)
    service = ui.get("service") or {}
    service_type = service.get("type") or "ClusterIP"
    if service_type == "NodePort":
        return HubbleUiExposure(service_type, int(service.get("nodePort") or HUBBLE_UI_NODE_PORT))
    return HubbleUiExposure(service_type, HUBBLE_UI_PORT)


def hubble_ui_address(settings: Settings, exposure: HubbleUiExposure, load_balancer_host: Optional[str] = None) -> str:
    """The UI's URL: in-cluster DNS name (ClusterIP), a node's address (NodePort) or the load balancer's."""
    if exposure.service_type == "ClusterIP":
        host = f"{HUBBLE_UI_SERVICE}.{NAMESPACE}.svc.{settings.cluster.domain}"
    elif exposure.service_type == "NodePort":
        # Cilium serves NodePorts on every node; the VIP (if any) follows a healthy control plane.
        host = settings.cluster.vip or settings.bootstrap_node.ip
    else:
        if not load_balancer_host:
            raise ValueError(f"hubble-ui Service of type {exposure.service_type} has no load balancer address")
        host = load_balancer_host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{exposure.port}"


def load_balancer_host(status: Any) -> Optional[str]:
    """First ingress IP or hostname of a Service's status (pulumi_kubernetes ServiceStatus or a dict)."""
    lb = _field(status, "load_balancer", "loadBalancer")
    for ingress in _field(lb, "ingress", "ingress") or ():
        host = _field(ingress, "ip", "ip") or _field(ingress, "hostname", "hostname")
        if host:
            return host
    return None


def _field(obj: Any, attr: str, key: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(key, obj.get(attr))
    return getattr(obj, attr, None)
