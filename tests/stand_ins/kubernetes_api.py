"""A stand-in Kubernetes API server: HTTPS on 127.0.0.1 with its own cluster CA, demanding the
kubeconfig's client certificate (or a bearer token), answering the reads of the health check, Helm's
release Secrets, and what a drain does: cordon and uncordon (PATCH of a Node), the pods on a node, their
evictions (policy/v1 Eviction), and a Node's deletion. Every request is recorded in order.

For the unit and provider tests of the drain, the health wait and Helm's release mode, which script its
answers poll by poll (a budget refusing N evictions, a pod lingering while terminating) and need no
binaries. The engine tier runs a real control plane instead (kubernetes_cluster.py)."""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import yaml

from talos_proxmox.talos_config.pki import b64_pem, issue_certificate, new_ca
from talos_proxmox.talos_api.tls_bridge import load_cert_chain
from tests.stand_ins.kubernetes_cluster import Change

NODES_PATH = "/api/v1/nodes"
PODS_PATH = "/api/v1/namespaces/kube-system/pods"
DAEMONSETS_PATH = "/apis/apps/v1/namespaces/kube-system/daemonsets"
COREDNS_PATH = "/apis/apps/v1/namespaces/kube-system/deployments/coredns"
SECRETS_PATH = "/api/v1/namespaces/kube-system/secrets"
ALL_PODS_PATH = "/api/v1/pods"


def _change(method: str, path: str, body: dict) -> Change:
    """A change as the audit log records it: PATCH .../nodes/<name>, POST .../namespaces/<ns>/pods/<name>/eviction."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    if method == "POST" and len(parts) == 7 and parts[-1] == "eviction":
        return Change(time.monotonic(), "create", "pods", "eviction", parts[3], parts[5], body, 0)
    return Change(time.monotonic(), method.lower(), parts[-2] if len(parts) > 1 else "", "", "", parts[-1], body, 0)


def workload_pod(name: str, node_name: str, namespace: str = "default", owner: str | None = "ReplicaSet",
                 mirror: bool = False, phase: str = "Running") -> dict:
    """A pod bound to `node_name`, owned by a controller of kind `owner` (None: a bare pod); `mirror`
    makes it a static pod's mirror, as the kubelet registers it."""
    meta = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": f"{name}-owner", "controller": True}]
    if mirror:
        meta["annotations"] = {"kubernetes.io/config.mirror": "0123"}
    return {"metadata": meta, "spec": {"nodeName": node_name}, "status": {"phase": phase}}


def helm_release_secret(release: str, revision: int, status: str) -> dict:
    """A Helm 3 release revision as Helm stores it (the release itself, in `data`, is left out)."""
    return {"metadata": {"name": f"sh.helm.release.v1.{release}.v{revision}", "namespace": "kube-system",
                         "labels": {"owner": "helm", "name": release, "status": status, "version": str(revision)}},
            "type": "helm.sh/release.v1"}


