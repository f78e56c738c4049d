"""What a Kubernetes minor version removes, checked before a cluster goes there, as `talosctl upgrade-k8s`
checks it (its tables: siderolabs/go-kubernetes v0.2.41 `kubernetes/upgrade/checks.go`, keyed by upgrade path;
upstream marks the 1.36 and 1.37 entries not final).

- Component flags and feature gates: a flag or gate a component no longer knows stops it from starting, so
  every one removed at or before the stack's version is refused in the stack's own configs (`extraArgs` of
  the API server, controller manager, scheduler and kubelet, in the v1alpha1 document or in Talos 1.14's
  component documents) when the stack loads, naming the patch that set it. talosctl checks the running
  static pods for the next minor only; a config is checked against every removal up to its version here,
  since a stack may name any version its Talos runs.
- API versions: objects stored under a resource version the new minor no longer serves must be moved first.
  Before a minor upgrade, the objects are listed at each removed `resource.version.group` (an API the server
  does not serve is skipped, as talosctl does), and any found refuse the preview, counted by resource.
No Pulumi here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from talos_proxmox.talos_config.machine_config import component_settings


@dataclass(frozen=True)
class Removals:
    """What the Kubernetes minor version (the key of REMOVED) no longer has."""
    flags: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # component -> flag names
    feature_gates: tuple[str, ...] = ()
    apis: tuple[str, ...] = ()  # resource.version.group


# Keyed by the minor version that removes them.
REMOVED: dict[tuple[int, int], Removals] = {
    (1, 33): Removals(
        flags={"kube-apiserver": ("cloud-config",)},
        feature_gates=("AppArmor", "AppArmorFields", "CPUManager", "DisableCloudProviders",
                       "DisableKubeletCloudCredentialProviders", "JobPodFailurePolicy",
                       "KubeProxyDrainingTerminatingNodes", "PDBUnhealthyPodEvictionPolicy",
                       "PersistentVolumeLastPhaseTransitionTime", "VolumeCapacityPriority")),
    (1, 34): Removals(
        flags={"kubelet": ("cloud-config",)},
        feature_gates=("DevicePluginCDIDevices", "LegacySidecarContainers", "PodDisruptionConditions")),
    (1, 35): Removals(
        flags={"kubelet": ("pod-infra-container-image",)},
        feature_gates=("SizeMemoryBackedVolumes", "UserNamespacesHostNetworkSupport")),
    (1, 36): Removals(
        feature_gates=("CSIMigrationPortworx", "HonorPVReclaimPolicy", "InTreePluginPortworxUnregister",
                       "WatchFromStorageWithoutResourceVersion")),
    (1, 37): Removals(
        flags={"kubelet": ("application-metrics-count-limit", "boot-id-file", "container-hints", "containerd",
                           "containerd-namespace", "enable-load-reader", "event-storage-age-limit",
                           "event-storage-event-limit", "global-housekeeping-interval", "log-cadvisor-usage",
                           "machine-id-file", "storage-driver-user", "storage-driver-password",
                           "storage-driver-host", "storage-driver-db", "storage-driver-table",
                           "storage-driver-secure", "storage-driver-buffer-duration")},
        feature_gates=("AnyVolumeDataSource", "DeclarativeValidationTakeover", "GangScheduling",
                       "PreventStaticPodAPIReferences", "WorkloadAwarePreemption"),
        apis=("workloads.v1alpha2.scheduling.k8s.io", "podgroups.v1alpha2.scheduling.k8s.io")),
}

def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.lstrip("v").split(".")
    return int(major), int(minor_)


def _values(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def config_problems(documents: Sequence[Mapping[str, Any]], kubernetes_version: str) -> list[str]:
    """Flags and feature gates in the config's extraArgs that Kubernetes removed at or before its version."""
    target = minor(kubernetes_version)
    problems = []
    for component, where, args in component_settings(documents, "extraArgs"):
        gates = {gate.split("=", 1)[0].strip(): None for value in _values(args.get("feature-gates", []))
                 for gate in value.split(",") if gate.strip()}
        for removed_in, removals in sorted(REMOVED.items()):
            if removed_in > target:
                continue
            since = f"Kubernetes {removed_in[0]}.{removed_in[1]} removed it (the stack runs {kubernetes_version})"
            for flag in removals.flags.get(component, ()):
                if flag in args:
                    problems.append(f"{where} {flag}: {component} has no flag --{flag}: {since}")
            for gate in removals.feature_gates:
                if gate in gates:
                    problems.append(f"{where} feature-gates {gate}: {component} has no feature gate {gate}: {since}")
    return problems


def removed_apis(from_version: str, to_version: str) -> tuple[str, ...]:
    """The resource versions the minor versions after `from_version` up to `to_version` remove."""
    start, end = minor(from_version), minor(to_version)
    return tuple(api for removed_in, removals in sorted(REMOVED.items()) if start < removed_in <= end
                 for api in removals.apis)


def api_path(api: str) -> str:
    """`workloads.v1alpha2.scheduling.k8s.io` -> `/apis/scheduling.k8s.io/v1alpha2/workloads`."""
    resource, version, group = api.split(".", 2)
    return f"/apis/{group}/{version}/{resource}"


def stored_object_problems(from_version: str, to_version: str,
                           count_objects: Callable[[str], Optional[int]]) -> list[str]:
    """One line per removed resource version that still holds objects; `count_objects(path)` lists them
    (None: the server does not serve it, so nothing can be stored there)."""
    problems = []
    for api in removed_apis(from_version, to_version):
        count = count_objects(api_path(api))
        if count:
            resource, version, group = api.split(".", 2)
            problems.append(f"{count} {resource} stored as {group}/{version}, which Kubernetes "
                            f"{to_version} no longer serves: move them to a served version (or delete them) "
                            f"before this upgrade")
    return problems
