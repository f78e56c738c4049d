"""Cordon and drain a Kubernetes node before a reboot Talos does not drain for, and uncordon it after.

Talos 1.13's upgrade API installs the new version and leaves the reboot to the caller, and Talos's
Reboot sequence stops pods without moving them, so `talosctl upgrade` drains on the client side
(`--drain`, on by default, 5 minutes). This does the same, as `kubectl drain --ignore-daemonsets
--delete-emptydir-data --force` would: the node is cordoned; DaemonSet pods stay (their controller
would put them straight back), mirror pods stay (the kubelet's own static pods), finished pods stay
(nothing runs); every other pod is evicted through the Eviction API, so PodDisruptionBudgets hold: an
eviction a budget refuses for now (HTTP 429) is asked again until the drain's timeout, and the drain
then waits until the evicted pods are gone from the node. Any failure raises DrainError naming the node
and the pods left; the node stays cordoned until `uncordon`.

No Pulumi here; the API is cluster_health.KubeApi, clock and sleep are injectable.
"""

from __future__ import annotations

import time
from typing import Callable, Mapping, Optional
from urllib.parse import quote, urlencode

from talos_proxmox.day_two.cluster_health import KubeApi, KubeApiError

DEFAULT_DRAIN_TIMEOUT = 300.0  # talosctl upgrade --drain-timeout
POLL_SECONDS = 2.0
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
TOO_MANY_REQUESTS = 429  # the Eviction API's answer while a PodDisruptionBudget does not allow it


class DrainError(RuntimeError):
    """The node could not be drained in time; the message names it and what was left."""


def _pod_name(pod: Mapping) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"  # every pod the API lists has both


def _stays(pod: Mapping) -> bool:
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return True
    if any(owner.get("kind") == "DaemonSet" and owner.get("controller") for owner in meta.get("ownerReferences") or ()):
        return True
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pods_to_evict(pod_list: Optional[Mapping]) -> list[dict]:
    """The pods of a node's pod list that a drain evicts (see the module docstring), in list order."""
    return [pod for pod in (pod_list or {}).get("items") or () if not _stays(pod)]


def is_unschedulable(api: KubeApi, node: str) -> bool:
    """Whether the Node is cordoned already (by someone else, before a drain): then it stays so after."""
    found = api.get(f"/api/v1/nodes/{quote(node)}")
    if found is None:
        raise DrainError(f"node {node}: no such Kubernetes Node")
    return bool((found.get("spec") or {}).get("unschedulable"))


def set_unschedulable(api: KubeApi, node: str, unschedulable: bool) -> None:
    """Cordon (True) or uncordon (False) the Node `node`; a Node that does not exist is an error."""
    if api.patch(f"/api/v1/nodes/{quote(node)}", {"spec": {"unschedulable": unschedulable}}) is None:
        raise DrainError(f"node {node}: no such Kubernetes Node to {'cordon' if unschedulable else 'uncordon'}")


def pods_on(api: KubeApi, node: str) -> Optional[dict]:
    return api.get("/api/v1/pods?" + urlencode({"fieldSelector": f"spec.nodeName={node}"}))


def _evict(api: KubeApi, pod: Mapping) -> bool:
    """Ask for the pod's eviction; False when a disruption budget refuses it for now."""
    meta = pod["metadata"]
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
    try:
        api.post(f"/api/v1/namespaces/{quote(meta['namespace'])}/pods/{quote(meta['name'])}/eviction", body)
    except KubeApiError as exc:
        if exc.status == TOO_MANY_REQUESTS:
            return False
        raise
    return True  # evicted, or already gone (404)


def drain(api: KubeApi, node: str, *, timeout: float = DEFAULT_DRAIN_TIMEOUT, poll: float = POLL_SECONDS,
          on_event: Optional[Callable[[str], None]] = None, sleep=time.sleep, clock=time.monotonic) -> int:
    """Cordon `node`, evict its pods and wait until they are gone; returns how many were evicted.
    An API error that may pass (a timeout, a 5xx) is tried again at the next poll until the deadline."""
    event = on_event or (lambda _what: None)
    deadline = clock() + timeout
    evicting: Optional[list[dict]] = None
    pending: list[dict] = []
    while True:
        try:
            if evicting is None:
                set_unschedulable(api, node, True)
                event("cordoned")
                evicting = pods_to_evict(pods_on(api, node))
                pending = list(evicting)
            pending = [pod for pod in pending if not _evict(api, pod)]
            on_node = {(_pod_name(p), p["metadata"].get("uid")) for p in pods_to_evict(pods_on(api, node))}
            left = [pod for pod in evicting if (_pod_name(pod), pod["metadata"].get("uid")) in on_node]
            if not left:
                event(f"drained ({len(evicting)} pod(s) evicted)")
                return len(evicting)
            problem = f"still on it: {', '.join(_describe(pod, pending) for pod in left)}"
        except KubeApiError as exc:
            if not exc.retryable:
                raise DrainError(f"node {node}: drain failed: {exc}") from None
            problem = f"last error: {exc}"
        if clock() >= deadline:
            raise DrainError(f"node {node}: not drained after {timeout:g}s; {problem}")
        event(f"draining: {problem}")
        sleep(min(poll, max(deadline - clock(), 0.0)))


def _describe(pod: Mapping, refused: list[dict]) -> str:
    name = _pod_name(pod)
    return name + (" (eviction refused by a disruption budget)" if any(_pod_name(p) == name for p in refused) else "")
