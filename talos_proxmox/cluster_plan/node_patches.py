"""The Talos config patches one node gets, derived from the typed stack settings.

The order is what a person running `talosctl gen config` + `--config-patch` would use: settings the
program derives (install, cluster network, KubeSpan, CNI, CCM, node network, disks), then the stack's
free-form patches: cluster-wide, per role, per node, so a user's patch always has the last word.
No Pulumi import: the same list feeds `pulumi up` and the offline render command.
"""

from __future__ import annotations

from typing import Any

from talos_proxmox.cluster_plan.backup_values import talos_api_access
from talos_proxmox.settings.model import NodeSettings, Settings
from talos_proxmox.talos_config.machine_config import MULTIDOC_KUBERNETES, parse_talos_version

# What the Talos CCM needs from every kubelet (see the CCM seed).
CCM_KUBELET_ARGS = {"cloud-provider": "external", "rotate-server-certificates": "true"}


def _document(kind: str, **fields: Any) -> dict:
    return {"apiVersion": "v1alpha1", "kind": kind, **fields}


def multidoc(settings: Settings) -> bool:
    """Whether the node's contract writes each Kubernetes setting as a document of its own (v1.14 on)."""
    return parse_talos_version(settings.cluster.talos_version)[0] >= MULTIDOC_KUBERNETES


def install_patch(settings: Settings, installer_image: str) -> dict:
    """The install disk and image; from v1.14 an UnattendedInstallConfig, as `gen config --install-disk` writes."""
    disk = settings.cluster.install_disk
    if multidoc(settings):
        return _document("UnattendedInstallConfig", installer={"image": installer_image},
                         provisioning={"diskSelector": {"match": f'disk.dev_path == "{disk}"'}, "wipe": False})
    return {"machine": {"install": {"disk": disk, "image": installer_image}}}


def cluster_network_patch(settings: Settings) -> dict:
    """Subnets and domain: the v1alpha1 document's cluster.network, from v1.14 the KubeNetworkConfig document.
    A strategic merge, as every derived patch (talosctl refuses RFC 6902 patches on the multi-document configs
    `gen config` writes); Talos replaces podSubnets and serviceSubnets on merge (`merge:"replace"`), so the
    stack's lists take the defaults' place."""
    c = settings.cluster
    network = {"dnsDomain": c.domain, "podSubnets": list(c.pod_subnets), "serviceSubnets": list(c.service_subnets)}
    if multidoc(settings):
        return _document("KubeNetworkConfig", **network)
    return {"cluster": {"network": network}}


def cluster_features_patch(settings: Settings, role: str) -> list[dict]:
    """Discovery, and what Cilium's kube-proxy replacement needs: no default CNI, no kube-proxy. From v1.14
    only control planes carry the CNI and kube-proxy documents (they deploy both)."""
    c = settings.cluster
    if not multidoc(settings):
        cluster: dict[str, Any] = {"discovery": {"enabled": c.discovery}}
        if settings.cilium.enabled:
            cluster["network"] = {"cni": {"name": "none"}}
            cluster["proxy"] = {"disabled": True}
        return [{"cluster": cluster}]
    patches = []
    if not c.discovery:
        patches.append(_document("DiscoveryServiceConfig", name="default", **{"$patch": "delete"}))
    if settings.cilium.enabled and role == "controlplane":
        patches.append(_document("KubeFlannelCNIConfig", **{"$patch": "delete"}))
        patches.append(_document("KubeProxyConfig", enabled=False))
    return patches


def kubespan_patch(settings: Settings) -> dict | None:
    """KubeSpan in the form of the node's contract: its own KubeSpanConfig document from v1.13, which
    leaves `machine.network.kubespan` out of its schema; under v1.12 that field, the only form there is."""
    kubespan = settings.cluster.kubespan
    if not kubespan.enabled:
        return None
    fields = {"enabled": True, "mtu": kubespan.mtu, "advertiseKubernetesNetworks": kubespan.advertise_kubernetes_networks}
    if parse_talos_version(settings.cluster.talos_version)[0] >= (1, 13):
        return {"apiVersion": "v1alpha1", "kind": "KubeSpanConfig", **fields}
    return {"machine": {"network": {"kubespan": fields}}}


