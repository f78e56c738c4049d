"""A real Kubernetes control plane on loopback for the engine tier, under the stack's own Kubernetes CA.

Real (binaries built by scripts/tools.sh into .tools/bin, versions in scripts/tool-versions.env): etcd,
kube-apiserver, kube-controller-manager and kube-scheduler, each its own process on free 127.0.0.1 ports.
The API server's serving certificate, the admin client certificate and the controller manager's and the
scheduler's client certificates are all issued by the CA passed in (the Talos secrets bundle's `certs.k8s`),
so a kubeconfig issued from that bundle verifies against this server and authenticates to it. Admission,
RBAC, the controllers (deployment, replica set, disruption, service account, garbage collector, node
lifecycle...) and scheduling are Kubernetes' own code.

Played by kwok (sigs.k8s.io/kwok, managing every Node): the kubelets. It marks each Node Ready with a
heartbeat lease, and moves each pod bound to a node to Running and Ready (pod IPs from 10.0.0.0/24), and
finishes deleting pods: no container runs, nothing listens on the pod or node addresses, and there is no
network between pods. Its stages are tests/stand_ins/kwok-stages.yaml (kwok's own "fast" stages).

Who asked what: the API server's own audit log (`--audit-log-path`, policy AUDIT_POLICY) records every
change made as PROGRAM_USER, the user of the admin client certificates Talos's Kubeconfig RPC hands out
(CN=admin), with its request body; the tests' own requests (HARNESS_USER) and kwok's go unrecorded.
`KubeCluster.changes()` reads it.

The API server advertises ADVERTISE_ADDRESS, a documentation address no interface has: the address only
goes into the `kubernetes` Service's endpoints, and a loopback one is refused there.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import requests
import yaml
from cryptography.hazmat.primitives import serialization

from talos_proxmox.talos_config import pki
from tests.paths import REPO

TOOLS = REPO / ".tools" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
KWOK_STAGES = Path(__file__).with_name("kwok-stages.yaml")

ADVERTISE_ADDRESS = "192.0.2.10"  # TEST-NET-1 (RFC 5737)
SERVICE_CIDR = "10.96.0.0/12"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service, first address of SERVICE_CIDR
POD_CIDR = "10.0.0.1/24"  # kwok's pod IPs
NODE_IP = "10.0.0.1"  # kwok's address for every node
START_TIMEOUT = 90.0  # seconds for each component to answer ready, on a loaded 2-core machine
STOP_TIMEOUT = 10.0  # seconds between SIGTERM and SIGKILL
LOG_TAIL_LINES = 30
CONTROLLER_MANAGER_USER = "system:kube-controller-manager"  # the user names RBAC's bootstrap roles bind
SCHEDULER_USER = "system:kube-scheduler"

_PR_SET_PDEATHSIG = 1

PROGRAM_USER = "admin"  # the CN of the admin kubeconfig Talos hands out: what the program acts as
HARNESS_USER = "engine-test"  # the tests' own requests (and kwok's, as KWOK_USER), never audited
KWOK_USER = "kwok"
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [{"level": "Request", "users": [PROGRAM_USER],
               "verbs": ["create", "update", "patch", "delete", "deletecollection"]},
              {"level": "None"}],
}


@dataclass(frozen=True)
class Change:
    """One change the program made, from the audit log: `at` (time.monotonic() when the API server got it),
    `verb` (create, patch, delete...), `resource`/`subresource`/`namespace`/`name` as the request named
    them, `body` (the request object: a merge patch, an Eviction...) and the answer's HTTP `code`."""
    at: float
    verb: str
    resource: str
    subresource: str
    namespace: str
    name: str
    body: Any
    code: int


class KubeClusterError(RuntimeError):
    """A component did not start; the message names it and ends with the last lines of its log."""


def missing_binaries() -> list[str]:
    """The control plane's binaries not (yet) built into .tools/bin."""
    return [name for name in BINARIES if not os.access(TOOLS / name, os.X_OK)]


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports free on 127.0.0.1 right now: each held until all are picked (one at a
    time, the kernel may hand the same port out twice)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]


