"""The `nodes` section: each node's VM, address and patches, and the checks across nodes. No Pulumi here."""

from __future__ import annotations

import ipaddress
import posixpath
import re
from typing import Any, Mapping, Optional

from talos_proxmox.settings.cluster import _device, _dns_label
from talos_proxmox.settings.model import (
    CONTROL_PLANE_MINIMUM,
    CPU_RANGE,
    DISK_GB_RANGE,
    DataDisk,
    MEMORY_MIB_RANGE,
    NetworkSettings,
    NodeSettings,
    PROJECT,
    ProxmoxSettings,
    RENDER_OUTPUT_FILES,
    ROLES,
    SYSTEM_DIRECTORIES,
    SYSTEM_MOUNTPOINTS,
)
from talos_proxmox.settings.proxmox import _PROXMOX_NODE
from talos_proxmox.settings.values import (
    _MTU_RANGE,
    _Reader,
    _int_in,
    _ip,
    _ip_list,
    _list_of,
    _mac,
    _matching,
    _one_of,
    _patches,
)


_KERNEL_MODULE = re.compile(r"^[A-Za-z0-9_-]+$")


_NODE_KEYS = ("name", "role", "vmId", "proxmoxNode", "cpu", "memory", "disk", "dataDisk", "ip", "gateway",
              "nameservers", "mac", "mtu", "kernelModules", "patches")


def _read_node(r: _Reader, raw: Any, i: int, network: Optional[NetworkSettings],
               proxmox: ProxmoxSettings, install_disk: Optional[str],
               talos_version: Optional[str]) -> Optional[NodeSettings]:
    path = f"nodes[{i}]"
    s = r.section(raw, path, _NODE_KEYS)
    if not s:
        return None
    dd = s.get("dataDisk")
    data_disk = None
    if dd is not None:
        d = r.section(dd, f"{path}.dataDisk", ("size", "device", "mountpoint"))
        user_volume = _multidoc_contract(talos_version)
        data_disk = DataDisk(
            size_gb=r.value(d, "size", f"{path}.dataDisk.size", _int_in(1, DISK_GB_RANGE[1]),
                            f"is not a size in GB (expected an integer in 1-{DISK_GB_RANGE[1]})"),
            device=r.value(d, "device", f"{path}.dataDisk.device", _device, "is not a device path (expected /dev/...)",
                           default="/dev/sdb"),
            mountpoint=r.value(d, "mountpoint", f"{path}.dataDisk.mountpoint", _abs_path,
                               "is not a normalised absolute path (expected e.g. /var/lib/longhorn)",
                               default="/var/mnt/longhorn" if user_volume else "/var/lib/longhorn"),
        )
        _check_data_disk(r, data_disk, f"{path}.dataDisk", install_disk, user_volume)
    ip, prefix = _node_address(r, s, path, network)
    gateway = r.value(s, "gateway", f"{path}.gateway", _ip, "is not an IP address",
                      default=network.gateway if network else None)
    # An inherited gateway was checked against network.subnet already; a node's own gateway or prefix is not.
    own = s.get("gateway") is not None or "/" in str(s.get("ip"))
    if ip and own and gateway and ipaddress.ip_address(gateway) not in ipaddress.ip_interface(f"{ip}/{prefix}").network:
        r.fail(f"{path}.gateway", gateway, f"is outside the node's subnet {ipaddress.ip_interface(f'{ip}/{prefix}').network}")
    if ip and gateway and ip == gateway:
        r.fail(f"{path}.ip", s.get("ip"), f"is the gateway {gateway} (expected an address of the node's own)")
    name = s.get("name")
    if isinstance(name, str) and {name, f"{name}.yaml"} & set(RENDER_OUTPUT_FILES):
        r.fail(f"{path}.name", name, "is a name the render command writes a file of its own under (expected a "
                                     f"name other than: {', '.join(_RESERVED_NODE_NAMES)})")
    return NodeSettings(
        name=r.value(s, "name", f"{path}.name", _dns_label,
                     "is not a node name (expected lowercase letters, digits and '-', at most 63)"),
        role=r.value(s, "role", f"{path}.role", _one_of(*ROLES), "is not a role (expected controlplane or worker)"),
        vm_id=r.value(s, "vmId", f"{path}.vmId", _int_in(100, 999_999_999), "is not a Proxmox VM id (expected 100-999999999)",
                      default=None),
        proxmox_node=r.value(s, "proxmoxNode", f"{path}.proxmoxNode", _matching(_PROXMOX_NODE),
                             "is not a Proxmox node name (expected e.g. pve)", default=proxmox.node),
        cpu=r.value(s, "cpu", f"{path}.cpu", _int_in(*CPU_RANGE),
                    "is not a number of vCPUs (expected an integer in {}-{})".format(*CPU_RANGE)),
        memory_mib=r.value(s, "memory", f"{path}.memory", _int_in(*MEMORY_MIB_RANGE),
                           "is not a memory size in MiB (expected an integer in {}-{}; Talos needs at least "
                           "1 GiB)".format(*MEMORY_MIB_RANGE)),
        disk_gb=r.value(s, "disk", f"{path}.disk", _int_in(*DISK_GB_RANGE),
                        "is not a boot disk size in GB (expected an integer in {}-{}; Talos needs at least "
                        "10 GB)".format(*DISK_GB_RANGE)),
        data_disk=data_disk,
        ip=ip,
        prefix=prefix,
        gateway=gateway,
        nameservers=r.value(s, "nameservers", f"{path}.nameservers", _ip_list,
                            "is not a non-empty list of IP addresses",
                            default=network.nameservers if network else ()),
        mac=r.value(s, "mac", f"{path}.mac", _mac, "is not a MAC address (expected e.g. bc:24:11:80:a1:9b)"),
        mtu=r.value(s, "mtu", f"{path}.mtu", _int_in(*_MTU_RANGE), f"is not an MTU in {_MTU_RANGE[0]}-{_MTU_RANGE[1]}",
                    default=network.mtu if network else None),
        kernel_modules=r.value(s, "kernelModules", f"{path}.kernelModules", _list_of(_matching(_KERNEL_MODULE)),
                               "is not a list of kernel module names (letters, digits, '_' and '-')", default=()),
        patches=_patches(r, s.get("patches"), f"{path}.patches"),
    )