def node(name, ready, reason=None, message=None, control_plane=None):
    """A Node; names starting with master/cp (or control_plane=True) carry the control-plane role label."""
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    if reason:
        condition.update(reason=reason, message=message)
    is_cp = control_plane if control_plane is not None else ("master" in name or "cp-" in name)
    labels = {"node-role.kubernetes.io/control-plane": ""} if is_cp else {}
    return {"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {"conditions": [condition]}}


def static_pods(nodes, phase="Running", ready=True):
    """The three control-plane static pods of each control-plane node, as Talos runs them."""
    items = []
    for n in nodes:
        if "node-role.kubernetes.io/control-plane" not in n["metadata"]["labels"]:
            continue
        for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
            items.append({"metadata": {"name": f"{component}-{n['metadata']['name']}", "labels": {"k8s-app": component}},
                          "spec": {"nodeName": n["metadata"]["name"]},
                          "status": {"phase": phase, "conditions": [{"type": "Ready", "status": str(ready)}]}})
    return {"kind": "PodList", "items": items}


def daemonsets(name="cilium", desired=2, ready=2):
    return {"kind": "DaemonSetList", "items": [
        {"metadata": {"name": name}, "status": {"desiredNumberScheduled": desired, "numberReady": ready}}]}


def coredns(available, replicas=2):
    return {"spec": {"replicas": replicas}, "status": {
        "availableReplicas": available,
        "conditions": [{"type": "Available", "status": "True" if available else "False"}]}}


NOT_READY = node("worker-1", False, "KubeletNotReady", "container runtime network not ready: cni plugin not initialized")


class StandInApi:
    """The far side only: an HTTPS server with the cluster CA's certificate, requiring a client cert.

    `states` is a list of (nodes, coredns deployment or None[, pods, daemonsets]) served in turn, one per
    poll; the last one repeats. Without pods and daemonsets, each control plane's static pods and a
    Cilium DaemonSet over every node are served healthy. Requests are recorded with the client
    certificate's subject.
    """

    def __init__(self, states, token=None):
        self.ca_pem, ca_key = new_ca(organizations=["kubernetes"], key_type="ecdsa-p256")
        server_pem, server_key = issue_certificate(self.ca_pem, ca_key, common_name="kube-apiserver",
                                                   ip_addresses=["127.0.0.1"], key_type="ecdsa-p256", server=True)
        self.client_pem, self.client_key = issue_certificate(
            self.ca_pem, ca_key, common_name="admin", organizations=["system:masters"], key_type="ecdsa-p256",
            client=True)
        self.states = list(states)
        self.token = token
        self.requests: list[tuple[str, str]] = []
        self.deletable: set[str] = set()  # Node names a DELETE finds
        # What a drain works on: workload pods (any namespace, spec.nodeName set), which Nodes are
        # cordoned, and per pod name how many evictions a disruption budget still refuses (429).
        self.pods: list[dict] = []
        self.unschedulable: dict[str, bool] = {}
        self.evictions_refused: dict[str, int] = {}
        self.lingering: dict[str, int] = {}  # pod name -> how many more pod lists show it once evicted (terminating)
        self.terminating: list[dict] = []
        self.refuse_uncordon = False  # answer an uncordon with 403, as for credentials without that right
        # (time.monotonic(), "METHOD path", JSON body) of every PATCH and POST, in order; the time is the
        # clock FakeTalosNode's RecordedCall.at uses, so calls to both sides can be put in one order.
        self.changes: list[tuple[float, str, dict]] = []
        self.audit_log: list[Change] = []  # the same changes as the real API server's audit log has them
        self.secrets: list[dict] = []  # kube-system Secrets, e.g. Helm's release revisions (helm_release_secret)
        self.polls = 0
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        load_cert_chain(context, server_pem, server_key)
        if token is None:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=self.ca_pem.decode())
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_):
                pass

            def do_GET(self):
                peer = self.connection.getpeercert() or {}
                subject = dict(x[0] for x in peer.get("subject", ()))
                api.requests.append((self.path, subject.get("organizationName", "")))
                if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
                    return self._send(401, {"kind": "Status", "reason": "Unauthorized"})
                state = api.states[min(api.polls, len(api.states) - 1)]
                nodes, deployment = state[:2]
                pods = state[2] if len(state) > 2 else static_pods(nodes)
                sets = state[3] if len(state) > 3 else daemonsets(desired=len(nodes), ready=len(nodes))
                if self.path == NODES_PATH:
                    return self._send(200, {"kind": "NodeList", "items": nodes})
                if self.path.startswith(NODES_PATH + "/"):
                    name = self.path.rsplit("/", 1)[-1]
                    found = next((n for n in nodes if n["metadata"]["name"] == name), None)
                    if found is None:
                        return self._send(404, {"kind": "Status", "reason": "NotFound"})
                    spec = {**found.get("spec", {}), "unschedulable": api.unschedulable.get(name, False)}
                    return self._send(200, {**found, "spec": spec})
                if self.path == PODS_PATH:
                    return self._send(200, pods)
                if self.path == DAEMONSETS_PATH:
                    return self._send(200, sets)
                path, _, query = self.path.partition("?")
                if path == ALL_PODS_PATH:
                    selector = parse_qs(query).get("fieldSelector", [""])[0]
                    on = selector.removeprefix("spec.nodeName=")
                    listed = [p for p in api.pods + api.terminating if p["spec"].get("nodeName") == on]
                    for pod in list(api.terminating):
                        name = pod["metadata"]["name"]
                        api.lingering[name] -= 1
                        if api.lingering[name] <= 0:
                            api.terminating.remove(pod)
                    return self._send(200, {"kind": "PodList", "items": listed})
                if path == SECRETS_PATH:
                    wanted = dict(pair.split("=", 1) for pair in
                                  parse_qs(query).get("labelSelector", [""])[0].split(",") if pair)
                    items = [secret for secret in api.secrets
                             if all(secret["metadata"]["labels"].get(k) == v for k, v in wanted.items())]
                    return self._send(200, {"kind": "SecretList", "items": items})
                if self.path == COREDNS_PATH:
                    api.polls += 1  # the second read of a poll
                    return self._send(404, {}) if deployment is None else self._send(200, deployment)
                return self._send(404, {})

            def _body(self, method):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                api.requests.append((f"{method} {self.path}", self.headers.get("Content-Type", "")))
                api.changes.append((time.monotonic(), f"{method} {self.path}", body))
                api.audit_log.append(_change(method, self.path, body))
                return body

            def _refused(self):
                if api.token is not None and self.headers.get("Authorization") != f"Bearer {api.token}":
                    self._send(401, {"kind": "Status", "reason": "Unauthorized"})
                    return True
                return False

            def do_PATCH(self):
                body = self._body("PATCH")
                if self._refused():
                    return None
                name = self.path.rsplit("/", 1)[-1]
                known = {n["metadata"]["name"] for state in api.states for n in state[0]}
                if not self.path.startswith(NODES_PATH + "/") or name not in known:
                    return self._send(404, {"kind": "Status", "reason": "NotFound"})
                if api.refuse_uncordon and not body.get("spec", {}).get("unschedulable"):
                    return self._send(403, {"kind": "Status", "reason": "Forbidden"})
                api.unschedulable[name] = bool(body.get("spec", {}).get("unschedulable"))
                return self._send(200, {"kind": "Node", "metadata": {"name": name}})

            def do_POST(self):
                self._body("POST")
                if self._refused():
                    return None
                parts = self.path.strip("/").split("/")  # api v1 namespaces <ns> pods <name> eviction
                if len(parts) != 7 or parts[-1] != "eviction":
                    return self._send(404, {"kind": "Status", "reason": "NotFound"})
                namespace, name = parts[3], parts[5]
                pod = next((p for p in api.pods if (p["metadata"]["namespace"], p["metadata"]["name"]) == (namespace, name)), None)
                if pod is None:
                    return self._send(404, {"kind": "Status", "reason": "NotFound"})
                if api.evictions_refused.get(name, 0) > 0:
                    api.evictions_refused[name] -= 1
                    return self._send(429, {"kind": "Status", "reason": "TooManyRequests",
                                            "message": "Cannot evict pod as it would violate the pod's disruption budget."})
                api.pods.remove(pod)
                if api.lingering.get(name, 0) > 0:
                    api.terminating.append(pod)
                return self._send(201, {"kind": "Status", "status": "Success"})

            def do_DELETE(self):
                api.requests.append((f"DELETE {self.path}", ""))
                name = self.path.rsplit("/", 1)[-1]
                if self.path.startswith(NODES_PATH + "/") and name in api.deletable:
                    api.deletable.discard(name)
                    return self._send(200, {"kind": "Status", "status": "Success"})
                return self._send(404, {"kind": "Status", "reason": "NotFound"})

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.server = f"https://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def kubeconfig(self, ca_pem=None, with_client_cert=True, token=None, key_pem=None):
        user = {}
        if with_client_cert:
            user = {"client-certificate-data": b64_pem(self.client_pem),
                    "client-key-data": b64_pem(key_pem or self.client_key)}
        if token:
            user["token"] = token
        return yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "admin@test-cluster",
            "clusters": [{"name": "test-cluster", "cluster": {
                "server": self.server, "certificate-authority-data": b64_pem(ca_pem or self.ca_pem)}}],
            "contexts": [{"name": "admin@test-cluster", "context": {"cluster": "test-cluster", "user": "admin"}}],
            "users": [{"name": "admin", "user": user}],
        })

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
