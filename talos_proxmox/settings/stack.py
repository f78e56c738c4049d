"""Typed, validated stack settings.

`load_settings(raw)` takes the stack's config values under the project namespace (what
`pulumi.Config().get_object(key)` returns for each top-level key) and returns `Settings`, or raises
`SettingsError` listing every problem as `<key>: <value> <what was expected>`. It runs before any
resource is registered, so a bad stack file never touches Proxmox or a node. No Pulumi import here.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Mapping, Optional
from urllib.parse import urlsplit

PROJECT = "talos-proxmox"
ROLES = ("controlplane", "worker")
TOP_LEVEL_KEYS = ("cluster", "network", "proxmox", "image", "nodes", "cilium", "hubble", "ccm", "health", "lifecycle")

_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_VERSION = re.compile(r"^v?\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$")
_MTU_RANGE = (68, 65535)
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
_KERNEL_MODULE = re.compile(r"^[A-Za-z0-9_-]+$")
_EXTENSION = re.compile(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$")  # siderolabs/qemu-guest-agent
# Bounds no Proxmox host gives beyond: QEMU's vCPU limit, PVE's 4 TiB memory maximum, and 64 TiB disks.
CPU_RANGE = (1, 512)
MEMORY_MIB_RANGE = (1024, 4 * 1024 * 1024)  # Talos's minimum for any node is 1 GiB
DISK_GB_RANGE = (10, 64 * 1024)  # Talos's minimum system disk is 10 GB
TIMEOUT_RANGE = (1, 86400)  # a day: anything longer is a typo, and a hung step must end
_TIMEOUT_EXPECTED = "is not a timeout in seconds (expected an integer in {}-{}, at most a day)".format(*TIMEOUT_RANGE)
# Talos's system requirements for a control plane; below them etcd and the API server starve.
CONTROL_PLANE_MINIMUM = (2, 2048)
# Where a data disk must not be mounted: Talos's own state, and the kubelet's, containerd's and etcd's
# directories or anything in them; /var, /var/lib and /var/mnt themselves hold other things too.
SYSTEM_DIRECTORIES = ("/var/lib/etcd", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/cni", "/var/log",
                      "/var/run", "/var/system", "/var/etc")
SYSTEM_MOUNTPOINTS = ("/var", "/var/lib", "/var/mnt", *SYSTEM_DIRECTORIES)
# pkg/machinery/compatibility/talos1NN: the Kubernetes versions each Talos line supports.
KUBERNETES_RANGES = {"v1.12": ((1, 30), (1, 35)), "v1.13": ((1, 31), (1, 36)), "v1.14": ((1, 32), (1, 37))}
# The render command writes these beside <node>.yaml; a node of the same name would overwrite one.
RENDER_OUTPUT_FILES = ("secrets.yaml", "talosconfig", "schematic.yaml", "schematic-id", "cilium-values.yaml",
                       "cilium-load-balancer.yaml", "talos-ccm-values.yaml")

DEFAULT_TALOS_VERSION = "v1.13.7"
DEFAULT_CILIUM_VERSION = "1.19.6"
# What `talosctl gen config` of each Talos release line picks when no Kubernetes version is given
# (pkg/machinery/constants DefaultKubernetesVersion at v1.12.0, v1.13.7 and v1.14.1). A line's later patch
# releases pick newer patch versions; ours move deliberately, since a new default rolls Kubernetes on
# every cluster that does not pin it (tests/unit/talos_config/test_talos_oracle.py holds both).
DEFAULT_KUBERNETES_VERSIONS = {"v1.12": "1.35.0", "v1.13": "1.36.2", "v1.14": "1.37.0"}
# siderolabs/talos-cloud-controller-manager charts/: chart 0.5.4 ships CCM v1.12.0.
DEFAULT_CCM_CHART_VERSION = "0.5.4"
DEFAULT_HEALTH_TIMEOUT_SECONDS = 600
DEFAULT_LIFECYCLE_TIMEOUT_SECONDS = 1200  # one node's upgrade: drain, install, reboot, healthy again
DEFAULT_CCM_CONTROLLERS = ("cloud-node", "node-csr-approval")
KNOWN_CCM_CONTROLLERS = (
    "cloud-node",
    "cloud-node-lifecycle",
    "node-csr-approval",
    "node-ipam-controller",
)


class SettingsError(ValueError):
    """Stack config that cannot be used; `problems` holds one message per bad key."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__(
            "invalid stack config:\n" + "\n".join(f"  - {p}" for p in problems)
        )


