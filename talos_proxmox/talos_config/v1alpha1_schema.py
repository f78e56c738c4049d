"""Field layout of the Talos v1alpha1 machine configuration document (contracts v1.12 to v1.14).

Facts taken from siderolabs/talos pkg/machinery/config/types/v1alpha1 at v1.13.7 (v1.14.0-rc.1 differs in
one tag: cluster.controlPlane became omitempty, which the layout follows; every config of an earlier
contract has it, so they encode the same): every struct's
YAML keys in declaration order (Talos re-encodes a patched config in this order), which keys are
lists (`[]`), free-form maps (`{}`) or nested structs (`=Struct`), and flags: `!r` a strategic
merge replaces the value instead of merging/appending; `!a` always encoded (no omitempty); `!p`
a pointer (an empty value is still encoded); `!s`/`!b`/`!i` a string/bool/integer scalar (so
Go's omitempty drops "", false, 0), `!m` a file mode (an integer Talos writes in octal). Keys without a
struct or kind are free-form values (Unstructured, Args values, URLs, durations).

Used to refuse unknown keys (Talos decodes strictly), to order keys like Talos does, and to apply
the merge rules; no Pulumi, no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_LAYOUT = {
    "MachineControllerManagerConfig": "disabled!p!b",
    "MachineSchedulerConfig": "disabled!p!b",
    "MachineControlPlaneConfig": (
        "controllerManager=MachineControllerManagerConfig!p "
        "scheduler=MachineSchedulerConfig!p"
    ),
    "LinuxIDMapping": "containerID!a!i hostID!a!i size!a!i",
    "ExtraMount": (
        "destination!a!s type!s source!s options[] uidMappings[]=LinuxIDMapping "
        "gidMappings[]=LinuxIDMapping"
    ),
    "KubeletNodeIPConfig": "validSubnets[]",
    "KubeletConfig": (
        "image!s clusterDNS[] extraArgs{} extraMounts[]=ExtraMount extraConfig "
        "credentialProviderConfig defaultRuntimeSeccompProfileEnabled!p!b "
        "registerWithFQDN!p!b nodeIP=KubeletNodeIPConfig!p skipNodeRegistration!p!b "
        "disableManifestsDirectory!p!b"
    ),
    "NetworkDeviceSelector": "busPath!s hardwareAddr!s permanentAddr!s pciID!s driver!s physical!p!b",
    "Route": "network!a!s gateway!a!s source!s metric!i mtu!i",
    "Bond": (
        "interfaces[]!a deviceSelectors[]=NetworkDeviceSelector arpIPTarget[] mode!a!s "
        "xmitHashPolicy!s lacpRate!s adActorSystem!s arpValidate!s arpAllTargets!s primary!s "
        "primaryReselect!s failOverMac!s adSelect!s miimon!i updelay!i downdelay!i arpInterval!i "
        "resendIgmp!i minLinks!i lpInterval!i packetsPerSlave!i numPeerNotif!i tlbDynamicLb!i "
        "allSlavesActive!i useCarrier!p!b adActorSysPrio!i adUserPortKey!i peerNotifyDelay!i"
    ),
    "STP": "enabled!p!b",
    "BridgeVLAN": "vlanFiltering!p!b",
    "Bridge": "interfaces[]!a stp=STP!p vlan=BridgeVLAN!p",
    "BridgePort": "master!s",
    "VIPEquinixMetalConfig": "apiToken!a!s",
    "VIPHCloudConfig": "apiToken!a!s",
    "DeviceVIPConfig": "ip!s equinixMetal=VIPEquinixMetalConfig!p hcloud=VIPHCloudConfig!p",
    "DHCPOptions": "routeMetric!a!i ipv4!p!b ipv6!p!b duidv6!s",
    "Vlan": (
        "addresses[] cidr!s routes[]=Route!a dhcp!p!b vlanId!a!i mtu!i vip=DeviceVIPConfig!p "
        "dhcpOptions=DHCPOptions!p"
    ),
    "DeviceWireguardPeer": "publicKey!s endpoint!s persistentKeepaliveInterval allowedIPs[]",
    "DeviceWireguardConfig": "privateKey!s listenPort!i firewallMark!i peers[]=DeviceWireguardPeer",
    "Device": (
        "interface!s deviceSelector=NetworkDeviceSelector!p addresses[] cidr!s routes[]=Route "
        "bond=Bond!p bridge=Bridge!p bridgePort=BridgePort!p vlans[]=Vlan mtu!i dhcp!p!b "
        "ignore!p!b dummy!p!b dhcpOptions=DHCPOptions!p wireguard=DeviceWireguardConfig!p "
        "vip=DeviceVIPConfig!p"
    ),
    "ExtraHost": "ip!a!s aliases[]!a",
    "KubeSpanFilters": "endpoints[] excludeAdvertisedNetworks[]",
    "NetworkKubeSpan": (
        "enabled!p!b advertiseKubernetesNetworks!p!b allowDownPeerBypass!p!b "
        "harvestExtraEndpoints!p!b mtu!p!i filters=KubeSpanFilters!p"
    ),
    "NetworkConfig": (
        "hostname!s interfaces[]=Device nameservers[] searchDomains[] "
        "extraHostEntries[]=ExtraHost kubespan=NetworkKubeSpan!p disableSearchDomain!p!b"
    ),
    "DiskPartition": "size!i mountpoint!s",
    "MachineDisk": "device!s partitions[]=DiskPartition",
    "InstallDiskSelector": "size!p name!s model!s serial!s modalias!s uuid!s wwid!s type!s busPath!s",
    "InstallExtensionConfig": "image!a!s",
    "InstallConfig": (
        "disk!s diskSelector=InstallDiskSelector!p extraKernelArgs[] image!s "
        "extensions[]=InstallExtensionConfig bootloader!p!b wipe!a!p!b "
        "legacyBIOSSupport!p!b grubUseUKICmdline!p!b"
    ),
    "MachineFile": "content!a!s permissions!a!m path!a!s op!a!s",
    "TimeConfig": "disabled!p!b servers[] bootTimeout",
    "RegistryMirrorConfig": "endpoints[]!a overridePath!p!b skipFallback!p!b",
    "RegistryTLSConfig": "clientIdentity!p ca insecureSkipVerify!p!b",
    "RegistryAuthConfig": "username!s password!s auth!s identityToken!s",
    "RegistryConfig": "tls=RegistryTLSConfig!p auth=RegistryAuthConfig!p",
    "RegistriesConfig": "mirrors{}=RegistryMirrorConfig config{}=RegistryConfig",
    "EncryptionKeyStatic": "passphrase!s",
    "EncryptionKeyKMS": "endpoint!a!s",
    "EncryptionKeyTPM": "checkSecurebootStatusOnEnroll!p!b",
    "EncryptionKey": (
        "static=EncryptionKeyStatic!p nodeID!p kms=EncryptionKeyKMS!p slot!a!i "
        "tpm=EncryptionKeyTPM!p"
    ),
    "EncryptionConfig": "provider!a!s keys[]=EncryptionKey!a cipher!s keySize!i blockSize!i options[]",
    "SystemDiskEncryptionConfig": "state=EncryptionConfig!p ephemeral=EncryptionConfig!p",
    "KubernetesTalosAPIAccessConfig": "enabled!p!b allowedRoles[] allowedKubernetesNamespaces[]",
    "KubePrism": "enabled!p!b port!i",
    "HostDNSConfig": "enabled!p!b forwardKubeDNSToHost!p!b resolveMemberNames!p!b",
    "ImageCacheConfig": "localEnabled!p!b",
    "FeaturesConfig": (
        "rbac!p!b stableHostname!p!b "
        "kubernetesTalosAPIAccess=KubernetesTalosAPIAccessConfig!p "
        "apidCheckExtKeyUsage!p!b diskQuotaSupport!p!b kubePrism=KubePrism!p "
        "hostDNS=HostDNSConfig!p imageCache=ImageCacheConfig!p "
        "nodeAddressSortAlgorithm!s"
    ),
    "UdevConfig": "rules[]",
    "LoggingDestination": "endpoint!a!p format!a!s extraTags{}",
    "LoggingConfig": "destinations[]=LoggingDestination!a",
    "KernelModuleConfig": "name!a!s parameters[]",
    "KernelConfig": "modules[]=KernelModuleConfig",
    "MachineSeccompProfile": "name!a!s value!a",
    "MachineConfig": (
        "type!a!s token!a!s ca=PEMCertificateAndKey!p acceptedCAs[]=PEMCertificate "
        "certSANs[]!a controlPlane=MachineControlPlaneConfig!p kubelet=KubeletConfig!p "
        "pods[] network=NetworkConfig!p disks[]=MachineDisk install=InstallConfig!p "
        "files[]=MachineFile env time=TimeConfig!p sysctls{} sysfs{} "
        "registries=RegistriesConfig systemDiskEncryption=SystemDiskEncryptionConfig!p "
        "features=FeaturesConfig!p udev=UdevConfig!p logging=LoggingConfig!p "
        "kernel=KernelConfig!p seccompProfiles[]=MachineSeccompProfile "
        "baseRuntimeSpecOverrides nodeLabels{} nodeAnnotations{} nodeTaints{}"
    ),
    "ControlPlaneConfig": "endpoint!a!p localAPIServerPort!i",
    "FlannelCNIConfig": "extraArgs[] kubeNetworkPoliciesEnabled!p!b",
    "CNIConfig": "name!s urls[] flannel=FlannelCNIConfig!p",
    "ClusterNetworkConfig": "cni=CNIConfig!p dnsDomain!a!s podSubnets[]!r!a serviceSubnets[]!r!a",
    "VolumeMountConfig": "hostPath!a!s mountPath!a!s readonly!b",
    "AdmissionPluginConfig": "name!a!s configuration!a",
    "ResourcesConfig": "requests limits",
    "AuthorizationConfigAuthorizerConfig": "type!a!s name!a!s webhook",
    "APIServerConfig": (
        "image!s extraArgs{} extraVolumes[]=VolumeMountConfig env certSANs[] "
        "disablePodSecurityPolicy!p!b admissionControl[]=AdmissionPluginConfig "
        "auditPolicy!r resources=ResourcesConfig!p "
        "authorizationConfig[]=AuthorizationConfigAuthorizerConfig"
    ),
    "ControllerManagerConfig": (
        "image!s extraArgs{} extraVolumes[]=VolumeMountConfig env "
        "resources=ResourcesConfig!p"
    ),
    "ProxyConfig": "disabled!p!b image!s mode!s extraArgs{}",
    "SchedulerConfig": (
        "image!s extraArgs{} extraVolumes[]=VolumeMountConfig env "
        "resources=ResourcesConfig!p config"
    ),
    "RegistryKubernetesConfig": "disabled!p!b",
    "RegistryServiceConfig": "disabled!p!b endpoint!s",
    "DiscoveryRegistriesConfig": "kubernetes=RegistryKubernetesConfig!a service=RegistryServiceConfig!a",
    "ClusterDiscoveryConfig": "enabled!p!b registries=DiscoveryRegistriesConfig!a",
    "EtcdConfig": (
        "image!s ca=PEMCertificateAndKey!a!p extraArgs{} subnet!s advertisedSubnets[] "
        "listenSubnets[]"
    ),
    "CoreDNS": "disabled!p!b image!s",
    "ExternalCloudProviderConfig": "enabled!p!b manifests[]",
    "ClusterInlineManifest": "name!a!s contents!a!s",
    "AdminKubeconfigConfig": "certLifetime",
    "ClusterConfig": (
        "id!s secret!s controlPlane=ControlPlaneConfig!p clusterName!s "
        "network=ClusterNetworkConfig!p token!s aescbcEncryptionSecret!s "
        "secretboxEncryptionSecret!s ca=PEMCertificateAndKey!p "
        "acceptedCAs[]=PEMCertificate aggregatorCA=PEMCertificateAndKey!p "
        "serviceAccount=PEMKey!p apiServer=APIServerConfig!p "
        "controllerManager=ControllerManagerConfig!p proxy=ProxyConfig!p "
        "scheduler=SchedulerConfig!p discovery=ClusterDiscoveryConfig!p "
        "etcd=EtcdConfig!p coreDNS=CoreDNS!p "
        "externalCloudProvider=ExternalCloudProviderConfig!p extraManifests[] "
        "extraManifestHeaders{} inlineManifests[]=ClusterInlineManifest "
        "adminKubeconfig=AdminKubeconfigConfig!p allowSchedulingOnMasters!p!b "
        "allowSchedulingOnControlPlanes!p!b"
    ),
    "Config": "version!a!s debug!p!b persist!p!b machine=MachineConfig!a!p cluster=ClusterConfig!a!p",
    "PEMCertificateAndKey": "crt!a!s key!a!s",
    "PEMCertificate": "crt!a!s",
    "PEMKey": "key!a!s",
}

ROOT = "Config"

# Other documents' merge rules (siderolabs/talos v1.13.7 and v1.14.0-rc.1 pkg/machinery/config/types, the
# `merge:"replace"` tags and custom merges): only the fields whose strategic merge is not the default.
# Partial on purpose: used for merging, never to validate.
_OTHER_DOCUMENTS_LAYOUT = {
    "ExtensionServiceConfig": "configFiles[]",
    "NetworkRuleConfig": "portSelector=RulePortSelector ingress[]!r",
    "RulePortSelector": "ports[]!r",
    "KubeNetworkConfig": "podSubnets[]!r serviceSubnets[]!r",
    "KubeAuditPolicyConfig": "configuration!r",
    "KubeAuthenticationConfig": "configuration!r",
    "KubeCredentialProviderConfig": "configuration!r",
    "KubeStaticPodConfig": "pod!r",
}
# document kind -> struct holding its merge rules
DOCUMENT_MERGE_STRUCTS = {kind: kind for kind in _OTHER_DOCUMENTS_LAYOUT if kind != "RulePortSelector"}


@dataclass(frozen=True)
class Field:
    name: str
    container: str  # "" (scalar or free-form), "[]" (list) or "{}" (map with string keys)
    struct: str | None  # struct of the value (or of the list items / map values)
    replace: bool  # strategic merge replaces the value instead of merging/appending
    always: bool = False  # encoded even when empty (no omitempty)
    pointer: bool = False  # nil-able: an empty value is still a value
    scalar: str = ""  # "s", "b", "i", "m" for string/bool/integer/file-mode scalars, "" otherwise


_TOKEN = re.compile(r"^(\w+)(\[\]|\{\})?(?:=(\w+))?((?:![rapsbim])*)$")


def _parse(layout: dict[str, str]) -> dict[str, dict[str, Field]]:
    structs: dict[str, dict[str, Field]] = {}
    for struct, spec in layout.items():
        fields: dict[str, Field] = {}
        for token in spec.split():
            name, container, ref, flags = _TOKEN.match(token).groups()
            flags = set(flags.split("!")) - {""}
            scalar = next((k for k in ("s", "b", "i", "m") if k in flags), "")
            fields[name] = Field(name, container or "", ref, "r" in flags, "a" in flags, "p" in flags, scalar)
        structs[struct] = fields
    return structs


STRUCTS = _parse(_LAYOUT)
MERGE_STRUCTS = {**STRUCTS, **_parse(_OTHER_DOCUMENTS_LAYOUT)}

# Lists whose items a strategic merge matches by key and merges in place (Talos' custom Merge
# methods): struct -> field -> the item keys tried in order; an item matches an existing one when
# the first key it sets is equal (deviceSelector compares the whole selector).
KEYED_LISTS = {
    "NetworkConfig": {"interfaces": ("interface", "deviceSelector")},
    "Device": {"vlans": ("vlanId",)},
    "APIServerConfig": {"admissionControl": ("name",)},
    "ExtensionServiceConfig": {"configFiles": ("mountPath",)},
}

# Talos' Args maps (extraArgs) merge key by key, and a key's value (string or list) is replaced.
ARGS_FIELDS = frozenset({"extraArgs"})

# Talos trims leading whitespace other than spaces from inline manifest contents when it reads them.
INLINE_MANIFEST_TRIM = "\t\n\v\f\r"
