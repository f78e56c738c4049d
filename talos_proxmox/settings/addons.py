"""The `cilium`, `hubble` and `ccm` sections, and their checks against the rest of the stack. No Pulumi here."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Mapping

from talos_proxmox.settings.image import _http_base_url
from talos_proxmox.settings.model import (
    CcmSettings,
    CiliumSettings,
    DEFAULT_CCM_CHART_VERSION,
    DEFAULT_CCM_CONTROLLERS,
    DEFAULT_CILIUM_VERSION,
    DEFAULT_RELEASE_TIMEOUT_SECONDS,
    HubbleSettings,
    KNOWN_CCM_CONTROLLERS,
    NodeIpam,
    NodeSettings,
    TIMEOUT_RANGE,
)
from talos_proxmox.settings.nodes import _is_network_or_broadcast
from talos_proxmox.settings.values import (
    _Reader,
    _TIMEOUT_EXPECTED,
    _bool,
    _int_in,
    _list_of,
    _mapping,
    _one_of,
    _positive_int,
    _string_list,
    _url_text,
    _version,
)


def _read_cilium(r: _Reader, raw: Any) -> CiliumSettings:
    s = r.section(raw, "cilium", ("enabled", "version", "repository", "caFile", "values", "loadBalancerAddresses",
                                  "timeoutSeconds"))
    return CiliumSettings(
        enabled=r.value(s, "enabled", "cilium.enabled", _bool, "is not true or false", default=True),
        version=r.value(s, "version", "cilium.version", _version, "is not a chart version (expected e.g. 1.19.6)",
                        default=DEFAULT_CILIUM_VERSION),
        repository=r.value(s, "repository", "cilium.repository", _http_base_url, "is not an http(s) chart repository URL with no query or fragment",
                           default="https://helm.cilium.io"),
        ca_file=r.value(s, "caFile", "cilium.caFile", _ca_file, CA_FILE_EXPECTED, default=None),
        values=r.value(s, "values", "cilium.values", _mapping, "is not a mapping of Helm values", default={}),
        load_balancer_addresses=r.value(s, "loadBalancerAddresses", "cilium.loadBalancerAddresses",
                                        _list_of(_address_block), "is not a list of CIDRs or start-stop address "
                                        "ranges (expected e.g. [10.10.0.60/30] or [10.10.0.60-10.10.0.69])",
                                        default=()),
        timeout_seconds=_release_timeout(r, s, "cilium"),
    )


def _release_timeout(r: _Reader, s: Mapping[str, Any], section: str) -> int:
    return r.value(s, "timeoutSeconds", f"{section}.timeoutSeconds", _int_in(*TIMEOUT_RANGE), _TIMEOUT_EXPECTED,
                   default=DEFAULT_RELEASE_TIMEOUT_SECONDS)


def address_block_range(block: str) -> tuple[Any, Any]:
    """First and last address of a CIDR (10.10.0.60/30) or a range (10.10.0.60-10.10.0.69); ValueError for
    anything else: a CIDR with host bits set (ip_network is strict by default), or an IPv6 zone id
    (fd00::1%eth0), which no pool address has."""
    if "%" in block:
        raise ValueError
    if "-" in block:
        start, stop = (ipaddress.ip_address(part.strip()) for part in block.split("-"))
        return start, stop
    net = ipaddress.ip_network(block)
    return net.network_address, net.broadcast_address


def _address_block(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError
    start, stop = address_block_range(v)
    if start.version != stop.version or start > stop:
        raise ValueError
    return v


def _read_hubble(r: _Reader, raw: Any) -> HubbleSettings:
    s = r.section(raw, "hubble", ("enabled", "relay", "ui", "uiServiceType"))
    return HubbleSettings(
        enabled=r.value(s, "enabled", "hubble.enabled", _bool, "is not true or false", default=True),
        relay=r.value(s, "relay", "hubble.relay", _bool, "is not true or false", default=True),
        ui=r.value(s, "ui", "hubble.ui", _bool, "is not true or false", default=True),
        ui_service_type=r.value(s, "uiServiceType", "hubble.uiServiceType",
                                _one_of("ClusterIP", "NodePort", "LoadBalancer"),
                                "is not a Service type (expected ClusterIP, NodePort or LoadBalancer)",
                                default="ClusterIP"),
    )


def _read_ccm(r: _Reader, raw: Any) -> CcmSettings:
    s = r.section(raw, "ccm", ("enabled", "chart", "version", "replicas", "controllers", "nodeIpam", "values",
                               "timeoutSeconds"))
    controllers = r.value(s, "controllers", "ccm.controllers", _controllers,
                          f"is not a list of CCM controllers (expected some of: {', '.join(KNOWN_CCM_CONTROLLERS)})",
                          default=DEFAULT_CCM_CONTROLLERS)
    node_ipam = None
    if s.get("nodeIpam") is not None:
        ni = r.section(s["nodeIpam"], "ccm.nodeIpam", ("cidrAllocatorType", "maskSizeIpv4", "maskSizeIpv6"))
        node_ipam = NodeIpam(
            cidr_allocator_type=r.value(ni, "cidrAllocatorType", "ccm.nodeIpam.cidrAllocatorType",
                                        _one_of("CloudAllocator", "RangeAllocator"),
                                        "is not an allocator (expected CloudAllocator or RangeAllocator)",
                                        default="CloudAllocator"),
            mask_size_ipv4=r.value(ni, "maskSizeIpv4", "ccm.nodeIpam.maskSizeIpv4", _int_in(1, 32),
                                   "is not a prefix length in 1-32", default=24),
            mask_size_ipv6=r.value(ni, "maskSizeIpv6", "ccm.nodeIpam.maskSizeIpv6", _int_in(1, 128),
                                   "is not a prefix length in 1-128", default=80),
        )
        if controllers is not None and "node-ipam-controller" not in controllers:
            controllers = (*controllers, "node-ipam-controller")
    return CcmSettings(
        enabled=r.value(s, "enabled", "ccm.enabled", _bool, "is not true or false", default=True),
        chart=r.value(s, "chart", "ccm.chart", _oci_ref, "is not an OCI chart reference (expected oci://...)",
                      default="oci://ghcr.io/siderolabs/charts/talos-cloud-controller-manager"),
        version=r.value(s, "version", "ccm.version", _version, "is not a chart version (expected e.g. 0.5.4)",
                        default=DEFAULT_CCM_CHART_VERSION),
        replicas=r.value(s, "replicas", "ccm.replicas", _positive_int, "is not a replica count (positive integer)",
                         default=1),
        controllers=controllers,
        node_ipam=node_ipam,
        values=r.value(s, "values", "ccm.values", _mapping, "is not a mapping of Helm values", default={}),
        timeout_seconds=_release_timeout(r, s, "ccm"),
    )


def _controllers(v: Any) -> tuple[str, ...]:
    names = _string_list(v)
    if not names or any(n not in KNOWN_CCM_CONTROLLERS for n in names):
        raise ValueError
    return names


CA_FILE_EXPECTED = "is not a readable PEM file of CA certificates (expected an absolute path)"


def _ca_file(v: Any) -> str:
    """An absolute path to PEM certificates, each parsable: Helm (in the Kubernetes provider plugin, which
    runs with its own working directory) reads it at every preview, and a bad one fails there, mid-up."""
    from cryptography import x509

    if not isinstance(v, str) or not v.startswith("/"):
        raise ValueError
    try:
        with open(v, "rb") as f:
            data = f.read()
    except OSError:  # missing, unreadable or a directory
        raise ValueError from None
    blocks = re.findall(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", data, re.S)
    if not blocks:
        raise ValueError
    for block in blocks:
        x509.load_pem_x509_certificate(block)
    return v


def _oci_ref(v: Any) -> str:
    if not _url_text(v).startswith("oci://") or len(v) <= 6:
        raise ValueError
    return v


def _check_load_balancer(r: _Reader, cluster: dict, nodes: list[NodeSettings], cilium: CiliumSettings,
                         hubble: HubbleSettings) -> None:
    """A LoadBalancer Service needs addresses: Cilium's LB-IPAM pool, announced over L2 in the nodes' subnet."""
    blocks = cilium.load_balancer_addresses or ()
    if hubble.enabled and hubble.ui and hubble.ui_service_type == "LoadBalancer" and not blocks:
        r.report("hubble.uiServiceType", "'LoadBalancer' needs cilium.loadBalancerAddresses (nothing else gives "
                                         "the Service an address; Helm would wait for one, then uninstall Cilium)")
    if blocks and not cilium.enabled:
        r.report("cilium.loadBalancerAddresses", "needs cilium.enabled: true (the pool is Cilium's LB-IPAM)")
    networks = {ipaddress.ip_interface(n.address).network for n in nodes if n.ip and n.prefix is not None}
    taken = {ipaddress.ip_address(n.ip): f"nodes[{i}].ip" for i, n in enumerate(nodes) if n.ip}
    taken.update({ipaddress.ip_address(n.gateway): "the gateway" for n in nodes if n.gateway})
    if cluster["vip"]:
        taken[ipaddress.ip_address(cluster["vip"])] = "cluster.vip"
    for i, block in enumerate(blocks):
        key = f"cilium.loadBalancerAddresses[{i}]"
        start, stop = address_block_range(block)
        if not any(start in net and stop in net for net in networks):
            r.fail(key, block, "is outside the nodes' subnet (L2 announcements answer ARP only there)")
            continue
        clash = next((who for ip, who in taken.items()
                      if ip.version == start.version and start <= ip <= stop), None)
        if clash is not None:
            r.fail(key, block, f"includes {clash} (expected addresses no node, VIP or gateway uses)")
        elif any(_is_network_or_broadcast(str(a), net) for net in networks for a in (start, stop) if a in net):
            r.fail(key, block, "includes the subnet's network or broadcast address")


def _check_addons(r: _Reader, raw: Mapping[str, Any], cluster: dict, nodes: list[NodeSettings],
                  cilium: CiliumSettings, hubble: HubbleSettings, ccm: CcmSettings) -> None:
    hubble_raw = raw.get("hubble") if isinstance(raw.get("hubble"), Mapping) else {}
    if hubble.enabled and hubble.ui and not hubble.relay:
        r.report("hubble.ui", "true needs hubble.relay: true (the UI reads flows through the relay)")
    if not cilium.enabled and hubble.enabled and "enabled" in hubble_raw:
        r.warn("hubble.enabled", True, "has no effect with cilium.enabled: false (Hubble is part of Cilium)")
    if ccm.enabled and ccm.node_ipam is not None and cluster["pod_subnets"]:
        for subnet in cluster["pod_subnets"]:
            net = ipaddress.ip_network(subnet)
            key, mask = (("maskSizeIpv4", ccm.node_ipam.mask_size_ipv4) if net.version == 4
                         else ("maskSizeIpv6", ccm.node_ipam.mask_size_ipv6))
            if mask is None:
                continue
            # kube-controller-manager's rule: a node range lies inside the pod subnet, at most 16 bits smaller.
            if mask < net.prefixlen or mask - net.prefixlen > 16:
                r.fail(f"ccm.nodeIpam.{key}", mask, f"does not fit pod subnet {net} (expected {net.prefixlen}-"
                                                    f"{min(net.prefixlen + 16, net.max_prefixlen)})")
            elif 2 ** (mask - net.prefixlen) < len(nodes):
                r.fail(f"ccm.nodeIpam.{key}", mask, f"leaves room for {2 ** (mask - net.prefixlen)} node "
                                                    f"range(s) in {net}, fewer than the {len(nodes)} nodes")
    _check_load_balancer(r, cluster, nodes, cilium, hubble)
    _check_hubble_ui_values(r, cilium)
    control_planes = sum(1 for n in nodes if n.role == "controlplane")
    if ccm.enabled and ccm.replicas and control_planes and ccm.replicas > control_planes:
        r.warn("ccm.replicas", ccm.replicas, f"is more than the {control_planes} control planes the CCM runs on; "
                                             "the extra replicas stay Pending")


# The Service types the program knows how to give the Hubble UI's address for (LoadBalancer is a Service of its
# own, asked for with hubble.uiServiceType).
_HUBBLE_UI_VALUE_SERVICE_TYPES = ("ClusterIP", "NodePort")


def _check_hubble_ui_values(r: _Reader, cilium: CiliumSettings) -> None:
    """What of `cilium.values` the program reads back to export the Hubble UI's address
    (cluster_plan.addon_values.hubble_ui_exposure, under `pulumi up`): `hubble`, `hubble.ui` and
    `hubble.ui.service` mappings (as the chart's values schema has them), a Service type it can address, and an
    integer nodePort; anything else raised there, after the cluster was made."""
    if not cilium.enabled or not isinstance(cilium.values, Mapping):
        return
    path, node = "cilium.values", cilium.values
    for key in ("hubble", "ui", "service"):
        path, node = f"{path}.{key}", node.get(key)
        if node is None:
            return
        if not isinstance(node, Mapping):
            r.fail(path, node, "is not a mapping (expected Helm values under it, as the Cilium chart has them)")
            return
    service_type = node.get("type")
    if service_type is not None and service_type not in _HUBBLE_UI_VALUE_SERVICE_TYPES:
        r.fail(f"{path}.type", service_type, "is not a Service type the program can give the Hubble UI's address for "
                                             "(expected ClusterIP or NodePort; for LoadBalancer set hubble.uiServiceType)")
    node_port = node.get("nodePort")
    if node_port is not None and (isinstance(node_port, bool) or not isinstance(node_port, int)
                                  or not 1 <= node_port <= 65535):
        r.fail(f"{path}.nodePort", node_port, "is not a port (expected an integer in 1-65535)")
