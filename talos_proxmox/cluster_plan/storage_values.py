"""What the Proxmox CSI plugin (and, when the stack picks it, the Proxmox CCM) is given: the Proxmox role each
runs as, its config file, its Helm values, and the topology labels the nodes carry. No Pulumi here.

Facts from the charts in ../shared/charts (proxmox-csi-plugin 0.5.9, proxmox-cloud-controller-manager
0.2.27) and the plugins' install docs:
- the plugin places a volume by the node's `topology.kubernetes.io/region` (equal to its config's `region`)
  and `topology.kubernetes.io/zone` (the Proxmox host); a node without both never registers with it;
- its node DaemonSet is privileged, which Talos's default Pod Security (baseline) refuses outside
  kube-system: its namespace is labelled `privileged`;
- only the controller reads the config (a Secret of ours, `existingConfigSecret`), so only it holds the token.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import yaml

from talos_proxmox.settings.model import Settings, StorageClassSettings
from talos_proxmox.talos_config.merge import deep_merge

CSI_NAMESPACE = "csi-proxmox"
CSI_RELEASE = "proxmox-csi-plugin"
CSI_CONFIG_SECRET = "proxmox-csi-plugin-config"
PROXMOX_CCM_NAMESPACE = "kube-system"
PROXMOX_CCM_RELEASE = "proxmox-cloud-controller-manager"
PROXMOX_CCM_CONFIG_SECRET = "proxmox-cloud-controller-manager-config"
CONFIG_KEY = "config.yaml"  # the charts' default `existingConfigSecretKey`

DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"

# Pod Security labels of the plugin's namespace, as the chart's own namespace template sets them.
PRIVILEGED_NAMESPACE_LABELS = {
    "pod-security.kubernetes.io/enforce": "privileged",
    "pod-security.kubernetes.io/audit": "baseline",
    "pod-security.kubernetes.io/warn": "baseline",
}

# The privileges each plugin's Proxmox role holds, on `/` (the plugins' install docs): the CSI plugin makes,
# attaches, resizes and deletes disks; the Proxmox CCM reads VMs, their guest agent and the cluster.
CSI_PRIVILEGES = ("Datastore.Allocate", "Datastore.AllocateSpace", "Datastore.Audit", "VM.Audit", "VM.Config.Disk")
PROXMOX_CCM_PRIVILEGES = ("Sys.Audit", "VM.Audit", "VM.GuestAgent.Audit")

# The controllers run on control planes, tolerating their taint (the charts' Talos values).
CONTROL_PLANE_SELECTOR = {"node-role.kubernetes.io/control-plane": ""}
CONTROL_PLANE_TOLERATION = {"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}


@dataclass(frozen=True)
class PluginIdentity:
    """What one plugin runs as on Proxmox: a role of exactly its privileges on `/`, a user in PVE's own realm
    holding it, and that user's API token (no privilege separation: the token has the user's privileges),
    handed to the plugin as `secret` in `namespace`."""
    component: str  # "csi" or "ccm"
    role_id: str
    user_id: str
    privileges: tuple[str, ...]
    namespace: str
    secret: str

    @property
    def token_id(self) -> str:
        return f"{self.user_id}!{TOKEN_NAME}"


def plugin_identities(settings: Settings) -> list[PluginIdentity]:
    """One per plugin the stack runs: the CSI plugin's, and the Proxmox CCM's when it labels the nodes.
    Named after the cluster, so two clusters on one Proxmox never share one (PVE role ids: letters, digits,
    '-', '_', never starting with PVE: hence the k8s- prefix)."""
    csi = settings.csi
    if not csi.enabled:
        return []
    name = settings.cluster.name
    found = [PluginIdentity("csi", f"k8s-{name}-csi", f"{name}-csi@pve", CSI_PRIVILEGES, CSI_NAMESPACE,
                            CSI_CONFIG_SECRET)]
    if csi.topology_labels == "proxmox-ccm":
        found.append(PluginIdentity("ccm", f"k8s-{name}-ccm", f"{name}-ccm@pve", PROXMOX_CCM_PRIVILEGES,
                                    PROXMOX_CCM_NAMESPACE, PROXMOX_CCM_CONFIG_SECRET))
    return found


def proxmox_users(settings: Settings) -> list[str]:
    return [identity.user_id for identity in plugin_identities(settings)]


TOKEN_NAME = "kubernetes"  # each plugin user's one token


def plugin_config(api_url: str, insecure: bool, token_id: str, token_secret: str, region: str) -> str:
    """The config file both plugins read (`clusters` of one Proxmox cluster). Holds the token's secret: only
    ever a Kubernetes Secret's data and a Pulumi secret."""
    return yaml.safe_dump({"clusters": [{"url": api_url, "insecure": insecure, "token_id": token_id,
                                         "token_secret": token_secret, "region": region}]}, sort_keys=False)


