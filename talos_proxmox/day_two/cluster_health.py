"""Is the cluster healthy? Asked of the Kubernetes API, at the bar `talosctl health` sets for it:
every expected node registered, Ready and schedulable; on every control plane the static pods
kube-apiserver, kube-controller-manager and kube-scheduler running and ready; kube-proxy, or Cilium as
its replacement, ready on every node it runs on; CoreDNS available.

`wait_for_health` polls until all hold or the timeout passes, then raises `ClusterNotHealthy` naming
what was still wrong on the last poll (check, node, what was seen). The API is reached with the cluster's admin kubeconfig
(server, CA, client certificate or token) over Python's ssl; the check functions take the API's JSON
so they are testable on their own. No Pulumi import here.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import yaml

from talos_proxmox.talos_config.pki import PKIError, pem_from_b64, standard_key_pem
from talos_proxmox.talos_api.tls_bridge import load_cert_chain

COREDNS_NAMESPACE = "kube-system"
SYSTEM_NAMESPACE = "kube-system"
CONTROL_PLANE_LABEL = "node-role.kubernetes.io/control-plane"
# Talos's static pods, labelled k8s-app=<component> and bound to their node.
CONTROL_PLANE_COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")
# kube-proxy, or with Cilium's kube-proxy replacement the Cilium agent, on every node.
PROXY_DAEMONSETS = ("kube-proxy", "cilium")
COREDNS_DEPLOYMENT = "coredns"
DEFAULT_POLL_SECONDS = 5.0
REQUEST_TIMEOUT_SECONDS = 10.0


class KubeconfigError(ValueError):
    """The kubeconfig cannot be used; the message names the field, never a credential."""


class ClusterNotHealthy(TimeoutError):
    """The cluster did not become healthy in time; `problems` is what the last poll found."""

    def __init__(self, server: str, timeout_seconds: float, problems: list[str]):
        self.problems = problems
        super().__init__(
            f"cluster at {server} not healthy after {timeout_seconds:g}s (health.timeoutSeconds); last check:\n"
            + "\n".join(f"  - {p}" for p in problems))


class KubeApiError(Exception):
    """An API call failed; `retryable` says whether a later poll may succeed; `status` is the HTTP
    status when the API answered (429: an eviction a PodDisruptionBudget refuses for now)."""

    def __init__(self, message: str, retryable: bool, status: Optional[int] = None):
        self.retryable, self.status = retryable, status
        super().__init__(message)


# ---------------------------------------------------------------- kubeconfig


@dataclass(frozen=True)
class KubeAccess:
    server: str
    ca_pem: Optional[bytes]
    cert_pem: Optional[bytes]
    key_pem: Optional[bytes]
    token: Optional[str]
    insecure: bool = False

    def __repr__(self) -> str:  # never show credentials
        return f"KubeAccess(server={self.server!r})"


def read_kubeconfig(text: str, context: Optional[str] = None) -> KubeAccess:
    """Server and credentials of `context` (default: current-context) of a kubeconfig YAML."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise KubeconfigError("kubeconfig: not valid YAML") from None
    if not isinstance(doc, Mapping):
        raise KubeconfigError("kubeconfig: expected a mapping with clusters, users and contexts")
    name = context or doc.get("current-context")
    if not name:
        raise KubeconfigError("kubeconfig: current-context is empty (expected the name of a context)")
    ctx = _named(doc, "contexts", "context", name)
    cluster = _named(doc, "clusters", "cluster", ctx.get("cluster"))
    user = _named(doc, "users", "user", ctx.get("user"))
    server = cluster.get("server")
    if not isinstance(server, str) or not server.startswith("https://"):
        raise KubeconfigError(f"kubeconfig: cluster {ctx.get('cluster')!r} server {server!r} is not an https:// URL")
    try:
        ca = cluster.get("certificate-authority-data")
        ca_pem = pem_from_b64(ca, field="certificate-authority-data") if ca else None
        cert = user.get("client-certificate-data")
        key = user.get("client-key-data")
        cert_pem = pem_from_b64(cert, field="client-certificate-data") if cert else None
        key_pem = standard_key_pem(pem_from_b64(key, field="client-key-data")) if key else None
    except PKIError as exc:
        raise KubeconfigError(f"kubeconfig: {exc}") from None
    token = user.get("token")
    if (cert_pem is None) != (key_pem is None):
        raise KubeconfigError("kubeconfig: client-certificate-data and client-key-data must be given together")
    if cert_pem is None and not token:
        raise KubeconfigError(f"kubeconfig: user {ctx.get('user')!r} has neither a client certificate nor a token")
    return KubeAccess(server=server.rstrip("/"), ca_pem=ca_pem, cert_pem=cert_pem, key_pem=key_pem,
                      token=token or None, insecure=bool(cluster.get("insecure-skip-tls-verify")))


