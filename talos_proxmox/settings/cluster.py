"""The `cluster` section: name, endpoint, versions, subnets, install disk, KubeSpan, patches, protection. No Pulumi here."""

from __future__ import annotations

import re
from typing import Any

from talos_proxmox.settings.model import DEFAULT_TALOS_VERSION, KubeSpan, ROLES
from talos_proxmox.settings.values import (
    _MTU_RANGE,
    _NAME,
    _Reader,
    _bool,
    _cidr_list,
    _dns_domain,
    _endpoint,
    _int_in,
    _ip,
    _kubernetes_version_value,
    _one_of,
    _patches,
    _string,
    _talos_version,
)


def _read_cluster(r: _Reader, raw: Any) -> dict:
    s = r.section(raw, "cluster", (
        "name", "endpoint", "vip", "talosVersion", "kubernetesVersion", "podSubnets", "serviceSubnets",
        "domain", "installDisk", "kubespan", "discovery", "patches", "rolePatches", "secretsFile",
        "systemDiskEncryption", "deletionProtection", "allowDowngrade", "recoverFrom",
        "recoverIdentityFile"))
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
        recover_from=r.value(s, "recoverFrom", "cluster.recoverFrom", _string,
                             "is not a file path or an object (s3://<backups.bucket>/<key>)", default=None),
        recover_identity_file=r.value(s, "recoverIdentityFile", "cluster.recoverIdentityFile", _string,
                                      "is not a file path", default=None),
    )


def _dns_label(v: Any) -> str:
    if not isinstance(v, str) or not _NAME.match(v):
        raise ValueError
    return v


# What udev puts in a device node's or link's name (it escapes anything else as \xNN): no quote, backslash or
# space, which would end or change the CEL string `disk.dev_path == "<device>"` Talos 1.14 selects disks with.
_DEVICE = re.compile(r"^/dev/[A-Za-z0-9#+\-.:=@_/]+$")


def _device(v: Any) -> str:
    if not isinstance(v, str) or not _DEVICE.match(v):
        raise ValueError
    return v