# With the CCM allocating pod CIDRs, kube-controller-manager must stop doing it too (CCM docs).
KCM_CONTROLLERS_WITHOUT_NODE_IPAM = "*,tokencleaner,-node-ipam-controller"


def ccm_patches(settings: Settings, role: str) -> list[dict]:
    """The CCM's kubelet arguments on every node and, with its node IPAM, kube-controller-manager without
    its own on control planes."""
    node_ipam = settings.ccm.node_ipam is not None and role == "controlplane"
    if not multidoc(settings):
        return [ccm_patch(node_ipam)]
    patches = [_document("KubeletConfig", extraArgs=dict(CCM_KUBELET_ARGS))]
    if node_ipam:
        patches.append(_document("KubeControllerManagerConfig",
                                 extraArgs={"controllers": KCM_CONTROLLERS_WITHOUT_NODE_IPAM}))
    return patches


def ccm_patch(node_ipam: bool) -> dict:
    patch: dict[str, Any] = {"machine": {"kubelet": {"extraArgs": dict(CCM_KUBELET_ARGS)}}}
    if node_ipam:
        patch["cluster"] = {"controllerManager": {"extraArgs": {"controllers": KCM_CONTROLLERS_WITHOUT_NODE_IPAM}}}
    return patch


def talos_api_access_patches(settings: Settings, role: str) -> list[dict]:
    """The Talos API access a control plane grants the cluster's workloads (the CCM, talos-backup)."""
    access = talos_api_access(settings)
    if access is None or role != "controlplane":
        return []
    if multidoc(settings):  # the document is the switch
        return [_document("KubeTalosAPIAccessConfig", **{k: list(v) for k, v in access.items() if k != "enabled"})]
    return [{"machine": {"features": {"kubernetesTalosAPIAccess": access}}}]


LINK_ALIAS = "net0"  # the node's one NIC, found by MAC, under a name no kernel gives an interface


def node_network_patch(node: NodeSettings, vip: str | None) -> list[dict]:
    """The node's static network as the network documents of contracts v1.12 and v1.13 (which mark
    `machine.network.interfaces` and `nameservers` deprecated): the NIC aliased by its MAC (stable
    whatever order the NICs appear in), its address, default route and MTU, the nameservers, and the
    control planes' shared VIP on it. A link with a LinkConfig gets no default DHCP."""
    link: dict[str, Any] = {"apiVersion": "v1alpha1", "kind": "LinkConfig", "name": LINK_ALIAS, "up": True}
    if node.mtu is not None:
        link["mtu"] = node.mtu
    link["addresses"] = [{"address": node.address}]
    link["routes"] = [{"gateway": node.gateway}]  # no destination: the default route of the gateway's family
    documents = [
        {"apiVersion": "v1alpha1", "kind": "LinkAliasConfig", "name": LINK_ALIAS,
         "selector": {"match": f'mac(link.permanent_addr) == "{node.mac}"'}},
        link,
        {"apiVersion": "v1alpha1", "kind": "ResolverConfig",
         "nameservers": [{"address": nameserver} for nameserver in node.nameservers]},
    ]
    if vip is not None and node.role == "controlplane":
        documents.append({"apiVersion": "v1alpha1", "kind": "Layer2VIPConfig", "name": vip, "link": LINK_ALIAS})
    return documents


def hostname_patch(node: NodeSettings) -> dict:
    """The stack's node name as hostname, so `kubectl get nodes` shows the names the stack uses.

    Since v1.12 the hostname lives in a HostnameConfig document, which `gen config` writes with
    `auto: stable`; Talos refuses `auto` and `hostname` together, so the patch drops `auto`.
    """
    return {"apiVersion": "v1alpha1", "kind": "HostnameConfig", "auto": {"$patch": "delete"}, "hostname": node.name}


