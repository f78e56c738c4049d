"""The bootstrap manifests Talos renders on a control plane (CoreDNS, kube-proxy, the kubelet's RBAC, ...),
synced into the cluster as `talosctl upgrade-k8s` syncs them. Talos applies them once, at bootstrap, and
never again: without this, CoreDNS stays at the version the cluster was bootstrapped with.

What Talos does, kept here: the manifests are the `controlplane/Manifests.kubernetes.talos.dev` resources of
one control plane, in their order; each object is server-side applied with field manager `talos`, taking
over fields others hold; the objects applied are listed in the ConfigMap
kube-system/talos-bootstrap-manifests-inventory (keys `<namespace>_<name>_<group>_<kind>`), each object
annotated `config.k8s.io/owning-inventory` with that name; an object the inventory lists that the manifests
no longer have is deleted (pruned), unless another inventory owns it. An object owned by another inventory
is refused (talosctl's default policy: adopt objects no inventory owns). Changed Deployments and DaemonSets
are waited for until rolled out.

Each object is reported as Created, Configured (with what changed), Unchanged or Pruned; a Secret's data is
never shown. No Pulumi here.
"""

from __future__ import annotations

import difflib
import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import yaml

from talos_proxmox.day_two.cluster_health import KubeApi
from talos_proxmox.talos_api.client import TalosClient
from talos_proxmox.talos_api.retry import Backoff, GaveUp, call_with_retry

MANIFESTS = ("controlplane", "Manifests.kubernetes.talos.dev")
FIELD_MANAGER = "talos"
INVENTORY_NAMESPACE, INVENTORY_NAME = "kube-system", "talos-bootstrap-manifests-inventory"
OWNING_INVENTORY = "config.k8s.io/owning-inventory"
# Applied first, in this order (fluxcd's stages, which talosctl uses): what other objects need to exist.
FIRST_KINDS = ("CustomResourceDefinition", "Namespace", "ClusterRole", "StorageClass", "PriorityClass")
THEN_KINDS = ("ConfigMap", "Secret")
ROLLOUT_TIMEOUT = 300.0  # talosctl's --manifests-reconcile-timeout
# Fields the API server keeps that a manifest never says: left out of what a change shows.
_SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields", "selfLink")
_MAX_CHANGE_LINES = 12


class ManifestSyncError(RuntimeError):
    pass


@dataclass
class SyncResult:
    """What the sync did, each entry `<Action> <kind> <namespace>/<name>` with its changes indented below."""

    lines: list[str] = field(default_factory=list)
    changed: list[dict] = field(default_factory=list)  # objects created or configured (waited for)


def read_manifests(client: TalosClient, node: str, *, timeout: float) -> list[dict]:
    """Every object of the node's Manifests resources, in the node's order (by resource id)."""
    objects = []
    for resource in client.list_resources(*MANIFESTS, timeout=timeout, node=node):
        spec = yaml.safe_load(resource.spec.yaml_spec or "") or []
        items = spec.get("items", []) if isinstance(spec, dict) else spec
        objects += [item for item in items if isinstance(item, dict) and item.get("kind")]
    return objects


def staged(objects: Sequence[dict]) -> list[dict]:
    """`objects` in apply order: the kinds others depend on, then ConfigMaps and Secrets, then the rest, each
    group in the manifests' own order."""
    def stage(obj: dict) -> int:
        kind = obj.get("kind")
        return 0 if kind in FIRST_KINDS else 1 if kind in THEN_KINDS else 2
    return sorted(objects, key=stage)  # stable: the manifests' order within a stage


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def inventory_key(obj: Mapping) -> str:
    """cli-utils' ObjMetadata string, as Talos keys its inventory: <namespace>_<name>_<group>_<kind>."""
    metadata = obj.get("metadata") or {}
    group, _ = _group_version(obj.get("apiVersion", ""))
    return f"{metadata.get('namespace', '')}_{metadata.get('name', '')}_{group}_{obj.get('kind', '')}"


def subject(obj: Mapping) -> str:
    metadata = obj.get("metadata") or {}
    where = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{obj.get('kind')} {where}{metadata.get('name')}"