def kubeconfig_yaml(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    """A kubeconfig with everything inline (as Talos hands one out): server, CA, client certificate."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": f"{user}@kube-cluster",
        "clusters": [{"name": "kube-cluster", "cluster": {
            "server": server, "certificate-authority-data": pki.b64_pem(ca_pem)}}],
        "contexts": [{"name": f"{user}@kube-cluster", "context": {"cluster": "kube-cluster", "user": user}}],
        "users": [{"name": user, "user": {
            "client-certificate-data": pki.b64_pem(cert_pem), "client-key-data": pki.b64_pem(key_pem)}}],
    })


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it if the test process dies without running its cleanup."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as exc:
            return f"(no log: {exc})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after STOP_TIMEOUT; waits until it is gone."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                pass
        # Its group may outlive it (nothing here forks, but a leftover would hold a port).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()


@dataclass
class KubeCluster:
    """A running control plane: `url` of the API server, `ca_pem` (the CA given), `admin_kubeconfig`
    (YAML, the tests' own client certificate, CN=engine-test O=system:masters, issued by that CA) and
    `workdir` (its files, the audit log and each component's log, `<name>.log`)."""

    url: str
    ca_pem: bytes
    admin_kubeconfig: str
    workdir: Path
    session: requests.Session = field(repr=False)
    processes: dict = field(default_factory=dict, repr=False)  # component name -> its _Process

    def pause_api_server(self, seconds: float) -> None:
        """The API server stops answering for `seconds` (SIGSTOP, then SIGCONT): connections are accepted by
        the kernel and get no answer, as during a control plane's restart or a network partition."""
        pid = self.processes["kube-apiserver"].popen.pid
        os.kill(pid, signal.SIGSTOP)
        resume = threading.Timer(seconds, os.kill, args=(pid, signal.SIGCONT))
        resume.daemon = True
        resume.start()

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 30.0) -> requests.Response:
        """`method path` as the admin; `body` is sent as JSON (a merge patch for PATCH)."""
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body)
            headers["Content-Type"] = ("application/merge-patch+json" if method.upper() == "PATCH"
                                       else "application/json")
        return self.session.request(method, self.url + path, data=data, headers=headers, timeout=timeout)

    def changes(self) -> list[Change]:
        """Every change PROGRAM_USER made so far, in the order the API server received them."""
        offset = time.time() - time.monotonic()
        found = []
        for line in (self.workdir / "audit.log").read_text().splitlines():
            event = json.loads(line)
            ref = event.get("objectRef") or {}
            received = datetime.datetime.fromisoformat(event["requestReceivedTimestamp"].replace("Z", "+00:00"))
            found.append(Change(received.timestamp() - offset, event["verb"], ref.get("resource", ""),
                                ref.get("subresource", ""), ref.get("namespace", ""), ref.get("name", ""),
                                event.get("requestObject"), (event.get("responseStatus") or {}).get("code", 0)))
        return sorted(found, key=lambda change: change.at)

    def add_node(self, name: str, labels: Mapping[str, str] | None = None) -> dict:
        """Create Node `name` (kwok, managing every node, makes it Ready); returns the created object."""
        all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                      **(labels or {})}
        response = self.request("POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": all_labels}})
        if response.status_code != 201:
            raise KubeClusterError(f"creating node {name}: HTTP {response.status_code}: {response.text[:500]}")
        return response.json()