def node_storage_patches(settings: Settings, node: NodeSettings) -> list[dict]:
    """Kernel modules and the data disk. From v1.14 a KernelModuleConfig per module and the data disk as a
    UserVolumeConfig (Talos mounts it at /var/mnt/<name>, which the kubelet sees; the v1.14 KubeletConfig has
    no extra mounts); before, machine.kernel and machine.disks with the mount shared into the kubelet."""
    if not multidoc(settings):
        legacy = node_storage_patch(node)
        return [] if legacy is None else [legacy]
    patches = [_document("KernelModuleConfig", name=module) for module in node.kernel_modules]
    if node.data_disk is not None:
        d = node.data_disk
        patches.append(_document("UserVolumeConfig", name=user_volume_name(d.mountpoint), provisioning={
            "diskSelector": {"match": f'disk.dev_path == "{d.device}"'}, "minSize": f"{d.size_gb}GB"}))
    return patches


USER_VOLUME_ROOT = "/var/mnt/"  # where Talos mounts a user volume: /var/mnt/<its name>


def user_volume_name(mountpoint: str) -> str:
    return mountpoint.removeprefix(USER_VOLUME_ROOT)


def node_storage_patch(node: NodeSettings) -> dict | None:
    """Kernel modules and the data disk, mounted and shared into the kubelet (Longhorn-style)."""
    machine: dict[str, Any] = {}
    if node.kernel_modules:
        machine["kernel"] = {"modules": [{"name": m} for m in node.kernel_modules]}
    if node.data_disk is not None:
        d = node.data_disk
        machine["disks"] = [{"device": d.device, "partitions": [{"mountpoint": d.mountpoint}]}]
        machine["kubelet"] = {"extraMounts": [{
            "destination": d.mountpoint,
            "type": "bind",
            "source": d.mountpoint,
            "options": ["bind", "rshared", "rw"],
        }]}
    return {"machine": machine} if machine else None


DERIVED = "derived"  # the label of every patch the program makes from typed settings


def labeled_node_patches(settings: Settings, node: NodeSettings, installer_image: str) -> list[tuple[str, Any]]:
    """Every patch for `node`, in the order they apply, each with the stack key that holds it
    (`cluster.patches[0]`, `cluster.rolePatches.worker[1]`, `nodes[3].patches[0]`) or DERIVED."""
    derived: list[Any] = [
        install_patch(settings, installer_image),
        cluster_network_patch(settings),
        *cluster_features_patch(settings, node.role),
    ]
    kubespan = kubespan_patch(settings)
    if kubespan is not None:
        derived.append(kubespan)
    if settings.ccm.enabled:
        derived.extend(ccm_patches(settings, node.role))
    derived.extend(talos_api_access_patches(settings, node.role))
    derived.extend(node_network_patch(node, settings.cluster.vip))
    derived.append(hostname_patch(node))
    derived.extend(node_storage_patches(settings, node))
    derived.extend(disk_encryption_patches(settings.cluster.system_disk_encryption))
    index = next((i for i, n in enumerate(settings.nodes) if n.name == node.name), None)
    where = f"nodes[{index}]" if index is not None else f"node {node.name}"
    return [
        *((DERIVED, p) for p in derived),
        *((f"cluster.patches[{i}]", p) for i, p in enumerate(settings.cluster.patches)),
        *((f"cluster.rolePatches.{node.role}[{i}]", p)
          for i, p in enumerate(settings.cluster.role_patches.get(node.role, ()))),
        *((f"{where}.patches[{i}]", p) for i, p in enumerate(node.patches)),
    ]


# Talos's system volumes; with TPM encryption each is LUKS2 with a key sealed to the TPM, enrolled only
# when Secure Boot is on (the seal is bound to PCR 7, so enrolling without it would lock the disk later).
ENCRYPTED_SYSTEM_VOLUMES = ("STATE", "EPHEMERAL")


def disk_encryption_patches(encryption: str) -> list[dict]:
    """One VolumeConfig document per system volume (the v1.12+ form of machine.systemDiskEncryption)."""
    if encryption != "tpm":
        return []
    return [{
        "apiVersion": "v1alpha1", "kind": "VolumeConfig", "name": volume,
        "encryption": {"provider": "luks2", "keys": [{"slot": 0, "tpm": {"checkSecurebootStatusOnEnroll": True}}]},
    } for volume in ENCRYPTED_SYSTEM_VOLUMES]


def node_patches(settings: Settings, node: NodeSettings, installer_image: str) -> list[Any]:
    """Every patch for `node`, in the order they apply."""
    return [patch for _, patch in labeled_node_patches(settings, node, installer_image)]
