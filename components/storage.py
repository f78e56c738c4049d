"""`ClusterStorage`: the Proxmox CSI plugin (and the Proxmox CCM when it labels the nodes), each with a
Proxmox identity of its own made through the Proxmox provider, and its config as a Kubernetes Secret.

What removing `csi` leaves: the Helm release goes (`helm uninstall`: the plugin's workloads and its
StorageClasses), then the Secret, token, ACL entry, user and role. PersistentVolumes and the Proxmox disks
behind them stay: uninstalling a CSI driver never deletes a volume, and with the driver gone nothing can.
A volume holds data as long as its PersistentVolume exists; delete the claims first (their volumes go
with them under `reclaimPolicy: Delete`) if the data is to go too.
"""

from __future__ import annotations

from typing import Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s
import pulumi_proxmoxve as proxmoxve

from components.addons import helm_release
from talos_proxmox.cluster_plan.storage_values import (
    CONFIG_KEY,
    CSI_NAMESPACE,
    CSI_RELEASE,
    PRIVILEGED_NAMESPACE_LABELS,
    PROXMOX_CCM_NAMESPACE,
    PROXMOX_CCM_RELEASE,
    TOKEN_NAME,
    PluginIdentity,
    csi_values,
    plugin_config,
    plugin_identities,
    proxmox_ccm_values,
)
from talos_proxmox.settings.model import Settings


class ClusterStorage(pulumi.ComponentResource):
    """Made only with `csi.enabled`. `api_url` and `verify_tls`: how the plugins reach Proxmox (the
    provider's endpoint). Attributes: `identities` (name -> (role, user, acl, token)), `secrets`,
    `namespace`, `csi` and `proxmox_ccm` (Releases or None), `csi_values`."""

    def __init__(self, name: str, settings: Settings, k8s_provider: k8s.Provider, api_url: str, verify_tls: bool,
                 depends_on: Sequence[pulumi.Resource] = (), opts: Optional[pulumi.ResourceOptions] = None) -> None:
        super().__init__("talos-proxmox:index:ClusterStorage", name, None, opts)
        csi = settings.csi
        self.identities: dict[str, tuple[pulumi.Resource, ...]] = {}
        self.secrets: dict[str, k8s.core.v1.Secret] = {}
        in_cluster = pulumi.ResourceOptions(parent=self, provider=k8s_provider, depends_on=list(depends_on))
        self.namespace = k8s.core.v1.Namespace(
            "csi-namespace", metadata={"name": CSI_NAMESPACE, "labels": dict(PRIVILEGED_NAMESPACE_LABELS)},
            opts=in_cluster)
        for identity in plugin_identities(settings):
            token = self._identity(identity, settings.cluster.name)
            config = token.value.apply(lambda full, i=identity: plugin_config(
                api_url, not verify_tls, i.token_id, full.split("=", 1)[1], csi.region))
            after_namespace = pulumi.ResourceOptions.merge(in_cluster, pulumi.ResourceOptions(
                depends_on=[*depends_on, self.namespace]))
            self.secrets[identity.component] = k8s.core.v1.Secret(
                f"{identity.component}-config", metadata={"name": identity.secret, "namespace": identity.namespace},
                string_data={CONFIG_KEY: pulumi.Output.secret(config)}, opts=after_namespace)

        self.csi_values = csi_values(settings)
        self.csi = helm_release(
            "proxmox-csi", CSI_RELEASE, csi.chart, csi.version, self.csi_values, csi.timeout_seconds,
            namespace=CSI_NAMESPACE, opts=pulumi.ResourceOptions(parent=self, provider=k8s_provider,
                                                                 depends_on=[*depends_on, self.secrets["csi"]]))
        self.proxmox_ccm: Optional[k8s.helm.v3.Release] = None
        if "ccm" in self.secrets:
            self.proxmox_ccm = helm_release(
                "proxmox-ccm", PROXMOX_CCM_RELEASE, csi.proxmox_ccm_chart, csi.proxmox_ccm_version,
                proxmox_ccm_values(settings), csi.timeout_seconds, namespace=PROXMOX_CCM_NAMESPACE,
                opts=pulumi.ResourceOptions(parent=self, provider=k8s_provider,
                                            depends_on=[*depends_on, self.secrets["ccm"]]))
        self.register_outputs({})

    def _identity(self, identity: PluginIdentity, cluster: str) -> proxmoxve.user.Token:
        """Role, user, ACL entry and API token on the stack's Proxmox; the token's secret stays a secret output."""
        child = pulumi.ResourceOptions(parent=self)
        what = f"{identity.component.upper()} of Kubernetes cluster {cluster} (talos-proxmox)"
        role = proxmoxve.RoleLegacy(f"{identity.component}-role", role_id=identity.role_id,
                                    privileges=list(identity.privileges), opts=child)
        user = proxmoxve.UserLegacy(f"{identity.component}-user", user_id=identity.user_id, comment=what, opts=child)
        acl = proxmoxve.Acl(f"{identity.component}-acl", path="/", role_id=role.role_id, user_id=user.user_id,
                            propagate=True, opts=child)
        token = proxmoxve.user.Token(f"{identity.component}-token", user_id=user.user_id, token_name=TOKEN_NAME,
                                     privileges_separation=False, comment=what,
                                     opts=pulumi.ResourceOptions(parent=self, depends_on=[acl]))
        self.identities[identity.component] = (role, user, acl, token)
        return token