def _named(doc: Mapping, section: str, field: str, name: Any) -> Mapping:
    for entry in doc.get(section) or ():
        if isinstance(entry, Mapping) and entry.get("name") == name and isinstance(entry.get(field), Mapping):
            return entry[field]
    raise KubeconfigError(f"kubeconfig: {section} has no entry named {name!r}")


# ---------------------------------------------------------------- API client


class KubeApi:
    """JSON client for the few calls we make: the health check's reads, deleting a removed node,
    whether a Helm release is deployed, a drain's cordon, pod list and evictions, and the bootstrap
    manifests' server-side apply."""

    def __init__(self, access: KubeAccess, request_timeout: float = REQUEST_TIMEOUT_SECONDS):
        self.server = access.server
        self._token = access.token
        self._timeout = request_timeout
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if access.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif access.ca_pem is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.load_verify_locations(cadata=access.ca_pem.decode("ascii"))
        if access.cert_pem is not None and access.key_pem is not None:
            load_cert_chain(context, access.cert_pem, access.key_pem)
        # Environment proxies are not used: the API server sits on the cluster's own network.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                                   urllib.request.HTTPSHandler(context=context))

    def get(self, path: str) -> Optional[dict]:
        """The JSON object at `path`, or None when the API answers 404."""
        return self._request("GET", path)

    def delete(self, path: str) -> Optional[dict]:
        """DELETE `path`; None when it is already gone (404)."""
        return self._request("DELETE", path)

    def patch(self, path: str, body: Mapping) -> Optional[dict]:
        """A strategic-merge PATCH of the object at `path` (as kubectl cordon sends); None on 404."""
        return self._request("PATCH", path, body, "application/strategic-merge-patch+json")

    def apply(self, path: str, body: Mapping, field_manager: str) -> Optional[dict]:
        """Server-side apply of `body` to the object at `path` as `field_manager`, taking over fields other
        managers hold (force), as Talos applies its manifests; None on 404 (an unknown type)."""
        separator = "&" if "?" in path else "?"
        return self._request("PATCH", f"{path}{separator}fieldManager={field_manager}&force=true", body,
                             "application/apply-patch+yaml")

    def post(self, path: str, body: Mapping) -> Optional[dict]:
        """POST `body` to `path` (e.g. a pod's eviction subresource); None on 404."""
        return self._request("POST", path, body, "application/json")

    def _request(self, method: str, path: str, body: Optional[Mapping] = None,
                 content_type: Optional[str] = None) -> Optional[dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, headers={"Accept": "application/json"},
                                         method=method)
        if content_type:
            request.add_header("Content-Type", content_type)
        if self._token:
            request.add_header("Authorization", f"Bearer {self._token}")
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            retryable = exc.code not in (401, 403)
            hint = "" if retryable else " (the kubeconfig's credentials are refused)"
            raise KubeApiError(f"{method} {path}: HTTP {exc.code} {exc.reason}{hint}", retryable, exc.code) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            raise KubeApiError(f"{method} {self.server}{path}: {reason}", retryable=True) from None


# ---------------------------------------------------------------- checks (pure)


def node_problems(node_list: Optional[Mapping], expected_nodes: int) -> list[str]:
    """What keeps the nodes from being healthy: too few registered, or any not Ready."""
    items = (node_list or {}).get("items") or []
    problems = []
    if len(items) < expected_nodes:
        problems.append(f"{len(items)} of {expected_nodes} expected nodes registered")
    for node in items:
        name = (node.get("metadata") or {}).get("name", "?")
        unready = not_ready(node)
        if unready:
            problems.append(unready)
        if (node.get("spec") or {}).get("unschedulable"):
            problems.append(f"node {name} is not schedulable (cordoned)")
    return problems


def not_ready(node: Mapping) -> Optional[str]:
    """Why the Node is not Ready (`node worker-2 is not Ready (NodeStatusUnknown: ...)`), or None when it is."""
    name = (node.get("metadata") or {}).get("name", "?")
    ready = _condition(node, "Ready")
    if ready is None:
        return f"node {name}: no Ready condition yet"
    if ready.get("status") != "True":
        why = ": ".join(x for x in (ready.get("reason"), ready.get("message")) if x)
        return f"node {name} is not Ready" + (f" ({why})" if why else "")
    return None


def control_plane_pod_problems(node_list: Optional[Mapping], pod_list: Optional[Mapping]) -> list[str]:
    """Each control plane's static pods (apiserver, controller-manager, scheduler): present, Running, Ready."""
    nodes = (node_list or {}).get("items") or []
    control_planes = [(n.get("metadata") or {}).get("name", "?") for n in nodes
                      if CONTROL_PLANE_LABEL in ((n.get("metadata") or {}).get("labels") or {})]
    if nodes and not control_planes:
        return [f"no node has the {CONTROL_PLANE_LABEL} label yet"]
    pods = (pod_list or {}).get("items") or []
    problems = []
    for node in control_planes:
        for component in CONTROL_PLANE_COMPONENTS:
            pod = next((p for p in pods if (p.get("spec") or {}).get("nodeName") == node
                        and ((p.get("metadata") or {}).get("labels") or {}).get("k8s-app") == component), None)
            where = f"static pod {component} on {node}"
            if pod is None:
                problems.append(f"{where}: not found")
                continue
            phase = (pod.get("status") or {}).get("phase") or "Unknown"
            ready = _condition(pod, "Ready")
            if phase != "Running":
                problems.append(f"{where}: {phase}")
            elif ready is None or ready.get("status") != "True":
                why = (ready or {}).get("reason")
                problems.append(f"{where}: Running but not Ready" + (f" ({why})" if why else ""))
    return problems


