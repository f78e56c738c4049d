"""Helm values of the cluster add-ons (Cilium with Hubble, Talos CCM), derived from the stack settings.

Cilium's values are the seed walkthrough's cilium-values.yaml; the Talos CCM's follow the chart's
values.yaml (siderolabs/talos-cloud-controller-manager charts/). The stack's `values` are merged on
top with Helm's rules, so a user override always has the last word. No Pulumi import here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from talos_proxmox.talos_config.merge import deep_merge
from talos_proxmox.settings.stack import HubbleSettings, Settings

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


def cilium_mtu(settings: Settings) -> Optional[int]:
    """Pod MTU inside the VXLAN tunnel over KubeSpan; None lets Cilium detect it when KubeSpan is off."""
    kubespan = settings.cluster.kubespan
    return kubespan.mtu - VXLAN_OVERHEAD if kubespan.enabled else None


def hubble_values(hubble: HubbleSettings) -> dict[str, Any]:
    """The `hubble` section. Off is written out, since the chart enables Hubble by default."""
    if not hubble.enabled:
        return {"enabled": False}
    ui: dict[str, Any] = {"enabled": hubble.ui}
    if hubble.ui and hubble.ui_service_type != "ClusterIP":
        service: dict[str, Any] = {"type": hubble.ui_service_type}
        if hubble.ui_service_type == "NodePort":
            service["nodePort"] = HUBBLE_UI_NODE_PORT
        ui["service"] = service
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
        "bpf": {"masquerade": True},
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
    return deep_merge(values, settings.cilium.values)


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


def ccm_values(settings: Settings) -> dict[str, Any]:
    """Values of the Talos CCM release: replicas, enabled controllers, node IPAM flags, then `ccm.values`."""
    ccm = settings.ccm
    values: dict[str, Any] = {"replicaCount": ccm.replicas, "enabledControllers": list(ccm.controllers)}
    extra_args = ccm_extra_args(settings)
    if extra_args:
        values["extraArgs"] = extra_args
    return deep_merge(values, ccm.values)


@dataclass(frozen=True)
class HubbleUiExposure:
    """How the hubble-ui Service is reachable: its type and the port to dial (nodePort for NodePort)."""
    service_type: str
    port: int


def hubble_ui_exposure(values: Mapping[str, Any]) -> Optional[HubbleUiExposure]:
    """Read from the final Cilium values, so user overrides of the Service are honoured; None: no UI."""
    hubble = values.get("hubble") or {}
    ui = hubble.get("ui") or {}
    if not hubble.get("enabled", True) or not ui.get("enabled", False):
        return None
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
