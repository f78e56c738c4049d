"""The `csi` section: the Proxmox CSI plugin's StorageClasses and who labels the nodes with their topology,
and its checks against the rest of the stack. No Pulumi here."""

from __future__ import annotations

import re
from typing import Any, Optional

from talos_proxmox.settings.addons import _oci_ref, _release_timeout
from talos_proxmox.settings.model import (
    CcmSettings,
    CsiSettings,
    DEFAULT_CSI_CHART,
    DEFAULT_CSI_CHART_VERSION,
    DEFAULT_PROXMOX_CCM_CHART,
    DEFAULT_PROXMOX_CCM_CHART_VERSION,
    ProxmoxSettings,
    StorageClassSettings,
    TOPOLOGY_LABEL_SOURCES,
)
from talos_proxmox.settings.proxmox import _STORAGE_EXPECTED, _STORAGE_ID
from talos_proxmox.settings.values import _Reader, _bool, _mapping, _matching, _one_of, _version

# A Kubernetes object name (DNS-1123 subdomain), as a StorageClass's.
_OBJECT_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# A label value (the region label): what Kubernetes accepts there, at most 63 characters.
_LABEL_VALUE = re.compile(r"^(?=.{1,63}$)[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")

# The filesystems the plugin formats a volume with (its `csi.storage.k8s.io/fstype` parameter).
FILESYSTEMS = ("ext4", "xfs")

# PVE's disk cache modes (qemu-server's drive `cache` option).
CACHE_MODES = ("none", "directsync", "writethrough", "writeback", "unsafe")


def _read_storage_class(r: _Reader, raw: Any, i: int) -> Optional[StorageClassSettings]:
    key = f"csi.storageClasses[{i}]"
    s = r.section(raw, key, ("name", "datastore", "reclaimPolicy", "fsType", "cache", "ssd", "default"))
    if not s:
        if raw is not None and key not in r.bad_sections:
            r.report(key, "is empty (expected at least name and datastore)")
        return None
    name = r.value(s, "name", f"{key}.name", _matching(_OBJECT_NAME),
                   "is not a StorageClass name (expected lowercase letters, digits, '-' and '.', e.g. proxmox-data)")
    datastore = r.value(s, "datastore", f"{key}.datastore", _matching(_STORAGE_ID), _STORAGE_EXPECTED)
    if name is None or datastore is None:
        return None
    return StorageClassSettings(
        name=name, datastore=datastore,
        reclaim_policy=r.value(s, "reclaimPolicy", f"{key}.reclaimPolicy", _one_of("Delete", "Retain"),
                               "is not a reclaim policy (expected Delete or Retain)", default="Delete"),
        fs_type=r.value(s, "fsType", f"{key}.fsType", _one_of(*FILESYSTEMS),
                        f"is not a filesystem the plugin formats (expected one of: {', '.join(FILESYSTEMS)})",
                        default="ext4"),
        cache=r.value(s, "cache", f"{key}.cache", _one_of(*CACHE_MODES),
                      f"is not a Proxmox disk cache mode (expected one of: {', '.join(CACHE_MODES)})", default=None),
        ssd=r.value(s, "ssd", f"{key}.ssd", _bool, "is not true or false", default=False),
        default=r.value(s, "default", f"{key}.default", _bool, "is not true or false", default=False),
    )