# ---------------------------------------------------------------- typed settings


@dataclass(frozen=True)
class KubeSpan:
    enabled: bool = False
    mtu: int = 1420
    advertise_kubernetes_networks: bool = False


@dataclass(frozen=True)
class ClusterSettings:
    name: str
    endpoint: str
    vip: Optional[str]
    talos_version: str
    kubernetes_version: str
    pod_subnets: tuple[str, ...]
    service_subnets: tuple[str, ...]
    domain: str
    install_disk: str
    kubespan: KubeSpan
    discovery: bool
    patches: tuple[Any, ...]
    role_patches: Mapping[str, tuple[Any, ...]]
    secrets_file: Optional[str]
    system_disk_encryption: str = "none"  # or "tpm": STATE and EPHEMERAL sealed to the node's TPM
    deletion_protection: bool = True  # `pulumi destroy` refused before anything is touched; secrets never replaced
    allow_downgrade: bool = False  # a lower talosVersion is refused unless the stack says so


@dataclass(frozen=True)
class NetworkSettings:
    subnet: ipaddress.IPv4Network | ipaddress.IPv6Network
    gateway: str
    nameservers: tuple[str, ...]
    mtu: Optional[int]


@dataclass(frozen=True)
class ProxmoxSettings:
    node: str
    vm_datastore: str
    iso_datastore: str
    bridge: str
    cpu_type: str
    tags: tuple[str, ...]
    iso_datastore_shared: bool = False  # one ISO every Proxmox host sees, instead of one per host


@dataclass(frozen=True)
class ImageSettings:
    factory_url: str
    platform: str
    arch: str
    secure_boot: bool
    schematic: Mapping[str, Any]


@dataclass(frozen=True)
class DataDisk:
    size_gb: int
    device: str
    mountpoint: str


@dataclass(frozen=True)
class NodeSettings:
    name: str
    role: str
    vm_id: Optional[int]
    proxmox_node: str
    cpu: int
    memory_mib: int
    disk_gb: int
    data_disk: Optional[DataDisk]
    ip: str
    prefix: int
    gateway: str
    nameservers: tuple[str, ...]
    mac: str
    mtu: Optional[int]
    kernel_modules: tuple[str, ...]
    patches: tuple[Any, ...]

    @property
    def address(self) -> str:
        """The node's address with its prefix, as Talos writes it (10.0.0.5/24)."""
        return f"{self.ip}/{self.prefix}"


@dataclass(frozen=True)
class CiliumSettings:
    enabled: bool
    version: str
    repository: str
    values: Mapping[str, Any]
    # LB-IPAM pool announced over L2: CIDRs or start-stop ranges in the nodes' subnet.
    load_balancer_addresses: tuple[str, ...] = ()
    # PEM bundle (absolute path) of the CAs that sign `repository`'s HTTPS certificate (a private mirror).
    ca_file: Optional[str] = None


@dataclass(frozen=True)
class HubbleSettings:
    enabled: bool
    relay: bool
    ui: bool
    ui_service_type: str


@dataclass(frozen=True)
class NodeIpam:
    cidr_allocator_type: str
    mask_size_ipv4: int
    mask_size_ipv6: int


@dataclass(frozen=True)
class CcmSettings:
    enabled: bool
    chart: str
    version: str
    replicas: int
    controllers: tuple[str, ...]
    node_ipam: Optional[NodeIpam]
    values: Mapping[str, Any]