def api_url(endpoint: str) -> str:
    """The plugins want the API's JSON root; the provider's endpoint is the host's base URL."""
    return endpoint.rstrip("/") + "/api2/json"


def storage_class_values(sc: StorageClassSettings) -> dict[str, Any]:
    """One `storageClass` item of the chart (templates/storageclass.yaml reads exactly these keys)."""
    item: dict[str, Any] = {"name": sc.name, "storage": sc.datastore, "reclaimPolicy": sc.reclaim_policy,
                            "fstype": sc.fs_type}
    if sc.cache is not None:
        item["cache"] = sc.cache
    if sc.ssd:
        item["ssd"] = True
    if sc.default:
        item["annotations"] = {DEFAULT_CLASS_ANNOTATION: "true"}
    return item


def csi_values(settings: Settings) -> dict[str, Any]:
    """Values of the plugin's release: our Secret as its config, the controller on control planes, the node
    plugin on every node (a volume attaches wherever its pod runs), the stack's classes, then `csi.values`."""
    values: dict[str, Any] = {
        "existingConfigSecret": CSI_CONFIG_SECRET,
        "existingConfigSecretKey": CONFIG_KEY,
        "nodeSelector": dict(CONTROL_PLANE_SELECTOR),
        "tolerations": [dict(CONTROL_PLANE_TOLERATION)],
        # Not the chart's Talos values' `platform: nocloud` selector: it matches only nocloud images.
        "node": {"tolerations": [{"operator": "Exists"}]},
        "storageClass": [storage_class_values(sc) for sc in settings.csi.storage_classes],
    }
    return deep_merge(values, settings.csi.values)


def proxmox_ccm_values(settings: Settings) -> dict[str, Any]:
    """Values of the Proxmox CCM's release: our Secret, its node controllers (they set providerID and the
    topology labels), on control planes."""
    return {
        "existingConfigSecret": PROXMOX_CCM_CONFIG_SECRET,
        "existingConfigSecretKey": CONFIG_KEY,
        "enabledControllers": ["cloud-node", "cloud-node-lifecycle"],
        "nodeSelector": dict(CONTROL_PLANE_SELECTOR),
    }


def topology_transformations(settings: Settings) -> list[dict[str, Any]]:
    """The Talos CCM's node transformations giving each node its region and zone: one per Proxmox host,
    selecting its nodes by hostname (Talos's nocloud metadata on Proxmox has neither)."""
    by_host: dict[str, list[str]] = defaultdict(list)
    for node in settings.nodes:
        by_host[node.proxmox_node].append(node.name)
    return [{"name": f"proxmox-{host}",
             "nodeSelector": [{"matchExpressions": [{"key": "hostname", "operator": "In", "values": names}]}],
             "platformMetadata": {"Region": settings.csi.region, "Zone": host}}
            for host, names in by_host.items()]


def ccm_topology_values(settings: Settings) -> dict[str, Any]:
    """What the Talos CCM's values gain for the plugin ({} unless its labels come from the Talos CCM)."""
    if not settings.csi.enabled or settings.csi.topology_labels != "talos-ccm":
        return {}
    return {"transformations": topology_transformations(settings)}