def proxy_problems(daemonset_list: Optional[Mapping]) -> list[str]:
    """kube-proxy, or Cilium replacing it: its DaemonSet scheduled somewhere and ready on every node."""
    by_name = {(d.get("metadata") or {}).get("name"): d for d in (daemonset_list or {}).get("items") or []}
    name = next((n for n in PROXY_DAEMONSETS if n in by_name), None)
    if name is None:
        return [f"kube-proxy or its replacement: neither DaemonSet ({', '.join(PROXY_DAEMONSETS)}) found yet"]
    status = by_name[name].get("status") or {}
    desired, ready = status.get("desiredNumberScheduled") or 0, status.get("numberReady") or 0
    if desired == 0 or ready < desired:
        what = name if name == "kube-proxy" else f"{name} (kube-proxy replacement)"
        return [f"{what}: {ready} of {desired} pods ready"]
    return []


def coredns_problems(deployment: Optional[Mapping]) -> list[str]:
    """What keeps CoreDNS from being available, per its Deployment's status."""
    where = f"CoreDNS ({COREDNS_NAMESPACE}/{COREDNS_DEPLOYMENT})"
    if deployment is None:
        return [f"{where}: Deployment not found yet"]
    status = deployment.get("status") or {}
    wanted = (deployment.get("spec") or {}).get("replicas", 1)
    available = status.get("availableReplicas") or 0
    condition = _condition(deployment, "Available")
    if available >= 1 and condition is not None and condition.get("status") == "True":
        return []
    return [f"{where}: {available} of {wanted} replicas available"]


def _condition(obj: Mapping, kind: str) -> Optional[Mapping]:
    for condition in (obj.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return condition
    return None


def cluster_problems(api: KubeApi, expected_nodes: int) -> list[str]:
    """One poll: everything that is not healthy yet (empty when healthy)."""
    problems: list[str] = []
    try:
        nodes = api.get("/api/v1/nodes")
        problems += node_problems(nodes, expected_nodes)
        problems += control_plane_pod_problems(nodes, api.get(f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/pods"))
        problems += proxy_problems(api.get(f"/apis/apps/v1/namespaces/{SYSTEM_NAMESPACE}/daemonsets"))
        problems += coredns_problems(
            api.get(f"/apis/apps/v1/namespaces/{COREDNS_NAMESPACE}/deployments/{COREDNS_DEPLOYMENT}"))
    except KubeApiError as exc:
        if not exc.retryable:
            raise
        problems.append(str(exc))
    return problems


def delete_node(api: KubeApi, name: str) -> str:
    """Delete a removed node's Node object (its kubelet is gone; the object would stay NotReady forever).
    Returns the step taken: deleted, or already gone."""
    from urllib.parse import quote

    return "kubernetes-node-deleted" if api.delete(f"/api/v1/nodes/{quote(name)}") is not None \
        else "kubernetes-node-already-gone"


def helm_release_deployed(api: KubeApi, namespace: str, release: str) -> bool:
    """Whether Helm has a deployed revision of `release`: Helm 3 keeps each revision as a Secret in the
    release's namespace labelled owner=helm, name=<release>, status=<status>."""
    from urllib.parse import quote, urlencode

    selector = urlencode({"labelSelector": f"owner=helm,name={release},status=deployed"})
    found = api.get(f"/api/v1/namespaces/{quote(namespace)}/secrets?{selector}")
    return bool(found and found.get("items"))


def wait_for_health(api: KubeApi, expected_nodes: int, timeout_seconds: float,
                    poll_seconds: float = DEFAULT_POLL_SECONDS,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep,
                    on_waiting: Optional[Callable[[str], None]] = None) -> int:
    """Poll until healthy; returns the number of polls. Raises ClusterNotHealthy on timeout. `on_waiting`
    hears what is still missing whenever that changes (a progress line for the long wait)."""
    started = clock()
    deadline = started + timeout_seconds
    polls, told = 0, None
    while True:
        polls += 1
        problems = cluster_problems(api, expected_nodes)
        if not problems:
            if on_waiting is not None and told is not None:
                on_waiting(f"healthy ({clock() - started:.0f}s)")
            return polls
        if on_waiting is not None and problems != told:
            on_waiting(f"waiting ({clock() - started:.0f}s): {'; '.join(problems)}")
            told = problems
        remaining = deadline - clock()
        if remaining <= 0:
            raise ClusterNotHealthy(api.server, timeout_seconds, problems)
        sleep(min(poll_seconds, remaining))