def _node_address(r: _Reader, s: Mapping, path: str,
                  network: Optional[NetworkSettings]) -> tuple[Optional[str], Optional[int]]:
    """A node's `ip` is a bare address inside network.subnet, or address/prefix for a subnet of its own."""
    raw = s.get("ip")
    if raw is None:
        r.report(f"{path}.ip", "is required: an IP address or address/prefix (expected e.g. 10.255.200.201)")
        return None, None
    try:
        if not isinstance(raw, str):
            raise TypeError
        iface = ipaddress.ip_interface(raw)
    except (ValueError, TypeError):
        r.fail(f"{path}.ip", raw, "is not an IP address or address/prefix (expected e.g. 10.255.200.201)")
        return None, None
    if "/" in raw:
        if _is_network_or_broadcast(str(iface.ip), iface.network):
            r.fail(f"{path}.ip", raw, f"is the network or broadcast address of {iface.network}")
        return str(iface.ip), iface.network.prefixlen
    if network is None:
        return str(iface.ip), iface.network.prefixlen
    if iface.ip not in network.subnet:
        r.fail(f"{path}.ip", raw, f"is outside network.subnet {network.subnet}")
        return None, None
    if _is_network_or_broadcast(str(iface.ip), network.subnet):
        r.fail(f"{path}.ip", raw, f"is the network or broadcast address of {network.subnet}")
        return None, None
    return str(iface.ip), network.subnet.prefixlen