@dataclass(frozen=True)
class EtcdSnapshots:
    """Where the etcd snapshot taken before each control plane's upgrade or removal goes (relative paths
    are to the project directory), and how many of the cluster's are kept."""
    directory: str = "etcd-snapshots"
    keep: int = 5


@dataclass(frozen=True)
class LifecycleSettings:
    """Day two, per node: how long one upgrade or removal may take, whether a removed node is reset, and
    the etcd snapshots taken first (None: off)."""
    timeout_seconds: int = DEFAULT_LIFECYCLE_TIMEOUT_SECONDS
    reset_on_delete: bool = True
    etcd_snapshots: Optional[EtcdSnapshots] = EtcdSnapshots()


@dataclass(frozen=True)
class HealthSettings:
    """Wait after the add-ons until every node is Ready and CoreDNS is available."""
    wait: bool = True
    timeout_seconds: int = DEFAULT_HEALTH_TIMEOUT_SECONDS


@dataclass(frozen=True)
class Settings:
    cluster: ClusterSettings
    network: NetworkSettings
    proxmox: ProxmoxSettings
    image: ImageSettings
    nodes: tuple[NodeSettings, ...]
    cilium: CiliumSettings
    hubble: HubbleSettings
    ccm: CcmSettings
    health: HealthSettings = field(default=HealthSettings())
    lifecycle: LifecycleSettings = field(default=LifecycleSettings())
    warnings: tuple[str, ...] = field(default=())

    @property
    def control_planes(self) -> tuple[NodeSettings, ...]:
        return tuple(n for n in self.nodes if n.role == "controlplane")

    @property
    def workers(self) -> tuple[NodeSettings, ...]:
        return tuple(n for n in self.nodes if n.role == "worker")

    @property
    def bootstrap_node(self) -> NodeSettings:
        """The first control plane in stack order: bootstrap runs there, once."""
        return self.control_planes[0]


# ---------------------------------------------------------------- reading helpers


SECRET_VALUE = "[secret]"


