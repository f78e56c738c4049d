"""Field layout of the Talos v1alpha1 machine configuration document (contract v1.12/v1.13).

Facts taken from siderolabs/talos pkg/machinery/config/types/v1alpha1 at v1.13.7: every struct's
YAML keys in declaration order (Talos re-encodes a patched config in this order), which keys are
lists (`[]`), free-form maps (`{}`) or nested structs (`=Struct`), and which lists a strategic
merge replaces instead of appending (`!replace`). Keys without a struct are scalars or free-form
values (Unstructured, Args values, URLs).

Used to refuse unknown keys (Talos decodes strictly), to order keys like Talos does, and to apply
the merge rules; no Pulumi, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAYOUT = {
    "MachineControllerManagerConfig": "disabled",
    "MachineSchedulerConfig": "disabled",
    "MachineControlPlaneConfig": (
        "controllerManager=MachineControllerManagerConfig "
        "scheduler=MachineSchedulerConfig"
    ),
    "LinuxIDMapping": "containerID hostID size",
    "ExtraMount": (
        "destination type source options[] uidMappings[]=LinuxIDMapping "
        "gidMappings[]=LinuxIDMapping"
    ),
    "KubeletNodeIPConfig": "validSubnets[]",
    "KubeletConfig": (
        "image clusterDNS[] extraArgs{} extraMounts[]=ExtraMount extraConfig "
        "credentialProviderConfig defaultRuntimeSeccompProfileEnabled registerWithFQDN "
        "nodeIP=KubeletNodeIPConfig skipNodeRegistration disableManifestsDirectory"
    ),
    "NetworkDeviceSelector": "busPath hardwareAddr permanentAddr pciID driver physical",
    "Route": "network gateway source metric mtu",
    "Bond": (
        "interfaces[] deviceSelectors[]=NetworkDeviceSelector arpIPTarget[] mode xmitHashPolicy "
        "lacpRate adActorSystem arpValidate arpAllTargets primary primaryReselect failOverMac "
        "adSelect miimon updelay downdelay arpInterval resendIgmp minLinks lpInterval "
        "packetsPerSlave numPeerNotif tlbDynamicLb allSlavesActive useCarrier adActorSysPrio "
        "adUserPortKey peerNotifyDelay"
    ),
    "STP": "enabled",
    "BridgeVLAN": "vlanFiltering",
    "Bridge": "interfaces[] stp=STP vlan=BridgeVLAN",
    "BridgePort": "master",
    "VIPEquinixMetalConfig": "apiToken",
    "VIPHCloudConfig": "apiToken",
    "DeviceVIPConfig": "ip equinixMetal=VIPEquinixMetalConfig hcloud=VIPHCloudConfig",
    "DHCPOptions": "routeMetric ipv4 ipv6 duidv6",
    "Vlan": "addresses[] cidr routes[]=Route dhcp vlanId mtu vip=DeviceVIPConfig dhcpOptions=DHCPOptions",
    "DeviceWireguardPeer": "publicKey endpoint persistentKeepaliveInterval allowedIPs[]",
    "DeviceWireguardConfig": "privateKey listenPort firewallMark peers[]=DeviceWireguardPeer",
    "Device": (
        "interface deviceSelector=NetworkDeviceSelector addresses[] cidr routes[]=Route "
        "bond=Bond bridge=Bridge bridgePort=BridgePort vlans[]=Vlan mtu dhcp ignore dummy "
        "dhcpOptions=DHCPOptions wireguard=DeviceWireguardConfig vip=DeviceVIPConfig"
    ),
    "ExtraHost": "ip aliases[]",
    "KubeSpanFilters": "endpoints[] excludeAdvertisedNetworks[]",
    "NetworkKubeSpan": (
        "enabled advertiseKubernetesNetworks allowDownPeerBypass harvestExtraEndpoints "
        "mtu filters=KubeSpanFilters"
    ),
    "NetworkConfig": (
        "hostname interfaces[]=Device nameservers[] searchDomains[] "
        "extraHostEntries[]=ExtraHost kubespan=NetworkKubeSpan disableSearchDomain"
    ),
    "DiskPartition": "size mountpoint",
    "MachineDisk": "device partitions[]=DiskPartition",
    "InstallDiskSelector": "size name model serial modalias uuid wwid type busPath",
    "InstallExtensionConfig": "image",
    "InstallConfig": (
        "disk diskSelector=InstallDiskSelector extraKernelArgs[] image "
        "extensions[]=InstallExtensionConfig bootloader wipe legacyBIOSSupport "
        "grubUseUKICmdline"
    ),
    "MachineFile": "content permissions path op",
    "TimeConfig": "disabled servers[] bootTimeout",
    "RegistryMirrorConfig": "endpoints[] overridePath skipFallback",
    "RegistryTLSConfig": "clientIdentity ca insecureSkipVerify",
    "RegistryAuthConfig": "username password auth identityToken",
    "RegistryConfig": "tls=RegistryTLSConfig auth=RegistryAuthConfig",
    "RegistriesConfig": "mirrors{}=RegistryMirrorConfig config{}=RegistryConfig",
    "EncryptionKeyStatic": "passphrase",
    "EncryptionKeyKMS": "endpoint",
    "EncryptionKeyTPM": "checkSecurebootStatusOnEnroll",
    "EncryptionKey": "static=EncryptionKeyStatic nodeID kms=EncryptionKeyKMS slot tpm=EncryptionKeyTPM",
    "EncryptionConfig": "provider keys[]=EncryptionKey cipher keySize blockSize options[]",
    "SystemDiskEncryptionConfig": "state=EncryptionConfig ephemeral=EncryptionConfig",
    "KubernetesTalosAPIAccessConfig": "enabled allowedRoles[] allowedKubernetesNamespaces[]",
    "KubePrism": "enabled port",
    "HostDNSConfig": "enabled forwardKubeDNSToHost resolveMemberNames",
    "ImageCacheConfig": "localEnabled",
    "FeaturesConfig": (
        "rbac stableHostname kubernetesTalosAPIAccess=KubernetesTalosAPIAccessConfig "
        "apidCheckExtKeyUsage diskQuotaSupport kubePrism=KubePrism "
        "hostDNS=HostDNSConfig imageCache=ImageCacheConfig nodeAddressSortAlgorithm"
    ),
    "UdevConfig": "rules[]",
    "LoggingDestination": "endpoint format extraTags{}",
    "LoggingConfig": "destinations[]=LoggingDestination",
    "KernelModuleConfig": "name parameters[]",
    "KernelConfig": "modules[]=KernelModuleConfig",
    "MachineSeccompProfile": "name value",
    "MachineConfig": (
        "type token ca=PEMCertificateAndKey acceptedCAs[]=PEMCertificate certSANs[] "
        "controlPlane=MachineControlPlaneConfig kubelet=KubeletConfig pods[] "
        "network=NetworkConfig disks[]=MachineDisk install=InstallConfig "
        "files[]=MachineFile env time=TimeConfig sysctls{} sysfs{} "
        "registries=RegistriesConfig systemDiskEncryption=SystemDiskEncryptionConfig "
        "features=FeaturesConfig udev=UdevConfig logging=LoggingConfig "
        "kernel=KernelConfig seccompProfiles[]=MachineSeccompProfile "
        "baseRuntimeSpecOverrides nodeLabels{} nodeAnnotations{} nodeTaints{}"
    ),
    "ControlPlaneConfig": "endpoint localAPIServerPort",
    "FlannelCNIConfig": "extraArgs[] kubeNetworkPoliciesEnabled",
    "CNIConfig": "name urls[] flannel=FlannelCNIConfig",
    "ClusterNetworkConfig": "cni=CNIConfig dnsDomain podSubnets[]!replace serviceSubnets[]!replace",
    "VolumeMountConfig": "hostPath mountPath readonly",
    "AdmissionPluginConfig": "name configuration",
    "ResourcesConfig": "requests limits",
    "AuthorizationConfigAuthorizerConfig": "type name webhook",
    "APIServerConfig": (
        "image extraArgs{} extraVolumes[]=VolumeMountConfig env certSANs[] "
        "disablePodSecurityPolicy admissionControl[]=AdmissionPluginConfig "
        "auditPolicy!replace resources=ResourcesConfig "
        "authorizationConfig[]=AuthorizationConfigAuthorizerConfig"
    ),
    "ControllerManagerConfig": (
        "image extraArgs{} extraVolumes[]=VolumeMountConfig env "
        "resources=ResourcesConfig"
    ),
    "ProxyConfig": "disabled image mode extraArgs{}",
    "SchedulerConfig": (
        "image extraArgs{} extraVolumes[]=VolumeMountConfig env "
        "resources=ResourcesConfig config"
    ),
    "RegistryKubernetesConfig": "disabled",
    "RegistryServiceConfig": "disabled endpoint",
    "DiscoveryRegistriesConfig": "kubernetes=RegistryKubernetesConfig service=RegistryServiceConfig",
    "ClusterDiscoveryConfig": "enabled registries=DiscoveryRegistriesConfig",
    "EtcdConfig": "image ca=PEMCertificateAndKey extraArgs{} subnet advertisedSubnets[] listenSubnets[]",
    "CoreDNS": "disabled image",
    "ExternalCloudProviderConfig": "enabled manifests[]",
    "ClusterInlineManifest": "name contents",
    "AdminKubeconfigConfig": "certLifetime",
    "ClusterConfig": (
        "id secret controlPlane=ControlPlaneConfig clusterName "
        "network=ClusterNetworkConfig token aescbcEncryptionSecret "
        "secretboxEncryptionSecret ca=PEMCertificateAndKey acceptedCAs[]=PEMCertificate "
        "aggregatorCA=PEMCertificateAndKey serviceAccount=PEMKey "
        "apiServer=APIServerConfig controllerManager=ControllerManagerConfig "
        "proxy=ProxyConfig scheduler=SchedulerConfig discovery=ClusterDiscoveryConfig "
        "etcd=EtcdConfig coreDNS=CoreDNS "
        "externalCloudProvider=ExternalCloudProviderConfig extraManifests[] "
        "extraManifestHeaders{} inlineManifests[]=ClusterInlineManifest "
        "adminKubeconfig=AdminKubeconfigConfig allowSchedulingOnMasters "
        "allowSchedulingOnControlPlanes"
    ),
    "Config": "version debug persist machine=MachineConfig cluster=ClusterConfig",
    "PEMCertificateAndKey": "crt key",
    "PEMCertificate": "crt",
    "PEMKey": "key",
}

ROOT = "Config"


@dataclass(frozen=True)
class Field:
    name: str
    container: str  # "" (scalar or free-form), "[]" (list) or "{}" (map with string keys)
    struct: str | None  # struct of the value (or of the list items / map values)
    replace: bool  # strategic merge replaces the value instead of merging/appending


_TOKEN = re.compile(r"^(\w+)(\[\]|\{\})?(?:=(\w+))?(!replace)?$")


def _parse(layout: dict[str, str]) -> dict[str, dict[str, Field]]:
    structs: dict[str, dict[str, Field]] = {}
    for struct, spec in layout.items():
        fields: dict[str, Field] = {}
        for token in spec.split():
            name, container, ref, replace = _TOKEN.match(token).groups()
            fields[name] = Field(name, container or "", ref, bool(replace))
        structs[struct] = fields
    return structs


STRUCTS = _parse(_LAYOUT)

# Lists whose items a strategic merge matches by key and merges in place (Talos' custom Merge
# methods): struct -> field -> the item keys tried in order; an item matches an existing one when
# the first key it sets is equal (deviceSelector compares the whole selector).
KEYED_LISTS = {
    "NetworkConfig": {"interfaces": ("interface", "deviceSelector")},
    "Device": {"vlans": ("vlanId",)},
    "APIServerConfig": {"admissionControl": ("name",)},
}

# Talos' Args maps (extraArgs) merge key by key, and a key's value (string or list) is replaced.
ARGS_FIELDS = frozenset({"extraArgs"})