def _flat(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        return [line for key in value for line in _flat(value[key], f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(value, list):
        return [line for index, item in enumerate(value) for line in _flat(item, f"{prefix}[{index}]")]
    return [f"{prefix}: {json.dumps(value)}"]


def changes(live: Mapping, applied: Mapping) -> list[str]:
    """What applying changed in the object, as `-`/`+` lines of its fields (its status and the fields only
    the server keeps left out; a Secret's data never shown)."""
    def shown(obj: Mapping) -> dict:
        kept = {key: value for key, value in obj.items() if key != "status"}
        kept["metadata"] = {key: value for key, value in (obj.get("metadata") or {}).items()
                            if key not in _SERVER_FIELDS}
        if obj.get("kind") == "Secret":
            kept = {key: value for key, value in kept.items() if key not in ("data", "stringData")}
        return kept
    diff = [line for line in difflib.unified_diff(_flat(shown(live)), _flat(shown(applied)), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    if applied.get("kind") == "Secret":
        diff.append("(a Secret's data is not shown)")
    return diff if len(diff) <= _MAX_CHANGE_LINES else diff[:_MAX_CHANGE_LINES] + [
        f"... and {len(diff) - _MAX_CHANGE_LINES} more"]


class _Paths:
    """The API path of each object, from the API server's discovery (a kind's plural and scope)."""

    def __init__(self, kube: KubeApi):
        self._kube = kube
        self._resources: dict[str, dict[str, tuple[str, bool]]] = {}

    def _kinds(self, api_version: str) -> dict[str, tuple[str, bool]]:
        if api_version not in self._resources:
            base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
            found = self._kube.get(base) or {}
            self._resources[api_version] = {r["kind"]: (r["name"], bool(r.get("namespaced")))
                                            for r in found.get("resources") or () if "/" not in r["name"]}
        return self._resources[api_version]

    def of(self, obj: Mapping) -> str:
        api_version = obj.get("apiVersion", "")
        kinds = self._kinds(api_version)
        if obj.get("kind") not in kinds:
            self._resources.pop(api_version, None)  # a CRD applied earlier in this sync may serve it now
            kinds = self._kinds(api_version)
        if obj.get("kind") not in kinds:
            raise ManifestSyncError(f"{subject(obj)}: the API server does not serve {api_version} {obj.get('kind')}")
        plural, namespaced = kinds[obj["kind"]]
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        metadata = obj.get("metadata") or {}
        namespace = f"/namespaces/{metadata.get('namespace') or 'default'}" if namespaced else ""
        return f"{base}{namespace}/{plural}/{metadata['name']}"


def _owner(obj: Optional[Mapping]) -> Optional[str]:
    return (((obj or {}).get("metadata") or {}).get("annotations") or {}).get(OWNING_INVENTORY)


def _inventory_path() -> str:
    return f"/api/v1/namespaces/{INVENTORY_NAMESPACE}/configmaps/{INVENTORY_NAME}"


def sync(kube: KubeApi, objects: Sequence[dict]) -> SyncResult:
    """Apply `objects` (the manifests) and prune what the inventory lists that they no longer have."""
    paths = _Paths(kube)
    result = SyncResult()
    inventory = kube.get(_inventory_path())
    listed = set(((inventory or {}).get("data") or {}).keys())
    applied_keys = []
    for obj in staged(objects):
        path = paths.of(obj)
        live = kube.get(path)
        if live is not None and _owner(live) not in (None, INVENTORY_NAME):
            raise ManifestSyncError(f"{subject(obj)} belongs to the inventory {_owner(live)!r}, not Talos's "
                                    f"{INVENTORY_NAME!r}; it is left as it is and the sync stops")
        body = json.loads(json.dumps(obj))
        body.setdefault("metadata", {}).setdefault("annotations", {})[OWNING_INVENTORY] = INVENTORY_NAME
        applied = kube.apply(path, body, FIELD_MANAGER)
        if applied is None:
            raise ManifestSyncError(f"{subject(obj)}: the API server answered 404 to its apply")
        applied_keys.append(inventory_key(obj))
        if live is None:
            result.lines.append(f"Created {subject(obj)}")
            result.changed.append(applied)
        elif live["metadata"].get("resourceVersion") != applied["metadata"].get("resourceVersion"):
            result.lines.append(f"Configured {subject(obj)}")
            result.lines += [f"  {line}" for line in changes(live, applied)]
            result.changed.append(applied)
        else:
            result.lines.append(f"Unchanged {subject(obj)}")
    _write_inventory(kube, listed | set(applied_keys))
    kept = set(applied_keys)
    for key in sorted(listed - kept):
        if _prune(kube, paths, key):
            result.lines.append(f"Pruned {_key_subject(key)}")
    _write_inventory(kube, kept)
    return result


def _key_subject(key: str) -> str:
    namespace, name, _group, kind = key.split("_", 3)
    return f"{kind} {namespace + '/' if namespace else ''}{name}"


def _prune(kube: KubeApi, paths: _Paths, key: str) -> bool:
    """Delete the object `key` names unless another inventory owns it; False when it is already gone."""
    namespace, name, group, kind = key.split("_", 3)
    for api_version in _served_versions(kube, group):
        obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace or None}}
        try:
            path = paths.of(obj)
        except ManifestSyncError:
            continue
        live = kube.get(path)
        if live is None:
            return False
        if _owner(live) not in (None, INVENTORY_NAME):
            return False
        kube.delete(path)
        return True
    return False


def _served_versions(kube: KubeApi, group: str) -> list[str]:
    if not group:
        return ["v1"]
    found = kube.get(f"/apis/{group}") or {}
    return [version["groupVersion"] for version in found.get("versions") or ()]


def _write_inventory(kube: KubeApi, keys: set[str]) -> None:
    kube.apply(_inventory_path(), {"apiVersion": "v1", "kind": "ConfigMap",
                                   "metadata": {"name": INVENTORY_NAME, "namespace": INVENTORY_NAMESPACE},
                                   "data": {key: "" for key in sorted(keys)}}, FIELD_MANAGER)


def rollout_problem(obj: Optional[Mapping]) -> Optional[str]:
    """None once a Deployment or DaemonSet has rolled out its current spec (other kinds: at once)."""
    if obj is None or obj.get("kind") not in ("Deployment", "DaemonSet"):
        return None
    status, generation = obj.get("status") or {}, (obj.get("metadata") or {}).get("generation", 0)
    if status.get("observedGeneration", 0) < generation:
        return f"{subject(obj)}: its new spec is not observed yet"
    if obj["kind"] == "Deployment":
        wanted = (obj.get("spec") or {}).get("replicas", 1)
        updated, available = status.get("updatedReplicas", 0), status.get("availableReplicas", 0)
    else:
        wanted = status.get("desiredNumberScheduled", 0)
        updated, available = status.get("updatedNumberScheduled", 0), status.get("numberAvailable", 0)
    if updated < wanted or available < wanted:
        return f"{subject(obj)}: {updated} of {wanted} updated, {available} available"
    return None


def wait_rolled_out(kube: KubeApi, objects: Sequence[Mapping], *, timeout: float, backoff: Backoff,
                    on_progress: Callable[[str], None], clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> None:
    paths = _Paths(kube)
    waited = [obj for obj in objects if obj.get("kind") in ("Deployment", "DaemonSet")]

    def check(_remaining: float) -> None:
        problems = [problem for obj in waited if (problem := rollout_problem(kube.get(paths.of(obj))))]
        if problems:
            on_progress(f"waiting: {'; '.join(problems)}")
            raise _NotRolledOut("; ".join(problems))

    try:
        call_with_retry(check, timeout=timeout, what="the bootstrap manifests' rollout", backoff=backoff,
                        retry_if=lambda error: isinstance(error, _NotRolledOut) or getattr(error, "retryable", False),
                        clock=clock, sleep=sleep)
    except GaveUp as exc:
        raise ManifestSyncError(f"not rolled out after {timeout:g}s: {exc.last_error}") from None


class _NotRolledOut(Exception):
    pass