def top_level_key(path: str) -> str:
    """`nodes` of `nodes[3].ip`, `cluster` of `cluster.patches[0]`."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


class _Reader:
    """Walks raw config, collecting one problem per bad key instead of stopping at the first.

    `secret_keys` are the top-level keys set with `pulumi config set --secret`: their values are
    never quoted, only named.
    """

    def __init__(self, secret_keys: frozenset[str] = frozenset()) -> None:
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.secret_keys = secret_keys
        self.bad_sections: list[str] = []  # problems inside these follow from the section itself: not repeated

    def shown(self, key: str, value: Any) -> str:
        return SECRET_VALUE if top_level_key(key) in self.secret_keys else repr(value)

    def fail(self, key: str, value: Any, expected: str) -> None:
        self.report(key, f"{self.shown(key, value)} {expected}")

    def report(self, key: str, problem: str) -> None:
        if not any(key.startswith((f"{bad}.", f"{bad}[")) for bad in self.bad_sections):
            self.problems.append(f"{PROJECT}:{key}: {problem}")

    def warn(self, key: str, value: Any, advice: str) -> None:
        self.warnings.append(f"{PROJECT}:{key}: {self.shown(key, value)} {advice}")

    def section(self, raw: Any, key: str, allowed: tuple[str, ...]) -> dict:
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            self.fail(key, raw, "is not a mapping")
            self.bad_sections.append(key)
            return {}
        for unknown in sorted(set(raw) - set(allowed)):
            self.fail(f"{key}.{unknown}", raw[unknown], f"is not a known key (expected one of: {', '.join(allowed)})")
        return dict(raw)

    def value(self, raw: Mapping, key: str, path: str, check: Callable[[Any], Any],
              expected: str, default: Any = ..., ) -> Any:
        """`check` converts a raw value or raises ValueError/TypeError; missing keys take `default`."""
        if key not in raw or raw[key] is None:
            if default is ...:
                self.report(path, f"is required: {expected.removeprefix('is not ')}")
            return None if default is ... else default
        try:
            return check(raw[key])
        except (ValueError, TypeError):
            self.fail(path, raw[key], expected)
            return None if default is ... else default


def _string(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError
    return v


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError
    return v


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ValueError
        return v
    return check


def _matching(pattern: re.Pattern) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str) or not pattern.match(v):
            raise ValueError
        return v
    return check


def is_dns_name(value: Any, max_length: int = 253) -> bool:
    """Lowercase RFC 1123 labels joined by dots, at most `max_length` characters (63 for a hostname)."""
    return isinstance(value, str) and len(value) <= max_length and all(_NAME.match(label) for label in value.split("."))


def _dns_domain(v: Any) -> str:
    """A DNS name such as cluster.local or k8s.example.org."""
    if not is_dns_name(v):
        raise ValueError
    return v


def _ip(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError
    return str(ipaddress.ip_address(v))


def _cidr(v: Any) -> str:
    if not isinstance(v, str) or "/" not in v:
        raise ValueError
    return str(ipaddress.ip_network(v, strict=True))


def _cidr_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise TypeError
    return tuple(_cidr(x) for x in v)


def _ip_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise TypeError
    return tuple(_ip(x) for x in v)


def _string_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise TypeError
    return tuple(_string(x) for x in v)


def _list_of(check: Callable[[Any], str]) -> Callable[[Any], tuple[str, ...]]:
    def check_all(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise TypeError
        return tuple(check(x) for x in v)
    return check_all


def _version(v: Any) -> str:
    if not isinstance(v, str) or not _VERSION.match(v):
        raise ValueError
    return v


def _talos_version(v: Any) -> str:
    from talos_proxmox.talos_config.machine_config import SUPPORTED_CONTRACTS

    v = _version(v)
    major, minor = (int(x) for x in v.lstrip("v").split(".")[:2])
    if (major, minor) not in SUPPORTED_CONTRACTS:
        raise ValueError
    return v if v.startswith("v") else f"v{v}"


def _kubernetes_version_value(v: Any) -> str:
    """Without a leading "v", as talosctl takes it: v1.31.0 and 1.31.0 are one version, not a change."""
    return _version(v).removeprefix("v")


def _mapping(v: Any) -> dict:
    if not isinstance(v, Mapping):
        raise TypeError
    return dict(v)


def _url_text(v: Any) -> str:
    """A URL as one token: no spaces or control characters, which every URL parser handles differently."""
    if not isinstance(v, str):
        raise TypeError
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f for c in v):
        raise ValueError
    return v


def _endpoint(v: Any) -> str:
    parts = urlsplit(_url_text(v))
    if parts.scheme != "https" or not parts.hostname or parts.port is None:
        raise ValueError
    return v


def _mac(v: Any) -> str:
    """A unicast MAC: the group bit (least significant of the first octet) clear, and not all zeros."""
    if not isinstance(v, str) or not _MAC.match(v.lower()):
        raise ValueError
    mac = v.lower()
    if int(mac[:2], 16) & 1 or mac == "00:00:00:00:00:00":
        raise ValueError
    return mac


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError
        return v
    return check


def _patches(reader: _Reader, raw: Any, path: str) -> tuple[Any, ...]:
    """Talos config patches: each a strategic-merge mapping or an RFC 6902 list of operations."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        reader.fail(path, raw, "is not a list of patches")
        return ()
    for i, patch in enumerate(raw):
        where = f"{path}[{i}]"
        if isinstance(patch, Mapping):
            continue
        if isinstance(patch, list) and patch and all(
            isinstance(op, Mapping) and op.get("op") in _JSON_PATCH_OPS and isinstance(op.get("path"), str)
            for op in patch
        ):
            continue
        reader.fail(where, patch, "is neither a mapping (strategic merge patch) nor a list of JSON patch "
                                  "operations with 'op' and 'path'")
    return tuple(raw)


_JSON_PATCH_OPS = ("add", "remove", "replace", "move", "copy", "test")


# ---------------------------------------------------------------- sections