def _is_network_or_broadcast(ip: str, network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> bool:
    """No host may use these (a /31 or /32, and IPv6, have no broadcast address: RFC 3021)."""
    if network.version == 6:
        return ipaddress.ip_address(ip) == network.network_address and network.prefixlen < 127
    return network.prefixlen < 31 and ipaddress.ip_address(ip) in (network.network_address, network.broadcast_address)


def _abs_path(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("/") or v != posixpath.normpath(v) or v.startswith("//"):
        raise ValueError
    return v


_RESERVED_NODE_NAMES = tuple(sorted({f.removesuffix(".yaml") for f in RENDER_OUTPUT_FILES}))


# A Talos user volume: mounted at /var/mnt/<name>; its partition label "u-<name>" has at most 36 characters.
_USER_VOLUME_MOUNT = re.compile(r"^/var/mnt/[A-Za-z0-9-]{1,34}$")


def _multidoc_contract(talos_version: Optional[str]) -> bool:
    from talos_proxmox.talos_config.machine_config import MULTIDOC_KUBERNETES, parse_talos_version

    return talos_version is not None and parse_talos_version(talos_version)[0] >= MULTIDOC_KUBERNETES


def _check_data_disk(r: _Reader, disk: DataDisk, path: str, install_disk: Optional[str], user_volume: bool) -> None:
    """The data disk is a second disk, mounted where Talos lets it: under /var, clear of system directories;
    from Talos 1.14 a user volume, which Talos mounts at /var/mnt/<name>."""
    if disk.device is not None and disk.device == install_disk:
        r.fail(f"{path}.device", disk.device, "is the install disk (cluster.installDisk); expected the second "
                                              "disk, e.g. /dev/sdb")
    mount = disk.mountpoint
    if mount is None:
        return
    if user_volume:
        if not _USER_VOLUME_MOUNT.match(mount):
            r.fail(f"{path}.mountpoint", mount, "is not where Talos 1.14 mounts a user volume (expected "
                                                "/var/mnt/<name>, the name up to 34 letters, digits or '-', "
                                                "e.g. /var/mnt/longhorn)")
        return
    if mount != "/var" and not mount.startswith("/var/"):
        r.fail(f"{path}.mountpoint", mount, "is outside /var, and Talos's root file system is read-only "
                                            "(expected e.g. /var/lib/longhorn)")
        return
    clash = next((p for p in SYSTEM_MOUNTPOINTS if mount == p), None) or \
        next((p for p in SYSTEM_DIRECTORIES if mount.startswith(p + "/")), None)
    if clash is not None:
        r.fail(f"{path}.mountpoint", mount, f"mounts over Talos's system directory {clash} (expected a directory "
                                            "of its own, e.g. /var/lib/longhorn)")


def _check_nodes(r: _Reader, nodes: list[NodeSettings], all_read: bool) -> None:
    for attr, key in (("name", "name"), ("ip", "ip"), ("mac", "mac"), ("vm_id", "vmId")):
        seen: dict[Any, int] = {}
        for i, node in enumerate(nodes):
            value = getattr(node, attr)
            if value is None:
                continue
            if value in seen:
                r.fail(f"nodes[{i}].{key}", value, f"duplicates nodes[{seen[value]}].{key} (expected unique values)")
            else:
                seen[value] = i
    control_planes = [n for n in nodes if n.role == "controlplane"]
    if nodes and all_read and not control_planes and all(n.role for n in nodes):
        r.fail("nodes", f"{len(nodes)} nodes, 0 with role controlplane", "has no control-plane node (expected at least 1)")
    elif len(control_planes) % 2 == 0 and control_planes:
        r.warnings.append(
            f"{PROJECT}:nodes: {len(control_planes)} control-plane nodes is an even number; etcd keeps quorum "
            f"best with an odd number (1, 3, 5)")
    cpus, memory = CONTROL_PLANE_MINIMUM
    for i, node in enumerate(nodes):
        if node.role == "controlplane" and node.cpu is not None and node.cpu < cpus:
            r.warn(f"nodes[{i}].cpu", node.cpu, f"vCPU for control plane {node.name} is below Talos's minimum "
                                                f"of {cpus} for a control plane")
        if node.role == "controlplane" and node.memory_mib is not None and node.memory_mib < memory:
            r.warn(f"nodes[{i}].memory", node.memory_mib, f"MiB for control plane {node.name} is below Talos's "
                                                          f"minimum of {memory} MiB for a control plane")
