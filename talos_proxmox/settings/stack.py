"""Typed, validated stack settings.

`load_settings(raw)` takes the stack's config values under the project namespace (what
`pulumi.Config().get_object(key)` returns for each top-level key) and returns `Settings`, or raises
`SettingsError` listing every problem as `<key>: <value> <what was expected>`. It runs before any
resource is registered, so a bad stack file never touches Proxmox or a node. No Pulumi import here.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Collection, Mapping, Optional

from talos_proxmox.settings.addons import _check_addons, _read_ccm, _read_cilium, _read_hubble
from talos_proxmox.settings.backups import _read_backups
from talos_proxmox.settings.cluster import _read_cluster
from talos_proxmox.settings.storage import _check_csi, _read_csi
from talos_proxmox.settings.image import _read_image
from talos_proxmox.settings.lifecycle import _read_health, _read_lifecycle
from talos_proxmox.settings.model import (
    ClusterSettings,
    DEFAULT_KUBERNETES_VERSIONS,
    ImageSettings,
    KUBERNETES_RANGES,
    NetworkSettings,
    NodeSettings,
    PROJECT,
    Settings,
    SettingsError,
    TOP_LEVEL_KEYS,
)
from talos_proxmox.settings.network import _read_network
from talos_proxmox.settings.nodes import _check_nodes, _is_network_or_broadcast, _read_node
from talos_proxmox.settings.proxmox import _read_proxmox
from talos_proxmox.settings.values import _Reader


def _endpoint_and_vip(r: _Reader, cluster: dict, nodes: list[NodeSettings],
                      network: Optional[NetworkSettings]) -> None:
    vip = cluster["vip"]
    if vip is not None:
        for i, node in enumerate(nodes):
            if node.ip == vip:
                r.fail("cluster.vip", vip, f"equals nodes[{i}].ip (expected an unused address in the nodes' subnet)")
        # Without a valid network.subnet (already reported), bare node addresses have no subnet to check.
        cps = [n for n in nodes if n.role == "controlplane" and n.ip and n.gateway] if network else []
        networks = [ipaddress.ip_interface(n.address).network for n in cps]
        if cps and not any(ipaddress.ip_address(vip) in net for net in networks):
            r.fail("cluster.vip", vip, "is outside every control-plane node's subnet (a Layer 2 VIP must share it)")
        elif any(_is_network_or_broadcast(vip, net) for net in networks):
            r.fail("cluster.vip", vip, f"is the network or broadcast address of {networks[0]} (expected an unused "
                                       "address in the nodes' subnet)")
        elif any(n.gateway == vip for n in cps):
            r.fail("cluster.vip", vip, "is the gateway (expected an unused address in the nodes' subnet)")
    if cluster["endpoint"] is None:
        host = vip or next((n.ip for n in nodes if n.role == "controlplane" and n.ip), None)
        if host is not None:
            host = f"[{host}]" if ":" in host else host
            cluster["endpoint"] = f"https://{host}:6443"


def _check_boot(r: _Reader, cluster: dict, image: ImageSettings) -> None:
    if cluster["system_disk_encryption"] == "tpm" and not image.secure_boot:
        r.report("cluster.systemDiskEncryption", "'tpm' needs image.secureBoot: true (the key is sealed to the "
                                                 "Secure Boot state, PCR 7)")


def _check_cloud_init(r: _Reader, image: ImageSettings, nodes: list[NodeSettings], raw_nodes: Any) -> None:
    """With the nocloud image each VM gets a cloud-init drive of its address (components/node.py
    maintenance_network): Proxmox takes only an IPv4 address and gateway there (`ipconfig0: ip=<IPv4/CIDR>,
    gw=<IPv4>`), and the Proxmox provider only DNS servers without a zone (Go's net.ParseIP)."""
    if image.platform != "nocloud":
        return
    expected = "which the nocloud image's cloud-init drive cannot carry (expected {}, or image.platform: metal)"
    for i, node in enumerate(nodes):
        raw = raw_nodes[i] if isinstance(raw_nodes, list) and i < len(raw_nodes) else {}
        raw = raw if isinstance(raw, Mapping) else {}
        if node.ip and ipaddress.ip_address(node.ip).version == 6:
            r.fail(f"nodes[{i}].ip", raw.get("ip"), "is an IPv6 address, " + expected.format("an IPv4 address"))
        if any("%" in ns for ns in node.nameservers or ()):
            key = f"nodes[{i}].nameservers" if raw.get("nameservers") is not None else "network.nameservers"
            if not any(p.startswith(f"{PROJECT}:{key}: ") for p in r.problems):
                r.fail(key, list(node.nameservers), "holds an address with a zone, " +
                       expected.format("addresses without %<zone>"))


def _kubernetes_version(r: _Reader, cluster: dict) -> None:
    """Default to what `talosctl gen config` of the Talos line picks; refuse what that line does not support."""
    talos = cluster["talos_version"]
    if talos is None:
        return
    line = ".".join(talos.split(".")[:2])
    if cluster["kubernetes_version"] is None:
        cluster["kubernetes_version"] = DEFAULT_KUBERNETES_VERSIONS[line]
        return
    low, high = KUBERNETES_RANGES[line]
    version = tuple(int(x) for x in cluster["kubernetes_version"].split(".")[:2])
    if not low <= version <= high:
        r.fail("cluster.kubernetesVersion", cluster["kubernetes_version"],
               f"is not supported by Talos {line} (expected {low[0]}.{low[1]} to {high[0]}.{high[1]})")


def _check_subnets(r: _Reader, cluster: dict, network: Optional[NetworkSettings], nodes: list[NodeSettings]) -> None:
    """Pod, service and node networks must not share addresses: routing could not tell them apart."""
    named: list[tuple[str, Any]] = []
    for key, attr in (("cluster.podSubnets", "pod_subnets"), ("cluster.serviceSubnets", "service_subnets")):
        named += [(key, ipaddress.ip_network(c)) for c in cluster[attr] or ()]
    if network is not None:
        named.append(("network.subnet", network.subnet))
    for i, node in enumerate(nodes):
        if node.ip and node.prefix is not None:
            net = ipaddress.ip_interface(node.address).network
            if network is None or net != network.subnet:
                named.append((f"nodes[{i}].ip", net))
    reported: set[tuple[str, str]] = set()
    for a, (key_a, net_a) in enumerate(named):
        for key_b, net_b in named[a + 1:]:
            if net_a.version != net_b.version or not net_a.overlaps(net_b):
                continue
            if key_a.startswith("nodes[") and key_b.startswith("nodes["):
                continue  # nodes may share a subnet of their own
            if (key_a, key_b) in reported:
                continue
            reported.add((key_a, key_b))
            r.fail(key_a, str(net_a), f"overlaps {key_b} {net_b} (expected pod, service and node networks apart)")


# kube-apiserver before 1.34 (MultiCIDRServiceAllocator and DisableAllocatorDualWrite both on by default from
# then) refuses a service subnet of more than 2^20 addresses (cmd/kube-apiserver/app/options/validation.go).
SERVICE_SUBNET_MAX_HOST_BITS = 20
UNLIMITED_SERVICE_SUBNETS_FROM = (1, 34)


def _check_kubernetes_networks(r: _Reader, cluster: dict) -> None:
    """Pod and service subnets as Kubernetes reads them again from the flags Talos gives it: at most one subnet
    per IP family (kube-controller-manager's --cluster-cidr, kube-apiserver's --service-cluster-ip-range; both
    refuse to start otherwise), and no service subnet larger than the API server of that version allocates from.
    A key already refused (e.g. overlapping subnets) gets no second line."""
    for key, attr, component in (("cluster.podSubnets", "pod_subnets", "kube-controller-manager"),
                                 ("cluster.serviceSubnets", "service_subnets", "kube-apiserver")):
        if cluster[attr] is None or any(p.startswith(f"{PROJECT}:{key}: ") for p in r.problems):
            continue
        subnets = [ipaddress.ip_network(c) for c in cluster[attr]]
        if len(subnets) > 2 or len({net.version for net in subnets}) < len(subnets):
            r.fail(key, list(cluster[attr]), f"is not one subnet, or one IPv4 and one IPv6 subnet ({component} "
                                             "takes at most one per IP family)")
            continue
        version = cluster["kubernetes_version"]
        if attr != "service_subnets" or version is None or \
                tuple(int(x) for x in version.split(".")[:2]) >= UNLIMITED_SERVICE_SUBNETS_FROM:
            continue
        for net in subnets:
            if net.max_prefixlen - net.prefixlen > SERVICE_SUBNET_MAX_HOST_BITS:
                r.fail(key, str(net), f"is larger than kube-apiserver {version} allocates Service addresses from "
                                      f"(expected a prefix of /{net.max_prefixlen - SERVICE_SUBNET_MAX_HOST_BITS} or "
                                      "longer; Kubernetes 1.34 and later take any size)")


def load_settings(raw: Mapping[str, Any], secret_keys: Collection[str] = ()) -> Settings:
    """Validate a stack's raw config (top-level keys without the project prefix) into `Settings`.

    `secret_keys`: the top-level keys whose values are secret; problems under them name the key only.
    """
    r = _Reader(frozenset(secret_keys))
    for unknown in sorted(set(raw) - set(TOP_LEVEL_KEYS)):
        if raw[unknown] is not None:
            r.report(unknown, f"is not a known key (expected one of: {', '.join(TOP_LEVEL_KEYS)})")
    cluster = _read_cluster(r, raw.get("cluster"))
    _kubernetes_version(r, cluster)
    network = _read_network(r, raw.get("network"))
    proxmox = _read_proxmox(r, raw.get("proxmox"))
    image = _read_image(r, raw.get("image"))
    raw_nodes = raw.get("nodes")
    nodes: list[NodeSettings] = []
    if not isinstance(raw_nodes, list) or not raw_nodes:
        r.fail("nodes", raw_nodes, "is not a non-empty list of nodes")
    else:
        nodes = [n for i, item in enumerate(raw_nodes)
                 if (n := _read_node(r, item, i, network, proxmox, cluster["install_disk"], cluster["talos_version"])) is not None]
    _check_nodes(r, nodes, all_read=isinstance(raw_nodes, list) and len(nodes) == len(raw_nodes))
    _endpoint_and_vip(r, cluster, nodes, network)
    _check_subnets(r, cluster, network, nodes)
    _check_kubernetes_networks(r, cluster)
    if cluster["kubespan"].enabled and cluster["kubespan"].mtu is not None and cluster["kubespan"].mtu < 1280:
        r.fail("cluster.kubespan.mtu", cluster["kubespan"].mtu, "is below 1280, the least WireGuard over IPv6 carries")
    cilium = _read_cilium(r, raw.get("cilium"))
    hubble = _read_hubble(r, raw.get("hubble"))
    ccm = _read_ccm(r, raw.get("ccm"))
    csi = _read_csi(r, raw.get("csi"), cluster.get("name"))
    backups = _read_backups(r, raw.get("backups"))
    health = _read_health(r, raw.get("health"))
    lifecycle = _read_lifecycle(r, raw.get("lifecycle"))
    _check_addons(r, raw, cluster, nodes, cilium, hubble, ccm)
    _check_csi(r, csi, proxmox, ccm, cluster.get("name"))
    _check_boot(r, cluster, image)
    _check_cloud_init(r, image, nodes, raw_nodes)
    if r.problems:
        raise SettingsError(r.problems)
    return Settings(
        cluster=ClusterSettings(**cluster),
        network=network,
        proxmox=proxmox,
        image=image,
        nodes=tuple(nodes),
        cilium=cilium,
        hubble=hubble,
        ccm=ccm,
        csi=csi,
        backups=backups,
        health=health,
        lifecycle=lifecycle,
        warnings=tuple(r.warnings),
    )


def cluster_rename_problem(deployed: Optional[str], wanted: Optional[str]) -> Optional[str]:
    """Why a deployed cluster cannot take a new cluster.name (None: it is not a rename). Talos writes the
    name into every node's config, the discovery service keys on it and the secrets belong to it; changed
    in place, the engine would also orphan the protected secrets half-way through an update."""
    if not deployed or not wanted or deployed == wanted:
        return None
    return (f"{PROJECT}:cluster.name: {wanted!r} renames the deployed cluster {deployed!r}, which a running "
            f"Talos cluster cannot take (expected {deployed!r}; for a cluster of the new name, make a new stack "
            f"and move workloads, or `pulumi destroy` this one first)")


def stack_file_config(path: str) -> dict[str, Any]:
    """This project's keys from a `stacks/Pulumi.<stack>.yaml`, prefix stripped, as `load_settings` takes them."""
    prefix = f"{PROJECT}:"
    return {k[len(prefix):]: v for k, v in stack_file_values(path).items() if k.startswith(prefix)}


def stack_file_values(path: str) -> dict[str, Any]:
    """The `config:` mapping of a stack file: every key with its namespace.

    Used where no Pulumi engine runs (the offline render command, tests); `pulumi up` reads the same
    values through `pulumi.Config`. A file that is not YAML, or not shaped as a stack file, is one
    SettingsError line naming the file (and the line and problem where YAML says them).
    """
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except UnicodeDecodeError as exc:
        raise SettingsError([f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"]) \
            from None
    except OSError as exc:
        raise SettingsError([f"{path}: cannot be read ({exc.strerror})"]) from None
    try:
        document = yaml.safe_load(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; it knows only the offset
        before = text[:exc.position]
        line, column = before.count("\n") + 1, exc.position - before.rfind("\n")
        raise SettingsError([f"{path}:{line}:{column}: not valid YAML: unacceptable character "
                             f"#x{exc.character:04x}: {exc.reason}"]) from None
    except yaml.MarkedYAMLError as exc:  # every other error of PyYAML's loader
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else path
        raise SettingsError([f"{where}: not valid YAML: {exc.problem or exc.context}"]) from None
    if document is None:
        document = {}
    if not isinstance(document, dict):
        raise SettingsError([f"{path}: a {type(document).__name__} (expected a mapping with a 'config:' key)"])
    config = document.get("config") or {}
    if not isinstance(config, dict):
        raise SettingsError([f"{path}: config: a {type(config).__name__} (expected a mapping of '<namespace>:<key>')"])
    return {str(k): v for k, v in config.items()}