def _read_network(r: _Reader, raw: Any) -> Optional[NetworkSettings]:
    s = r.section(raw, "network", ("subnet", "gateway", "nameservers", "mtu"))
    subnet = r.value(s, "subnet", "network.subnet", lambda v: ipaddress.ip_network(_cidr(v)),
                     "is not a network in CIDR form (expected e.g. 10.255.200.0/24)")
    gateway = r.value(s, "gateway", "network.gateway", _ip, "is not an IP address (expected e.g. 10.255.200.1)")
    nameservers = r.value(s, "nameservers", "network.nameservers", _ip_list,
                          "is not a non-empty list of IP addresses", default=("9.9.9.9",))
    mtu = r.value(s, "mtu", "network.mtu", _int_in(*_MTU_RANGE), f"is not an MTU in {_MTU_RANGE[0]}-{_MTU_RANGE[1]}", default=None)
    if subnet is not None and gateway is not None:
        if ipaddress.ip_address(gateway) not in subnet:
            r.fail("network.gateway", gateway, f"is outside network.subnet {subnet}")
        elif _is_network_or_broadcast(gateway, subnet):
            r.fail("network.gateway", gateway, f"is the network or broadcast address of {subnet}")
    if subnet is None or gateway is None:
        return None
    return NetworkSettings(subnet=subnet, gateway=gateway, nameservers=nameservers, mtu=mtu)


def _read_proxmox(r: _Reader, raw: Any) -> ProxmoxSettings:
    s = r.section(raw, "proxmox", ("node", "vmDatastore", "isoDatastore", "isoDatastoreShared", "bridge", "cpuType",
                                   "tags"))
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
    )


def _read_image(r: _Reader, raw: Any) -> ImageSettings:
    s = r.section(raw, "image", ("factoryUrl", "platform", "arch", "secureBoot", "schematic"))
    return ImageSettings(
        factory_url=r.value(s, "factoryUrl", "image.factoryUrl", _http_base_url,
                            "is not an http(s) URL with no query or fragment (expected e.g. https://factory.talos.dev)",
                            default="https://factory.talos.dev"),
        platform=r.value(s, "platform", "image.platform", _one_of("metal", "nocloud"),
                         "is not a supported platform (expected metal or nocloud)", default="metal"),
        # The VMs the program creates are x86-64 (QEMU's default machine): an arm64 image cannot boot there.
        arch=r.value(s, "arch", "image.arch", _one_of("amd64"),
                     "is not a supported architecture (expected amd64: the program creates x86-64 Proxmox VMs)",
                     default="amd64"),
        secure_boot=r.value(s, "secureBoot", "image.secureBoot", _bool, "is not true or false", default=False),
        schematic=_read_schematic(r, s.get("schematic")),
    )


def _read_schematic(r: _Reader, raw: Any) -> dict:
    """The Image Factory's own rules, so a typo fails here rather than at the factory."""
    from talos_proxmox.image_factory.images import SchematicError, canonical_schematic

    if raw is None:
        return {"customization": {}}
    try:
        canonical = canonical_schematic(raw)
    except SchematicError as err:
        # The error names the schematic key; quoting the whole schematic would bury it.
        r.report("image.schematic", f"is not a schematic the Image Factory takes: {err}")
        return {"customization": {}}
    extensions = canonical.get("customization", {}).get("systemExtensions", {}).get("officialExtensions", [])
    for i, name in enumerate(extensions):
        if not _EXTENSION.match(name):
            r.fail(f"image.schematic.customization.systemExtensions.officialExtensions[{i}]", name,
                   "is not an extension name (expected owner/name, e.g. siderolabs/qemu-guest-agent)")
    return dict(raw)


def _http_base_url(v: Any) -> str:
    parts = urlsplit(_url_text(v))
    # A query or fragment: the image layer builds paths onto the URL and refuses one (images.iso_url).
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
            or v.endswith(("?", "#")):
        raise ValueError
    return v.rstrip("/")


def _cpu_type(v: Any) -> str:
    if not isinstance(v, str) or not (v in PROVIDER_CPU_TYPES or _CUSTOM_CPU_TYPE.match(v)):
        raise ValueError
    return v


