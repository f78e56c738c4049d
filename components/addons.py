"""`ClusterAddons`: Cilium (with Hubble) and the Talos CCM as Helm releases, then an optional health wait.

Helm releases (`helm.v3.Release`) rather than `helm.v4.Chart`: the seed installs both with
`helm install`, and a release keeps that shape — one object Helm itself knows (`helm ls`, the cilium
CLI read it), atomic upgrades that roll back on failure, and `helm uninstall` on removal — where a
v4 Chart would spread the charts into hundreds of separately tracked Kubernetes objects.

The two releases deliberately do not depend on each other. The CCM's pod needs the pod network
(Cilium), while nodes keep the `node.cloudprovider.kubernetes.io/uninitialized` taint until the CCM
runs, so Cilium's Hubble relay and UI schedule only after it: installed one after the other, the
first release's wait could never finish. Installed side by side, both settle.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import pulumi
import pulumi_kubernetes as k8s

from talos_proxmox.cluster_plan.addon_values import (
    CCM_RELEASE,
    NAMESPACE,
    CILIUM_CHART,
    CILIUM_RELEASE,
    ccm_values,
    cilium_load_balancer_manifests,
    cilium_values,
    hubble_ui_address,
    hubble_ui_exposure,
    hubble_ui_load_balancer_service,
    load_balancer_host,
    release_sha256,
)
from providers.cluster_health import ClusterHealth
from providers.helm_release_mode import AtomicUpgrades
from talos_proxmox.settings.model import Settings

def helm_release(resource_name: str, release_name: str, chart: str, version: str, values: pulumi.Input[dict],
                 timeout_seconds: int, opts: pulumi.ResourceOptions, atomic: pulumi.Input[bool] = True,
                 namespace: str = NAMESPACE, **chart_args: Any) -> k8s.helm.v3.Release:
    """A release (in kube-system unless `namespace` says) that rolls back (atomic) and cleans up when an
    install or upgrade fails; Helm waits `timeout_seconds` for its workloads to be ready."""
    return k8s.helm.v3.Release(
        resource_name, name=release_name, chart=chart, version=version, namespace=namespace, values=values,
        atomic=atomic, cleanup_on_fail=True, timeout=timeout_seconds, opts=opts, **chart_args)


class ClusterAddons(pulumi.ComponentResource):
    """The cluster's add-ons, installed through `k8s_provider` once everything in `depends_on` exists.

    Args:
        name: component name.
        settings: the stack's settings (`cilium`, `hubble`, `ccm`, `health`, `cluster`, `nodes`).
        k8s_provider: a `pulumi_kubernetes.Provider` made from the cluster's admin kubeconfig; None when neither
            Cilium nor the CCM is on (nothing else needs it).
        depends_on: resources that must exist before any release (bootstrap, kubeconfig).
        kubeconfig: the admin kubeconfig (secret) for the health wait; without it the wait is skipped.
        opts: resource options of the component.

    Attributes: `cilium` and `ccm` (Releases or None), `cilium_atomic` (whether Cilium's release is
    atomic: not on its first install), `load_balancer_pool` (Cilium's LB-IPAM pool and L2
    policy, after Cilium, or []), `hubble_ui_service` (the UI's LoadBalancer Service, or None), `health` (ClusterHealth or None), `cilium_values`, `ccm_values` (the values
    sent), `hubble_ui_address` (Output: URL of the Hubble UI, None when the UI is off).
    """

    def __init__(
        self,
        name: str,
        settings: Settings,
        k8s_provider: Optional[k8s.Provider],
        depends_on: Sequence[pulumi.Resource] = (),
        kubeconfig: Optional[pulumi.Input[str]] = None,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__("talos-proxmox:index:ClusterAddons", name, None, opts)
        after_cluster = pulumi.ResourceOptions(parent=self, provider=k8s_provider, depends_on=list(depends_on))

        self.cilium: Optional[k8s.helm.v3.Release] = None
        self.ccm: Optional[k8s.helm.v3.Release] = None
        self.hubble_ui_service: Optional[k8s.core.v1.Service] = None
        self.load_balancer_pool: list[k8s.apiextensions.CustomResource] = []
        self.health: Optional[ClusterHealth] = None
        self.cilium_values: Optional[dict[str, Any]] = None
        self.ccm_values: Optional[dict[str, Any]] = None
        self.hubble_ui_address: pulumi.Output[Optional[str]] = pulumi.Output.from_input(None)

        self.cilium_atomic: Optional[AtomicUpgrades] = None
        if settings.cilium.enabled:
            self.cilium_values = cilium_values(settings)
            # Not atomic on the first install: a failed one would be uninstalled with the cluster's network.
            # Without a kubeconfig the cluster cannot be asked, so upgrades stay non-atomic (never uninstalled).
            self.cilium_atomic = AtomicUpgrades(
                "cilium-atomic", kubeconfig=kubeconfig if kubeconfig is not None else "", namespace=NAMESPACE,
                release=CILIUM_RELEASE,
                release_sha256=release_sha256(CILIUM_CHART, settings.cilium.version, self.cilium_values,
                                              settings.cilium.repository),
                opts=pulumi.ResourceOptions(parent=self, depends_on=list(depends_on)))
            self.cilium = helm_release(
                "cilium", CILIUM_RELEASE, CILIUM_CHART, settings.cilium.version, self.cilium_values,
                settings.cilium.timeout_seconds, after_cluster,
                atomic=self.cilium_atomic.atomic,
                repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=settings.cilium.repository,
                                                               ca_file=settings.cilium.ca_file))
            # Cilium's operator registers the pool's CRDs once it runs, which the release waited for.
            after_cilium = pulumi.ResourceOptions(parent=self, provider=k8s_provider, depends_on=[self.cilium])
            self.load_balancer_pool = [
                k8s.apiextensions.CustomResource(
                    f"cilium-{manifest['kind']}", api_version=manifest["apiVersion"], kind=manifest["kind"],
                    metadata=manifest["metadata"], spec=manifest["spec"], opts=after_cilium)
                for manifest in cilium_load_balancer_manifests(settings)]
            self.hubble_ui_address = self._hubble_ui(settings, k8s_provider)

        if settings.ccm.enabled:
            self.ccm_values = ccm_values(settings)
            # The chart is an oci:// reference: no repository to add.
            self.ccm = helm_release("talos-ccm", CCM_RELEASE, settings.ccm.chart, settings.ccm.version, self.ccm_values,
                                settings.ccm.timeout_seconds, after_cluster)

        releases = [r for r in (self.cilium, self.ccm) if r is not None]
        if settings.health.wait:
            if kubeconfig is None:
                pulumi.log.warn("health.wait is on but ClusterAddons got no kubeconfig; not waiting for health",
                                resource=self)
            else:
                self.health = ClusterHealth(
                    "health", kubeconfig,
                    expected_nodes=len(settings.nodes),
                    timeout_seconds=settings.health.timeout_seconds,
                    # A new release revision (upgrade, new values) is worth waiting for again.
                    triggers=[r.status.apply(lambda s: getattr(s, "revision", None)) for r in releases],
                    opts=pulumi.ResourceOptions(parent=self, depends_on=[*depends_on, *releases]))

        self.register_outputs({"hubble_ui_address": self.hubble_ui_address})

    def _hubble_ui(self, settings: Settings, k8s_provider: k8s.Provider) -> pulumi.Output[Optional[str]]:
        service = hubble_ui_load_balancer_service(settings)
        exposure = hubble_ui_exposure(self.cilium_values or {}, load_balancer=service is not None)
        if exposure is None:
            return pulumi.Output.from_input(None)
        if service is None:
            return pulumi.Output.from_input(hubble_ui_address(settings, exposure))
        # Made after the pool: the Service waits for its address (pulumi-kubernetes's await), and if none
        # comes only this Service fails; the Cilium release is already installed and stays.
        self.hubble_ui_service = k8s.core.v1.Service(
            "hubble-ui-lb", metadata=service["metadata"], spec=service["spec"],
            opts=pulumi.ResourceOptions(parent=self, provider=k8s_provider,
                                        depends_on=[self.cilium, *self.load_balancer_pool]))
        return self.hubble_ui_service.status.apply(
            lambda status: hubble_ui_address(settings, exposure, host) if (host := load_balancer_host(status)) else None)