def _read_csi(r: _Reader, raw: Any, cluster_name: Optional[str]) -> CsiSettings:
    s = r.section(raw, "csi", ("enabled", "chart", "version", "region", "topologyLabels", "proxmoxCcmChart",
                               "proxmoxCcmVersion", "storageClasses", "values", "timeoutSeconds"))
    classes_raw = s.get("storageClasses")
    classes: tuple[StorageClassSettings, ...] = ()
    if classes_raw is not None:
        if not isinstance(classes_raw, list):
            r.fail("csi.storageClasses", classes_raw, "is not a list of StorageClasses")
        else:
            classes = tuple(c for i, item in enumerate(classes_raw) if (c := _read_storage_class(r, item, i)))
    return CsiSettings(
        enabled=r.value(s, "enabled", "csi.enabled", _bool, "is not true or false", default=False),
        chart=r.value(s, "chart", "csi.chart", _oci_ref, "is not an OCI chart reference (expected oci://...)",
                      default=DEFAULT_CSI_CHART),
        version=r.value(s, "version", "csi.version", _version, "is not a chart version (expected e.g. 0.5.9)",
                        default=DEFAULT_CSI_CHART_VERSION),
        # Only consistency matters (the plugin's config and the nodes' labels carry the same value); the
        # Proxmox cluster's name is what the plugin's docs use, the Kubernetes cluster's name a safe default.
        region=r.value(s, "region", "csi.region", _matching(_LABEL_VALUE),
                       "is not a label value (expected the Proxmox cluster's name, e.g. pve-cluster)",
                       default=cluster_name or ""),
        topology_labels=r.value(s, "topologyLabels", "csi.topologyLabels", _one_of(*TOPOLOGY_LABEL_SOURCES),
                                f"is not a topology label source (expected one of: {', '.join(TOPOLOGY_LABEL_SOURCES)})",
                                default="talos-ccm"),
        proxmox_ccm_chart=r.value(s, "proxmoxCcmChart", "csi.proxmoxCcmChart", _oci_ref,
                                  "is not an OCI chart reference (expected oci://...)",
                                  default=DEFAULT_PROXMOX_CCM_CHART),
        proxmox_ccm_version=r.value(s, "proxmoxCcmVersion", "csi.proxmoxCcmVersion", _version,
                                    "is not a chart version (expected e.g. 0.2.27)",
                                    default=DEFAULT_PROXMOX_CCM_CHART_VERSION),
        storage_classes=classes,
        values=r.value(s, "values", "csi.values", _mapping, "is not a mapping of Helm values", default={}),
        timeout_seconds=_release_timeout(r, s, "csi"),
    )


# PVE's longest user id (pve-access-control: `userid` at most 64 characters, realm included).
PVE_USER_ID_MAX = 64


def _check_csi(r: _Reader, csi: CsiSettings, proxmox: Optional[ProxmoxSettings], ccm: CcmSettings,
               cluster_name: Optional[str] = None) -> None:
    """What the stack must say for the plugin to work: its classes on datastores every node's host has, one
    default at most, a running source of the topology labels the plugin places volumes by, and a cluster
    name short enough for the plugins' Proxmox users (`<cluster>-csi@pve`)."""
    if not csi.enabled:
        return
    if cluster_name and len(f"{cluster_name}-csi@pve") > PVE_USER_ID_MAX:
        r.fail("cluster.name", cluster_name, f"is too long for the CSI plugin's Proxmox user {cluster_name}-csi@pve "
                                             f"(PVE takes user ids of at most {PVE_USER_ID_MAX} characters; "
                                             f"expected a name of at most {PVE_USER_ID_MAX - 8})")
    if not csi.storage_classes:
        r.report("csi.storageClasses", "is empty: with csi.enabled: true, expected at least one StorageClass "
                                       "(e.g. [{name: proxmox-data, datastore: local-lvm}])")
    known = (proxmox.vm_datastore, *proxmox.datastores) if proxmox is not None else None
    names: dict[str, int] = {}
    default_at: Optional[int] = None
    for i, sc in enumerate(csi.storage_classes):
        key = f"csi.storageClasses[{i}]"
        if known is not None and sc.datastore not in known:
            r.fail(f"{key}.datastore", sc.datastore,
                   f"is not a datastore the stack's Proxmox hosts have (expected proxmox.vmDatastore "
                   f"{proxmox.vm_datastore!r} or one of proxmox.datastores; add it there if every host has it)")
        if sc.name in names:
            r.fail(f"{key}.name", sc.name, f"is also csi.storageClasses[{names[sc.name]}].name (expected unique names)")
        names.setdefault(sc.name, i)
        if sc.default:
            if default_at is not None:
                r.report(f"{key}.default", f"true makes a second default StorageClass (csi.storageClasses"
                                           f"[{default_at}] is one already; Kubernetes then picks either)")
            else:
                default_at = i
    # Both sources need the Talos CCM on: it gives the kubelets `cloud-provider: external` (without it no
    # CCM initializes a node) and approves their serving certificates.
    if not ccm.enabled:
        r.report("csi.topologyLabels", f"{csi.topology_labels!r} needs ccm.enabled: true (the Talos CCM makes the "
                                       "kubelets wait for a cloud provider and sets or leaves the labels)")
    elif csi.topology_labels == "proxmox-ccm" and "cloud-node" in (ccm.controllers or ()):
        r.report("csi.topologyLabels", "'proxmox-ccm' runs the Proxmox CCM's cloud-node controller, and the Talos "
                                       "CCM's would initialize the same nodes (expected ccm.controllers without "
                                       "cloud-node, e.g. [node-csr-approval])")