class _Starter:
    """Starts components one by one, each logging to workdir/<name>.log, and stops them all, newest first."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.processes: list[_Process] = []

    def start(self, name: str, args: Sequence[str]) -> _Process:
        log = self.workdir / f"{name}.log"
        with open(log, "wb") as out:
            popen = subprocess.Popen([str(TOOLS / args[0]), *args[1:]], stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, cwd=self.workdir, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        process = _Process(name, popen, log)
        self.processes.append(process)
        return process

    def wait_ready(self, process: _Process, probe: Callable[[], bool], what: str,
                   timeout: float = START_TIMEOUT) -> None:
        """Poll `probe` until it is true; raise with the log's tail if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            code = process.popen.poll()
            if code is not None:
                raise KubeClusterError(f"{process.name} exited with code {code} before {what}; "
                                       f"last lines of {process.log}:\n{process.tail()}")
            with contextlib.suppress(requests.RequestException):
                if probe():
                    return
            if time.monotonic() > deadline:
                raise KubeClusterError(f"{process.name}: no {what} after {timeout:.0f}s; "
                                       f"last lines of {process.log}:\n{process.tail()}")
            time.sleep(0.2)

    def stop_all(self) -> None:
        """Newest first: kwok and the controllers, then the API server, then etcd (the API server's
        graceful shutdown hangs once etcd is gone)."""
        while self.processes:
            self.processes.pop().stop()


def _ok(session: requests.Session, url: str) -> bool:
    response = session.get(url, timeout=2)
    return response.status_code == 200 and response.text.strip() == "ok"


def _write(path: Path, data: bytes | str, mode: int = 0o600) -> Path:
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    path.chmod(mode)
    return path


