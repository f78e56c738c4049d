"""The typed settings a stack loads into, their bounds and defaults, and SettingsError. No Pulumi here."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional


PROJECT = "talos-proxmox"


ROLES = ("controlplane", "worker")


TOP_LEVEL_KEYS = ("cluster", "network", "proxmox", "image", "nodes", "cilium", "hubble", "ccm", "csi", "backups",
                  "health", "lifecycle")


# Bounds no Proxmox host gives beyond: QEMU's vCPU limit, PVE's 4 TiB memory maximum, and 64 TiB disks.
CPU_RANGE = (1, 512)


MEMORY_MIB_RANGE = (1024, 4 * 1024 * 1024)  # Talos's minimum for any node is 1 GiB


DISK_GB_RANGE = (10, 64 * 1024)  # Talos's minimum system disk is 10 GB


TIMEOUT_RANGE = (1, 86400)  # a day: anything longer is a typo, and a hung step must end


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
                       "cilium-load-balancer.yaml", "talos-ccm-values.yaml", "proxmox-csi-values.yaml",
                       "proxmox-ccm-values.yaml")


DEFAULT_TALOS_VERSION = "v1.13.7"


DEFAULT_CILIUM_VERSION = "1.19.6"


# What `talosctl gen config` of each Talos release line picks when no Kubernetes version is given
# (pkg/machinery/constants DefaultKubernetesVersion at v1.12.0, v1.13.7 and v1.14.1). A line's later patch
# releases pick newer patch versions; ours move deliberately, since a new default rolls Kubernetes on
# every cluster that does not pin it (tests/unit/talos_config/test_talos_oracle.py holds both).
DEFAULT_KUBERNETES_VERSIONS = {"v1.12": "1.35.0", "v1.13": "1.36.2", "v1.14": "1.37.0"}


# siderolabs/talos-cloud-controller-manager charts/: chart 0.5.4 ships CCM v1.12.0.
DEFAULT_CCM_CHART_VERSION = "0.5.4"


# sergelogvinov/proxmox-csi-plugin and proxmox-cloud-controller-manager: the charts in ../shared/charts.
DEFAULT_CSI_CHART = "oci://ghcr.io/sergelogvinov/charts/proxmox-csi-plugin"
DEFAULT_CSI_CHART_VERSION = "0.5.9"
DEFAULT_PROXMOX_CCM_CHART = "oci://ghcr.io/sergelogvinov/charts/proxmox-cloud-controller-manager"
DEFAULT_PROXMOX_CCM_CHART_VERSION = "0.2.27"


# Who puts the topology labels (region: the Proxmox cluster, zone: the node's Proxmox host) on the nodes.
TOPOLOGY_LABEL_SOURCES = ("talos-ccm", "proxmox-ccm")


DEFAULT_HEALTH_TIMEOUT_SECONDS = 600


DEFAULT_RELEASE_TIMEOUT_SECONDS = 600  # one Helm install or upgrade, image pulls included
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
    # An etcd snapshot file the cluster's bootstrap recovers etcd from (all control planes lost).
    recover_from: Optional[str] = None
    recover_from_sha256: Optional[str] = None  # of that file, read when the stack loads
    # The age identities that decrypt an encrypted snapshot: a local file, read only when recovering.
    recover_identity_file: Optional[str] = None


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
    # Datastores besides vm_datastore that every Proxmox host of the stack has (for csi.storageClasses).
    datastores: tuple[str, ...] = ()


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
    # Seconds Helm waits for the release's workloads (helm --timeout); a fresh cluster pulls every image.
    timeout_seconds: int = DEFAULT_RELEASE_TIMEOUT_SECONDS


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
    timeout_seconds: int = DEFAULT_RELEASE_TIMEOUT_SECONDS  # as CiliumSettings.timeout_seconds


@dataclass(frozen=True)
class StorageClassSettings:
    """A StorageClass of the Proxmox CSI plugin: volumes are disks on `datastore`, attached to the node's VM."""
    name: str
    datastore: str
    reclaim_policy: str = "Delete"
    fs_type: str = "ext4"
    cache: Optional[str] = None  # PVE's disk cache mode; None: the datastore's default
    ssd: bool = False
    default: bool = False  # the cluster's default StorageClass


@dataclass(frozen=True)
class CsiSettings:
    """The Proxmox CSI plugin (off by default) and who labels the nodes with their Proxmox region and zone."""
    enabled: bool = False
    chart: str = DEFAULT_CSI_CHART
    version: str = DEFAULT_CSI_CHART_VERSION
    region: str = ""  # the Proxmox cluster's name, as topology.kubernetes.io/region
    topology_labels: str = "talos-ccm"
    proxmox_ccm_chart: str = DEFAULT_PROXMOX_CCM_CHART
    proxmox_ccm_version: str = DEFAULT_PROXMOX_CCM_CHART_VERSION
    storage_classes: tuple[StorageClassSettings, ...] = ()
    values: Mapping[str, Any] = field(default_factory=dict)
    timeout_seconds: int = DEFAULT_RELEASE_TIMEOUT_SECONDS


# Sidero Labs' talos-backup: the last tagged release (main has since dropped USE_PATH_STYLE).
DEFAULT_TALOS_BACKUP_IMAGE = "ghcr.io/siderolabs/talos-backup:v0.1.0-beta.3"


@dataclass(frozen=True)
class BackupSettings:
    """etcd snapshots on a schedule, age-encrypted, to an S3-compatible bucket (off by default). The
    credentials are Pulumi secrets; the age identity that decrypts never reaches the program."""
    enabled: bool = False
    schedule: str = "0 */6 * * *"
    bucket: str = ""
    endpoint: Optional[str] = None  # None: AWS S3 in `region`
    region: str = "us-east-1"
    path_style: bool = True
    prefix: Optional[str] = None  # object key prefix; None: the cluster's name
    access_key_id: str = field(default="", repr=False)
    secret_access_key: str = field(default="", repr=False)
    age_recipient: str = ""
    image: str = DEFAULT_TALOS_BACKUP_IMAGE
    retention_days: Optional[int] = None  # the bucket's lifecycle rule expires the prefix's objects; None: kept


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
    csi: CsiSettings = field(default=CsiSettings())
    backups: BackupSettings = field(default=BackupSettings())
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