def _read_cluster(r: _Reader, raw: Any) -> dict:
    s = r.section(raw, "cluster", (
        "name", "endpoint", "vip", "talosVersion", "kubernetesVersion", "podSubnets", "serviceSubnets",
        "domain", "installDisk", "kubespan", "discovery", "patches", "rolePatches", "secretsFile",
        "systemDiskEncryption", "deletionProtection", "allowDowngrade"))
    ks = r.section(s.get("kubespan"), "cluster.kubespan", ("enabled", "mtu", "advertiseKubernetesNetworks"))
    role_patches_raw = r.section(s.get("rolePatches"), "cluster.rolePatches", ROLES)
    return dict(
        name=r.value(s, "name", "cluster.name", _dns_label,
                     "is not a cluster name (expected lowercase letters, digits and '-', at most 63)"),
        endpoint=r.value(s, "endpoint", "cluster.endpoint", _endpoint,
                         "is not an endpoint with scheme, host and port (expected e.g. https://10.0.0.10:6443)",
                         default=None),
        vip=r.value(s, "vip", "cluster.vip", _ip, "is not an IP address", default=None),
        talos_version=r.value(s, "talosVersion", "cluster.talosVersion", _talos_version,
                              "is not a supported Talos version (expected v1.12.x, v1.13.x or v1.14.x, e.g. v1.13.7)",
                              default=DEFAULT_TALOS_VERSION),
        kubernetes_version=r.value(s, "kubernetesVersion", "cluster.kubernetesVersion", _kubernetes_version_value,
                                   "is not a Kubernetes version (expected e.g. 1.35.0)", default=None),
        pod_subnets=r.value(s, "podSubnets", "cluster.podSubnets", _cidr_list,
                            "is not a non-empty list of CIDRs", default=("10.244.0.0/16",)),
        service_subnets=r.value(s, "serviceSubnets", "cluster.serviceSubnets", _cidr_list,
                                "is not a non-empty list of CIDRs", default=("10.96.0.0/12",)),
        domain=r.value(s, "domain", "cluster.domain", _dns_domain,
                       "is not a DNS domain (expected lowercase labels of letters, digits and '-', e.g. cluster.local)",
                       default="cluster.local"),
        install_disk=r.value(s, "installDisk", "cluster.installDisk", _device, "is not a device path (expected /dev/...)",
                             default="/dev/sda"),
        kubespan=KubeSpan(
            enabled=r.value(ks, "enabled", "cluster.kubespan.enabled", _bool, "is not true or false", default=False),
            mtu=r.value(ks, "mtu", "cluster.kubespan.mtu", _int_in(*_MTU_RANGE),
                        f"is not an MTU in {_MTU_RANGE[0]}-{_MTU_RANGE[1]}", default=1420),
            advertise_kubernetes_networks=r.value(ks, "advertiseKubernetesNetworks",
                                                  "cluster.kubespan.advertiseKubernetesNetworks", _bool,
                                                  "is not true or false", default=False),
        ),
        discovery=r.value(s, "discovery", "cluster.discovery", _bool, "is not true or false", default=True),
        patches=_patches(r, s.get("patches"), "cluster.patches"),
        role_patches={role: _patches(r, role_patches_raw.get(role), f"cluster.rolePatches.{role}") for role in ROLES},
        secrets_file=r.value(s, "secretsFile", "cluster.secretsFile", _string, "is not a file path", default=None),
        system_disk_encryption=r.value(s, "systemDiskEncryption", "cluster.systemDiskEncryption",
                                       _one_of("none", "tpm"), "is not a disk encryption (expected none or tpm)",
                                       default="none"),
        deletion_protection=r.value(s, "deletionProtection", "cluster.deletionProtection", _bool,
                                    "is not true or false", default=True),
        allow_downgrade=r.value(s, "allowDowngrade", "cluster.allowDowngrade", _bool, "is not true or false",
                                default=False),
    )