@contextlib.contextmanager
def kube_cluster(workdir: Path, kubernetes_ca_cert_pem: bytes, kubernetes_ca_key_pem: bytes, *,
                 service_account_key_pem: bytes | None = None,
                 apiserver_args: Sequence[str] = ()) -> Iterator[KubeCluster]:
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok, started in that order and
    each ready (its /readyz or /healthz) before the next; stopped in the reverse order on exit, whether
    the body raised or not. `service_account_key_pem`: the key that signs service-account tokens (the
    bundle's `certs.k8sserviceaccount`; a fresh RSA key if not given). `apiserver_args`: more flags for
    kube-apiserver (an alpha API turned on)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ca_pem, ca_key = kubernetes_ca_cert_pem, kubernetes_ca_key_pem
    key_type = pki.key_type_of(pki.load_key(ca_key))

    def client(common_name: str, organizations: Sequence[str] = ()) -> tuple[bytes, bytes]:
        return pki.issue_certificate(ca_pem, ca_key, common_name=common_name, organizations=organizations,
                                     key_type=key_type, client=True)

    ports = dict(zip(("etcd-client", "etcd-peer", "apiserver", "controller-manager", "scheduler", "kwok"),
                     free_ports(6)))
    url = f"https://127.0.0.1:{ports['apiserver']}"
    etcd_url = f"http://127.0.0.1:{ports['etcd-client']}"
    peer_url = f"http://127.0.0.1:{ports['etcd-peer']}"

    ca_file = _write(workdir / "ca.crt", ca_pem, 0o644)
    serving_cert, serving_key = pki.issue_certificate(
        ca_pem, ca_key, common_name="kube-apiserver", key_type=key_type, server=True,
        dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
                   "kubernetes.default.svc.cluster.local"),
        ip_addresses=("127.0.0.1", SERVICE_IP))
    serving_cert_file = _write(workdir / "apiserver.crt", serving_cert, 0o644)
    serving_key_file = _write(workdir / "apiserver.key", serving_key)
    sa_key = service_account_key_pem or pki.encode_private_key(pki.new_private_key("rsa-2048"))
    sa_key_file = _write(workdir / "sa.key", sa_key)
    sa_pub_file = _write(workdir / "sa.pub", pki.load_key(sa_key).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    admin_cert, admin_key = client(HARNESS_USER, ("system:masters",))
    admin_cert_file = _write(workdir / "admin.crt", admin_cert, 0o644)
    admin_key_file = _write(workdir / "admin.key", admin_key)
    admin_kubeconfig = kubeconfig_yaml(url, ca_pem, admin_cert, admin_key, HARNESS_USER)
    kubeconfigs = {"admin": _write(workdir / "admin.kubeconfig", admin_kubeconfig),
                   "kwok": _write(workdir / "kwok.kubeconfig",
                                  kubeconfig_yaml(url, ca_pem, *client(KWOK_USER, ("system:masters",)), KWOK_USER))}
    audit_policy = _write(workdir / "audit-policy.yaml", yaml.safe_dump(AUDIT_POLICY), 0o644)
    for name, user in (("controller-manager", CONTROLLER_MANAGER_USER), ("scheduler", SCHEDULER_USER)):
        kubeconfigs[name] = _write(workdir / f"{name}.kubeconfig", kubeconfig_yaml(url, ca_pem, *client(user), user))

    session = requests.Session()
    session.trust_env = False  # loopback only: no proxy, and REQUESTS_CA_BUNDLE must not replace our CA
    session.verify = str(ca_file)
    session.cert = (str(admin_cert_file), str(admin_key_file))

    starter = _Starter(workdir)
    try:
        etcd = starter.start("etcd", [
            "etcd", "--name=kube-cluster", f"--data-dir={workdir / 'etcd-data'}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=kube-cluster={peer_url}",
            "--unsafe-no-fsync",  # a throw-away member: no need to wait for the disk
        ])
        starter.wait_ready(etcd, lambda: _ok(session, etcd_url + "/readyz"), "/readyz")

        apiserver = starter.start("kube-apiserver", [
            "kube-apiserver", f"--etcd-servers={etcd_url}",
            "--bind-address=127.0.0.1", f"--secure-port={ports['apiserver']}",
            f"--advertise-address={ADVERTISE_ADDRESS}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            f"--tls-cert-file={serving_cert_file}", f"--tls-private-key-file={serving_key_file}",
            f"--client-ca-file={ca_file}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={sa_pub_file}", f"--service-account-signing-key-file={sa_key_file}",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true",
            f"--audit-policy-file={audit_policy}", f"--audit-log-path={workdir / 'audit.log'}",
            "--audit-log-format=json", "--audit-log-mode=blocking",  # written before each answer
            *apiserver_args,
        ])
        starter.wait_ready(apiserver, lambda: _ok(session, url + "/readyz"), "/readyz")

        # The controller manager and the scheduler, each as its own user (RBAC's bootstrap bindings) and
        # serving its /healthz under the same CA.
        for name, extra in (
            ("controller-manager", [f"--service-account-private-key-file={sa_key_file}", f"--root-ca-file={ca_file}",
                                    f"--service-cluster-ip-range={SERVICE_CIDR}",
                                    "--use-service-account-credentials=true"]),
            ("scheduler", []),
        ):
            kubeconfig, port = kubeconfigs[name], ports[name]
            cert, key = pki.issue_certificate(ca_pem, ca_key, common_name=f"kube-{name}", key_type=key_type,
                                              server=True, dns_names=("localhost",), ip_addresses=("127.0.0.1",))
            process = starter.start(f"kube-{name}", [
                f"kube-{name}", f"--kubeconfig={kubeconfig}", f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}", "--bind-address=127.0.0.1",
                f"--secure-port={port}", f"--tls-cert-file={_write(workdir / f'{name}.crt', cert, 0o644)}",
                f"--tls-private-key-file={_write(workdir / f'{name}.key', key)}", "--leader-elect=false", *extra])
            starter.wait_ready(process, lambda port=port: _ok(session, f"https://127.0.0.1:{port}/healthz"),
                               "/healthz")

        kwok = starter.start("kwok", [
            "kwok", f"--kubeconfig={kubeconfigs['kwok']}", f"--config={KWOK_STAGES}",
            "--manage-all-nodes=true", "--node-lease-duration-seconds=40",
            f"--cidr={POD_CIDR}", f"--node-ip={NODE_IP}", f"--server-address=127.0.0.1:{ports['kwok']}",
        ])
        starter.wait_ready(kwok, lambda: _ok(session, f"http://127.0.0.1:{ports['kwok']}/healthz"), "/healthz")

        yield KubeCluster(url, ca_pem, admin_kubeconfig, workdir, session,
                          {process.name: process for process in starter.processes})
    finally:
        session.close()
        starter.stop_all()
