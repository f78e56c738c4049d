"""The `proxmox` section: the host, datastores, bridge, CPU type and tags the VMs are made with. No Pulumi here."""

from __future__ import annotations

import re
from typing import Any

from talos_proxmox.settings.model import ProxmoxSettings
from talos_proxmox.settings.values import _Reader, _bool, _list_of, _matching


# Proxmox's own formats (pve-common JSONSchema 'pve-tag', pve-storage 'pve-storage-id').
_PROXMOX_TAG = re.compile(r"^[a-z0-9_][a-z0-9_\-+.]*$", re.IGNORECASE)


_STORAGE_ID = re.compile(r"^[a-z][a-z0-9\-_.]*[a-z0-9]$", re.IGNORECASE)


_PROXMOX_NODE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", re.IGNORECASE)  # pve-common 'pve-node'


_BRIDGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")  # a Linux interface name: at most 15 bytes


# The CPU types the Proxmox provider accepts (bpg/terraform-provider-proxmox v0.111.1,
# proxmoxtf/resource/vm/validators.go): PVE's built-in models, or a custom model as `custom-<name>`.
PROVIDER_CPU_TYPES = frozenset({
    "486", "Broadwell", "Broadwell-IBRS", "Broadwell-noTSX", "Broadwell-noTSX-IBRS", "Cascadelake-Server",
    "Cascadelake-Server-noTSX", "Cascadelake-Server-v2", "Cascadelake-Server-v4", "Cascadelake-Server-v5", "Conroe",
    "Cooperlake", "Cooperlake-v2", "EPYC", "EPYC-Genoa", "EPYC-IBPB", "EPYC-Milan", "EPYC-Rome", "EPYC-Rome-v2",
    "EPYC-Rome-v3", "EPYC-Rome-v4", "EPYC-v3", "EPYC-v4", "Haswell", "Haswell-IBRS", "Haswell-noTSX",
    "Haswell-noTSX-IBRS", "Icelake-Client", "Icelake-Client-noTSX", "Icelake-Server", "Icelake-Server-noTSX",
    "Icelake-Server-v3", "Icelake-Server-v4", "Icelake-Server-v5", "Icelake-Server-v6", "IvyBridge", "IvyBridge-IBRS",
    "KnightsMill", "Nehalem", "Nehalem-IBRS", "Opteron_G1", "Opteron_G2", "Opteron_G3", "Opteron_G4", "Opteron_G5",
    "Penryn", "SandyBridge", "SandyBridge-IBRS", "SapphireRapids", "Skylake-Client", "Skylake-Client-IBRS",
    "Skylake-Client-noTSX-IBRS", "Skylake-Client-v4", "Skylake-Server", "Skylake-Server-IBRS",
    "Skylake-Server-noTSX-IBRS", "Skylake-Server-v4", "Skylake-Server-v5", "Westmere", "Westmere-IBRS", "athlon",
    "core2duo", "coreduo", "host", "kvm32", "kvm64", "max", "pentium", "pentium2", "pentium3", "phenom", "qemu32",
    "qemu64", "x86-64-v2", "x86-64-v2-AES", "x86-64-v3", "x86-64-v4",
})


_CUSTOM_CPU_TYPE = re.compile(r"^custom-.+$")


_STORAGE_EXPECTED = "is not a Proxmox datastore id (expected e.g. local-lvm: a letter, then letters, digits, '-', '_', '.')"


def _read_proxmox(r: _Reader, raw: Any) -> ProxmoxSettings:
    s = r.section(raw, "proxmox", ("node", "vmDatastore", "isoDatastore", "isoDatastoreShared", "bridge", "cpuType",
                                   "tags", "datastores"))
    return ProxmoxSettings(
        node=r.value(s, "node", "proxmox.node", _matching(_PROXMOX_NODE),
                     "is not a Proxmox node name (expected e.g. pve)"),
        vm_datastore=r.value(s, "vmDatastore", "proxmox.vmDatastore", _matching(_STORAGE_ID),
                             _STORAGE_EXPECTED, default="local-lvm"),
        iso_datastore=r.value(s, "isoDatastore", "proxmox.isoDatastore", _matching(_STORAGE_ID),
                              _STORAGE_EXPECTED, default="local"),
        bridge=r.value(s, "bridge", "proxmox.bridge", _matching(_BRIDGE),
                       "is not a Linux bridge name (expected e.g. vmbr0, at most 15 characters)", default="vmbr0"),
        cpu_type=r.value(s, "cpuType", "proxmox.cpuType", _cpu_type,
                         "is not a CPU type the Proxmox provider accepts (expected one of PVE's built-in models, "
                         "e.g. host or x86-64-v2-AES, or a custom model as custom-<name>)", default="host"),
        tags=r.value(s, "tags", "proxmox.tags", _list_of(_matching(_PROXMOX_TAG)),
                     "is not a list of Proxmox tags (letters, digits, '_', '-', '+', '.'; not starting with "
                     "'-', '+' or '.')", default=()),
        iso_datastore_shared=r.value(s, "isoDatastoreShared", "proxmox.isoDatastoreShared", _bool,
                                     "is not true or false", default=False),
        datastores=r.value(s, "datastores", "proxmox.datastores", _list_of(_matching(_STORAGE_ID)),
                           "is not a list of Proxmox datastore ids (datastores besides vmDatastore that every "
                           "Proxmox host of the stack has, e.g. [ceph-rbd])", default=()),
    )


def _cpu_type(v: Any) -> str:
    if not isinstance(v, str) or not (v in PROVIDER_CPU_TYPES or _CUSTOM_CPU_TYPE.match(v)):
        raise ValueError
    return v