def _dns_label(v: Any) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise ValueError
    return v


def _device(v: Any) -> str:
    if not isinstance(v, str) or not v.startswith("/dev/") or len(v) <= 5:
        raise ValueError
    return v


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


def _read_cilium(r: _Reader, raw: Any) -> CiliumSettings:
    s = r.section(raw, "cilium", ("enabled", "version", "repository", "caFile", "values", "loadBalancerAddresses"))
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
    )


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
    s = r.section(raw, "ccm", ("enabled", "chart", "version", "replicas", "controllers", "nodeIpam", "values"))
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
    )


def _read_lifecycle(r: _Reader, raw: Any) -> LifecycleSettings:
    s = r.section(raw, "lifecycle", ("timeoutSeconds", "resetOnDelete", "etcdSnapshots"))
    snap = r.section(s.get("etcdSnapshots"), "lifecycle.etcdSnapshots", ("enabled", "directory", "keep"))
    snapshots = None
    if r.value(snap, "enabled", "lifecycle.etcdSnapshots.enabled", _bool, "is not true or false", default=True):
        snapshots = EtcdSnapshots(
            directory=r.value(snap, "directory", "lifecycle.etcdSnapshots.directory", _string,
                              "is not a directory path", default=EtcdSnapshots.directory),
            keep=r.value(snap, "keep", "lifecycle.etcdSnapshots.keep", _int_in(1, 1000),
                         "is not a number of snapshots to keep (expected 1-1000)", default=EtcdSnapshots.keep))
    return LifecycleSettings(
        etcd_snapshots=snapshots,
        timeout_seconds=r.value(s, "timeoutSeconds", "lifecycle.timeoutSeconds", _int_in(*TIMEOUT_RANGE),
                                _TIMEOUT_EXPECTED,
                                default=DEFAULT_LIFECYCLE_TIMEOUT_SECONDS),
        reset_on_delete=r.value(s, "resetOnDelete", "lifecycle.resetOnDelete", _bool, "is not true or false",
                                default=True),
    )


def _read_health(r: _Reader, raw: Any) -> HealthSettings:
    s = r.section(raw, "health", ("wait", "timeoutSeconds"))
    return HealthSettings(
        wait=r.value(s, "wait", "health.wait", _bool, "is not true or false", default=True),
        timeout_seconds=r.value(s, "timeoutSeconds", "health.timeoutSeconds", _int_in(*TIMEOUT_RANGE),
                                _TIMEOUT_EXPECTED,
                                default=DEFAULT_HEALTH_TIMEOUT_SECONDS),
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


# ---------------------------------------------------------------- whole-stack checks


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


def _check_boot(r: _Reader, cluster: dict, image: ImageSettings) -> None:
    if cluster["system_disk_encryption"] == "tpm" and not image.secure_boot:
        r.report("cluster.systemDiskEncryption", "'tpm' needs image.secureBoot: true (the key is sealed to the "
                                                 "Secure Boot state, PCR 7)")


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
    control_planes = sum(1 for n in nodes if n.role == "controlplane")
    if ccm.enabled and ccm.replicas and control_planes and ccm.replicas > control_planes:
        r.warn("ccm.replicas", ccm.replicas, f"is more than the {control_planes} control planes the CCM runs on; "
                                             "the extra replicas stay Pending")


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
    if cluster["kubespan"].enabled and cluster["kubespan"].mtu is not None and cluster["kubespan"].mtu < 1280:
        r.fail("cluster.kubespan.mtu", cluster["kubespan"].mtu, "is below 1280, the least WireGuard over IPv6 carries")
    cilium = _read_cilium(r, raw.get("cilium"))
    hubble = _read_hubble(r, raw.get("hubble"))
    ccm = _read_ccm(r, raw.get("ccm"))
    health = _read_health(r, raw.get("health"))
    lifecycle = _read_lifecycle(r, raw.get("lifecycle"))
    _check_addons(r, raw, cluster, nodes, cilium, hubble, ccm)
    _check_boot(r, cluster, image)
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
