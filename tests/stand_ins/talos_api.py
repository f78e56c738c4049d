"""A stand-in Talos node for tests and benchmarks: machine.MachineService (and the 1.13 upgrade API,
ImageService.Pull and LifecycleService.Upgrade) on a loopback address over real TLS.

Shape of the far side it stands in for:
  - maintenance mode: TLS with an Ed25519 certificate from a CA made at "boot", no client
    certificate asked for; ApplyConfiguration and Version only. An applied config makes the node
    "install and reboot": the listener goes away for `install_downtime` seconds and comes back in
    configured mode.
  - configured mode: mutual TLS; server certificate issued by the bundle's OS CA (Ed25519, SAN
    `host`), client certificates must chain to the OS CA (plus `accepted_cas`); the client
    certificate's Organization is its role, os:admin may call everything, os:reader only reads.
  - identity: made with a secrets bundle, the node trusts and is signed by that bundle's OS CA from
    the start; made with `bundle=None` (maintenance only), it learns them from the first config
    applied, as an installing node does: `machine.ca.crt` is the CA it trusts, `machine.ca.key` (a
    control plane's config) signs its own certificate, and a worker, whose config has no key, asks
    `trustd()` -> (OS CA certificate, key), standing in for trustd on the control planes.
  - address: `host` (default 127.0.0.1; any 127.0.0.x stands in for a node's own IP) and `port`
    (default: any free one; 50000 is what a real node listens on). Both certificates name `host`.

TLS is terminated by Python's ssl (OpenSSL; grpcio's BoringSSL cannot do Ed25519, see
talos_proxmox/talos_api/tls_bridge.py) in front of a plaintext grpcio server on another loopback port;
the service learns the caller's roles from the relay's connection table.

Test hooks: `calls` records every request (raw bytes, decoded message, gRPC metadata, roles,
mode); `fail_next(rpc, code, details, times)` injects errors; `delays[rpc]` sleeps before
answering; `behaviours[rpc] = fn(node, request, context)` replaces an RPC's answer; `reboot()`,
`go_down()`, `come_up()` drive the listener. State (`config`, `staged_config`, `bootstrapped`,
`etcd_members`, `services`, `version_tag`, `kubeconfig_yaml`, `kubeconfig_format`) is plain
attributes.
"""

from __future__ import annotations

import base64
import difflib
import functools
import gzip
import io
import select
import socket
import ssl
import tarfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Callable

import grpc
import pytest
import yaml
from google.protobuf import message_factory

from talos_proxmox.talos_config import pki, client_config, secrets_bundle
from talos_proxmox.talos_api import tls_bridge
from talos_proxmox.talos_api.client import ClientCredentials
from talos_proxmox.talos_api.generated.common import common_pb2
from talos_proxmox.talos_api.generated.cosi import resource_pb2
from talos_proxmox.talos_api.generated.machine import image_pb2, lifecycle_pb2, machine_pb2

SERVICE = machine_pb2.DESCRIPTOR.services_by_name["MachineService"]
STATE_SERVICE = resource_pb2.DESCRIPTOR.services_by_name["State"]
# Recorded as "<Service>/<Rpc>" (LifecycleService/Upgrade is not MachineService's Upgrade).
QUALIFIED_SERVICES = (image_pb2.DESCRIPTOR.services_by_name["ImageService"],
                      lifecycle_pb2.DESCRIPTOR.services_by_name["LifecycleService"])
MAINTENANCE_RPCS = {"ApplyConfiguration", "Version"}
READER_RPCS = {"Version", "ServiceList", "EtcdMemberList", "Get", "List"}
# The controlplane config resource Talos renders each static pod from, by type.
STATIC_POD_RESOURCES = {"APIServerConfigs.kubernetes.talos.dev": "kube-apiserver",
                        "ControllerManagerConfigs.kubernetes.talos.dev": "kube-controller-manager",
                        "SchedulerConfigs.kubernetes.talos.dev": "kube-scheduler"}
# Each component's image in a configuration: v1alpha1's path, or Talos 1.14's document of its own.
_IMAGE_PLACES = {"kube-apiserver": (("cluster", "apiServer"), "KubeAPIServerConfig"),
                 "kube-controller-manager": (("cluster", "controllerManager"), "KubeControllerManagerConfig"),
                 "kube-scheduler": (("cluster", "scheduler"), "KubeSchedulerConfig"),
                 "kube-proxy": (("cluster", "proxy"), "KubeProxyConfig"),
                 "kubelet": (("machine", "kubelet"), "KubeletConfig")}


def config_images(documents: list[dict]) -> dict[str, str]:
    """component -> image, as a configuration gives them (written here from Talos's config reference, not
    from the program's code, so a mistake on either side shows)."""
    found = {}
    for component, (path, kind) in _IMAGE_PLACES.items():
        for doc in documents:
            holder = doc if doc.get("kind") == kind else None
            if holder is None and doc.get("version") == "v1alpha1":
                holder = (doc.get(path[0]) or {}).get(path[1])
            if isinstance(holder, dict) and holder.get("image"):
                found[component] = holder["image"]
    return found
Mode = machine_pb2.ApplyConfigurationRequest


@dataclass
class RecordedCall:
    rpc: str
    raw: bytes
    request: Any
    metadata: dict[str, list[str]]
    roles: tuple[str, ...]
    mode: str
    at: float = field(default_factory=time.monotonic)


def talos_style_tgz(name: str, content: bytes) -> bytes:
    """A .tar.gz as Talos's Kubeconfig RPC writes it: the gzip stream is closed but the tar writer
    is not, so the last member's padding and the end-of-archive blocks are missing."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(content), 0o600, int(time.time())
        archive.addfile(info, io.BytesIO(content))
    return gzip.compress(buffer.getvalue()[: tarfile.BLOCKSIZE + len(content)])


def _pump_both_ways(tls: ssl.SSLSocket, plain: socket.socket) -> None:
    """Relay between a TLS socket and a plain one from a single thread (OpenSSL objects must not
    be read and written from two threads at once) until either side closes."""
    while True:
        readable = [tls] if tls.pending() else select.select([tls, plain], [], [])[0]
        try:
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                (plain if sock is tls else tls).sendall(data)
        except (OSError, ssl.SSLError):
            return


def _serialize(message) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


@functools.lru_cache(maxsize=None)
def _bundle_named(_name: str) -> dict:
    return secrets_bundle.generate_secrets("v1.11.5")


def shared_bundle(name: str = "cluster") -> dict:
    """A secrets bundle per name, made once per test session (generating one takes a while)."""
    return _bundle_named(name)


@pytest.fixture
def maintenance_node():
    """A stand-in node in maintenance mode for shared_bundle(); import this fixture to use it."""
    node = FakeTalosNode(shared_bundle(), mode="maintenance", install_downtime=0.3)
    yield node
    node.stop()


@pytest.fixture
def configured_node():
    """A stand-in node configured with shared_bundle()'s OS CA; import this fixture to use it."""
    node = FakeTalosNode(shared_bundle(), mode="configured", install_downtime=0.3)
    yield node
    node.stop()


def client_credentials(bundle: dict, role: str = "os:admin") -> ClientCredentials:
    """A client identity as a talosconfig holds it (talos_client's certificate, OS CA, Ed25519)."""
    cert, key = client_config.issue_admin_certificate(bundle, roles=(role,))
    return ClientCredentials(ca_pem=secrets_bundle.ca_pair(bundle, "os")[0], cert_pem=cert, key_pem=key)


def _handler_name(rpc: str) -> str:
    return "_rpc_" + rpc.replace("/", "_")


class _PeerDown(Exception):
    """The proxied-to node is down: apid answers UNAVAILABLE for it."""


class FakeTalosNode:
    def __init__(
        self,
        bundle: dict | None,
        *,
        mode: str = "maintenance",
        hostname: str = "talos-stand-in",
        install_downtime: float = 0.3,
        accepted_cas: tuple[bytes, ...] = (),
        version_tag: str = "v1.11.5",
        host: str = "127.0.0.1",
        port: int = 0,
        trustd: Callable[[], tuple[bytes, bytes]] | None = None,
    ):
        self.hostname = hostname
        self.host = host
        self.install_downtime = install_downtime
        self.version_tag = version_tag
        self.config: bytes | None = None
        self.staged_config: bytes | None = None
        self.bootstrapped = False
        self.recovery_snapshot: bytes | None = None  # what EtcdRecover uploaded, until a Bootstrap takes it
        self.etcd_restored_from: bytes | None = None  # the snapshot a Bootstrap with recover_etcd restored
        self.reset_requested = False
        self.kubeconfig_yaml = "apiVersion: v1\nkind: Config\nclusters: []\n"
        self.kubeconfig_format = "tgz"  # or "plain"
        self.kubeconfig_chunk = 0  # split the stream into chunks of this many bytes (0: one message)
        self.etcd_members = [machine_pb2.EtcdMember(id=0x1234ABCD, hostname=hostname,
                                                    peer_urls=["https://127.0.0.1:2380"],
                                                    client_urls=["https://127.0.0.1:2379"])]
        self.services = [machine_pb2.ServiceInfo(id=name, state="Running",
                                                 health=machine_pb2.ServiceHealth(healthy=True))
                         for name in ("apid", "etcd", "kubelet", "machined", "trustd")]
        # The MachineStatus resource: boot stage, and whether every boot condition is met.
        self.machine_stage = "running"
        # Talos resolves AUTO to a reboot for changes it cannot apply live (e.g. install or kernel args).
        self.auto_needs_reboot = False
        self.etcd_snapshot_data = b"etcd-snapshot:" + hostname.encode() + b":" + bytes(range(256)) * 10
        self.reboots = 0
        self.power: list[tuple[float, str]] = []  # (time.monotonic(), "up" or "down"), as it went
        # The 1.13 upgrade API: images pulled, the version the installer put on disk (booted at the next
        # reboot), and what the installer exits with.
        self.pulled_images: list[str] = []
        # MachineService.ImagePull (what upgrade-k8s pre-pulls with): (containerd namespace name, reference).
        self.image_pulls: list[tuple[str, str]] = []
        # The static pods Talos renders from a control plane's configuration: each component's image and
        # the version of its controlplane config resource (bumped when the image changes), and each change
        # as it came, (time.monotonic(), component, image). `on_static_pod(node, component, image, version)`
        # plays the kubelet running the new pod; `on_kubelet(node, image)` a kubelet restarted on a new image.
        self.static_pods: dict[str, tuple[str, int]] = {}
        self.static_pod_updates: list[tuple[float, str, str]] = []
        self.on_static_pod: Callable[["FakeTalosNode", str, str, int], None] | None = None
        self.on_kubelet: Callable[["FakeTalosNode", str], None] | None = None
        # The controlplane Manifests resources: (id, objects) pairs, or a function of the node giving them.
        self.manifests: Callable[["FakeTalosNode"], list[tuple[str, list[dict]]]] | None = None
        self.installed_tag: str | None = None
        self.installer_exit_code = 0
        # Called once the node has powered itself off (Shutdown), e.g. by the VM it runs in.
        self.on_power_off: Callable[[], None] | None = None
        self.unmet_conditions: list[dict] = []
        self.calls: list[RecordedCall] = []
        self.refused_handshakes = 0  # TLS handshakes that failed, e.g. a configured node asked without a client cert
        # Other nodes of a stand-in cluster by address: a `node` call naming one is answered by it, as
        # apid proxies it (tests.support.day_two.stand_in_cluster fills this).
        self.peers: dict[str, "FakeTalosNode"] = {}
        self.delays: dict[str, float] = {}
        # Set by stop: a delayed call ends with it, so a hung call does not outlive its test.
        self._stopped = threading.Event()
        self.behaviours: dict[str, Callable] = {}
        self._failures: dict[str, list[tuple[grpc.StatusCode, str]]] = {}
        self._lock = threading.Lock()

        self._accepted_cas = tuple(accepted_cas)
        self._trustd = trustd
        self._learns_identity = bundle is None
        self._client_cas = b""
        self._configured_identity: tuple[bytes, bytes] | None = None
        if bundle is not None:
            os_ca, os_key = secrets_bundle.ca_pair(bundle, "os")
            self._take_identity(os_ca, (os_ca, os_key))
        elif mode != "maintenance":
            raise ValueError("a stand-in node made without a secrets bundle must start in maintenance mode")
        maintenance_ca, maintenance_key = pki.new_ca(key_type="ed25519")
        self._maintenance_identity = pki.issue_certificate(
            maintenance_ca, maintenance_key, common_name="maintenance-service.talos.dev",
            ip_addresses=[host], key_type="ed25519", server=True)

        self._backend = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        self._backend.add_generic_rpc_handlers(self._handlers())
        self._backend_port = self._backend.add_insecure_port("127.0.0.1:0")
        self._backend.start()

        self._roles_by_port: dict[int, tuple[str, ...]] = {}
        self._open: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self.port = port
        self.mode = mode
        self.come_up()

    # --- addresses and lifecycle -----------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def _tls_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.set_alpn_protocols(["h2"])
        cert, key = self._maintenance_identity if self.mode == "maintenance" else self._configured_identity
        tls_bridge.load_cert_chain(context, cert, key)
        if self.mode == "configured":
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cadata=self._client_cas.decode("ascii"))
        return context

    def _take_identity(self, os_ca: bytes, signer: tuple[bytes, bytes]) -> None:
        """Trust client certificates from `os_ca`; serve a certificate for `host` signed by `signer`
        (CA certificate, key)."""
        signer_cert, signer_key = signer
        self._client_cas = b"".join((os_ca,) + self._accepted_cas)
        self._configured_identity = pki.issue_certificate(
            signer_cert, signer_key, common_name=self.hostname, ip_addresses=[self.host], key_type="ed25519",
            server=True)

    def _learn_identity(self, config: bytes, context: grpc.ServicerContext) -> None:
        try:
            documents = [d for d in yaml.safe_load_all(config) if isinstance(d, dict)]
            ca = next(d for d in documents if d.get("version") == "v1alpha1")["machine"]["ca"]
            os_ca, os_key = base64.b64decode(ca["crt"]), base64.b64decode(ca.get("key") or "")
        except (yaml.YAMLError, StopIteration, KeyError, TypeError, ValueError) as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"stand-in: no machine.ca in the config ({exc})")
        if os_key:
            self._take_identity(os_ca, (os_ca, os_key))
        elif self._trustd is not None:
            self._take_identity(os_ca, self._trustd())
        else:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "stand-in: a worker config needs trustd")

    def come_up(self, mode: str | None = None) -> None:
        """Start listening (on the same port as before, if any), optionally in another mode."""
        if mode is not None:
            self.mode = mode
        context = self._tls_context()
        self.power.append((time.monotonic(), "up"))
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(64)
        self.port = listener.getsockname()[1]
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener, context), daemon=True).start()

    def boot_from_iso(self) -> None:
        """Start as a new VM booting the Talos ISO: maintenance mode, nothing applied or bootstrapped."""
        self.config = self.staged_config = None
        self.bootstrapped = False
        self.come_up("maintenance")

    @property
    def is_up(self) -> bool:
        return self._listener is not None

    def go_down(self) -> None:
        """Stop listening and drop open connections, as a powered-off node would."""
        listener, self._listener = self._listener, None
        if listener is not None:
            self.power.append((time.monotonic(), "down"))
            try:
                listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() blocked in another thread
            except OSError:
                pass
            listener.close()
        with self._lock:
            sockets, self._open = self._open, set()
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def reboot(self, downtime: float, mode: str | None = None, after: float = 0.05) -> None:
        """In `after` seconds (so a reply in flight still leaves) go down, then come up in `mode`."""

        def cycle():
            time.sleep(after)
            self.reboots += 1
            self.go_down()
            time.sleep(downtime)
            self.come_up(mode)

        threading.Thread(target=cycle, daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        self.go_down()
        self._backend.stop(0)

    def _accept_loop(self, listener: socket.socket, context: ssl.SSLContext) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # listener closed by go_down
                return
            threading.Thread(target=self._serve_connection, args=(conn, context), daemon=True).start()

    def _serve_connection(self, conn: socket.socket, context: ssl.SSLContext) -> None:
        """Terminate TLS with blocking OpenSSL calls, which, like Go's crypto/tls, send the alert
        (certificate required, unknown CA, ...) before closing when a handshake fails."""
        with self._lock:
            self._open.add(conn)
        try:
            conn.settimeout(10)
            tls = context.wrap_socket(conn, server_side=True)  # detaches conn
            tls.settimeout(None)
        except (OSError, ssl.SSLError):
            self.refused_handshakes += 1
            conn.close()
            return
        peer = tls.getpeercert() or {}
        roles = tuple(value for rdn in peer.get("subject", ()) for key, value in rdn if key == "organizationName")
        backend = socket.create_connection(("127.0.0.1", self._backend_port))
        local_port = backend.getsockname()[1]
        self._roles_by_port[local_port] = roles
        with self._lock:
            self._open.update((tls, backend))
        try:
            _pump_both_ways(tls, backend)
        finally:
            self._roles_by_port.pop(local_port, None)
            with self._lock:
                self._open.difference_update((conn, tls, backend))
            tls.close()
            backend.close()

    # --- test hooks ----------------------------------------------------------------------------

    def fail_next(self, rpc: str, code: grpc.StatusCode, details: str = "", times: int = 1) -> None:
        with self._lock:
            self._failures.setdefault(rpc, []).extend([(code, details)] * times)

    def calls_for(self, rpc: str) -> list[RecordedCall]:
        return [call for call in self.calls if call.rpc == rpc]

    # --- gRPC service --------------------------------------------------------------------------

    def _handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        generic = []
        for service in (SERVICE, STATE_SERVICE, *QUALIFIED_SERVICES):
            handlers = {}
            for method in service.methods:
                rpc = f"{service.name}/{method.name}" if service in QUALIFIED_SERVICES else method.name
                request_class = message_factory.GetMessageClass(method.input_type)
                serve = self._serve_unary if not method.server_streaming else self._serve_stream
                handler = (grpc.unary_stream_rpc_method_handler if method.server_streaming
                           else grpc.unary_unary_rpc_method_handler)
                if method.client_streaming:  # an upload (EtcdRecover): taken whole, recorded as one request
                    serve, handler = self._serve_upload, grpc.stream_unary_rpc_method_handler
                # request_deserializer=None hands us the raw request bytes, which tests inspect.
                handlers[method.name] = handler(
                    self._bind(serve, rpc, request_class),
                    request_deserializer=None,
                    response_serializer=_serialize,
                )
            generic.append(grpc.method_handlers_generic_handler(service.full_name, handlers))
        return tuple(generic)

    @staticmethod
    def _bind(serve, rpc, request_class):
        return lambda raw, context: serve(rpc, request_class, raw, context)

    def _prepare(self, rpc: str, request_class, raw: bytes, context: grpc.ServicerContext):
        request = request_class.FromString(raw)
        metadata: dict[str, list[str]] = {}
        for key, value in context.invocation_metadata():
            metadata.setdefault(key, []).append(value)
        port = int(context.peer().rsplit(":", 1)[1])
        roles = self._roles_by_port.get(port, ())
        self.calls.append(RecordedCall(rpc, raw, request, metadata, roles, self.mode))
        if self.delays.get(rpc):
            self._stopped.wait(self.delays[rpc])
        with self._lock:
            queued = self._failures.get(rpc)
            failure = queued.pop(0) if queued else None
        if failure is not None:
            context.abort(*failure)
        if self.mode == "maintenance" and rpc not in MAINTENANCE_RPCS:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{rpc} is not available in maintenance mode")
        if self.mode == "configured" and "os:admin" not in roles and not (rpc in READER_RPCS and "os:reader" in roles):
            context.abort(grpc.StatusCode.PERMISSION_DENIED, "not authorized")
        return request, metadata

    def _targets(self, metadata) -> list[str | None]:
        """Who each reply part is from, as apid marks it: only a `nodes` call is proxied and fanned out
        with metadata.hostname set per node; a `node` call goes to that one node, whose own reply
        leaves the metadata empty, as does a call without either header."""
        return metadata.get("nodes") or [None]

    def _answering(self, metadata) -> "FakeTalosNode":
        target = (metadata.get("node") or [None])[0]
        peer = self.peers.get(target) if target else None
        if peer is not None and peer is not self and not peer.is_up:
            raise _PeerDown(target)
        return peer or self

    def _serve_unary(self, rpc, request_class, raw, context):
        request, metadata = self._prepare(rpc, request_class, raw, context)
        try:
            node = self._answering(metadata)
        except _PeerDown as down:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"error proxying to {down}: connection refused")
        behaviour = node.behaviours.get(rpc) or getattr(node, _handler_name(rpc))
        reply = behaviour(node, request, context) if rpc in node.behaviours else behaviour(request, context)
        if isinstance(reply, bytes):  # a behaviour may answer with hand-encoded bytes
            return reply
        # apid fills in which node each part of a proxied reply came from.
        template = reply.messages[0] if hasattr(reply, "messages") and len(reply.messages) else None
        if template is not None:
            del reply.messages[:]
            for target in self._targets(metadata):
                message = reply.messages.add()
                message.CopyFrom(template)
                if target is not None:
                    message.metadata.hostname = target
        return reply

    def _serve_upload(self, rpc, request_class, raws, context):
        whole = common_pb2.Data(bytes=b"".join(common_pb2.Data.FromString(raw).bytes for raw in raws))
        return self._serve_unary(rpc, request_class, whole.SerializeToString(), context)

    def _serve_stream(self, rpc, request_class, raw, context):
        request, metadata = self._prepare(rpc, request_class, raw, context)
        behaviour = self.behaviours.get(rpc) or getattr(self, _handler_name(rpc))
        chunks = behaviour(self, request, context) if rpc in self.behaviours else behaviour(request, context)
        target = self._targets(metadata)[0]
        for chunk in chunks:
            if target is not None:
                chunk.metadata.hostname = target
            yield chunk

    # --- default behaviour of each RPC, after Talos --------------------------------------------

    def _rpc_Get(self, request, context):
        """COSI State.Get: the MachineStatus resource, and the MachineConfig one (the config the node runs,
        as its spec; Talos re-encodes what it stores, which this stand-in does not)."""
        if (request.namespace, request.type, request.id) == ("config", "MachineConfigs.config.talos.dev", "v1alpha1"):
            if self.config is None:
                context.abort(grpc.StatusCode.NOT_FOUND, f"resource {request.type}/{request.id} doesn't exist")
            return resource_pb2.GetResponse(resource=resource_pb2.Resource(
                metadata=resource_pb2.Metadata(namespace=request.namespace, type=request.type, id=request.id,
                                               version="1", phase="running"),
                spec=resource_pb2.Spec(yaml_spec=self.config.decode())))
        if request.namespace == "controlplane" and STATIC_POD_RESOURCES.get(request.type) == request.id \
                and request.id in self.static_pods:
            image, version = self.static_pods[request.id]
            return resource_pb2.GetResponse(resource=resource_pb2.Resource(
                metadata=resource_pb2.Metadata(namespace=request.namespace, type=request.type, id=request.id,
                                               version=str(version), phase="running"),
                spec=resource_pb2.Spec(yaml_spec=yaml.safe_dump({"image": image}))))
        if (request.namespace, request.type, request.id) != ("runtime", "MachineStatuses.runtime.talos.dev", "machine"):
            context.abort(grpc.StatusCode.NOT_FOUND, f"resource {request.type}/{request.id} doesn't exist")
        spec = {"stage": self.machine_stage, "status": {
            "ready": self.machine_stage == "running" and not self.unmet_conditions,
            "unmetConditions": list(self.unmet_conditions)}}
        return resource_pb2.GetResponse(resource=resource_pb2.Resource(
            metadata=resource_pb2.Metadata(namespace=request.namespace, type=request.type, id=request.id,
                                           version="3", phase="running"),
            spec=resource_pb2.Spec(yaml_spec=yaml.safe_dump(spec))))

    def _rpc_List(self, request, context):
        """COSI State.List: the control plane's Manifests resources (a spec is the list of its objects)."""
        if (request.namespace, request.type) != ("controlplane", "Manifests.kubernetes.talos.dev"):
            return
        for id_, objects in (self.manifests(self) if self.manifests else []):
            yield resource_pb2.ListResponse(resource=resource_pb2.Resource(
                metadata=resource_pb2.Metadata(namespace=request.namespace, type=request.type, id=id_, version="1",
                                               phase="running"),
                spec=resource_pb2.Spec(yaml_spec=yaml.safe_dump(objects))))

    def _rpc_ImagePull(self, request, context):
        self.image_pulls.append((common_pb2.ContainerdNamespace.Name(request.namespace), request.reference))
        return machine_pb2.ImagePullResponse(messages=[machine_pb2.ImagePull()])

    def _config_taken(self, config: bytes) -> None:
        """What Talos's controllers do with a configuration the node runs: a control plane renders its static
        pods (a new version of a component's config resource when its image changes); the kubelet restarts
        on a new image."""
        try:
            documents = [d for d in yaml.safe_load_all(config) if isinstance(d, dict)]
        except yaml.YAMLError:
            return
        images = config_images(documents)
        kubelet_before = getattr(self, "_kubelet_image", None)
        self._kubelet_image = images.get("kubelet")
        if kubelet_before is not None and images.get("kubelet") != kubelet_before and self.on_kubelet:
            self.on_kubelet(self, images["kubelet"])
        if not any(d.get("version") == "v1alpha1" and (d.get("machine") or {}).get("type") == "controlplane"
                   for d in documents):
            return
        for component in STATIC_POD_RESOURCES.values():
            image = images.get(component)
            before = self.static_pods.get(component)
            if image is None or (before and before[0] == image):
                continue
            version = before[1] + 1 if before else 1
            self.static_pods[component] = (image, version)
            self.static_pod_updates.append((time.monotonic(), component, image))
            if self.on_static_pod:
                self.on_static_pod(self, component, image, version)

    def _rpc_Version(self, request, context):
        return machine_pb2.VersionResponse(messages=[machine_pb2.Version(
            version=machine_pb2.VersionInfo(tag=self.version_tag, os="Talos", arch="amd64"),
            platform=machine_pb2.PlatformInfo(name="nocloud", mode="cloud"))])

    def _rpc_ApplyConfiguration(self, request, context):
        mode = request.mode
        if mode == Mode.REBOOT:
            if self.mode != "maintenance":
                context.abort(grpc.StatusCode.UNIMPLEMENTED,
                              "the REBOOT mode is not supported, please use AUTO or NO_REBOOT modes instead")
            mode = Mode.NO_REBOOT
        reboot_after = mode == Mode.AUTO and self.mode == "configured" and self.auto_needs_reboot
        if mode == Mode.AUTO:
            mode = Mode.REBOOT if reboot_after else Mode.NO_REBOOT
        details = {Mode.NO_REBOOT: "Applied configuration without a reboot", Mode.TRY: "Applied configuration without a reboot",
                   Mode.REBOOT: "Applied configuration with a reboot",
                   Mode.STAGED: "Staged configuration to be applied after the next reboot"}[mode]
        if request.dry_run:
            diff = "".join(difflib.unified_diff((self.config or b"").decode().splitlines(True),
                                                request.data.decode().splitlines(True)))
            return machine_pb2.ApplyConfigurationResponse(messages=[machine_pb2.ApplyConfiguration(
                mode=mode, mode_details=f"Dry run summary:\n{details} (skipped in dry-run).\nConfig diff:\n\n{diff or 'No changes.'}")])
        if self.mode == "maintenance" and self._learns_identity:
            self._learn_identity(request.data, context)
        if mode == Mode.STAGED:
            self.staged_config = request.data
        else:
            self.config = request.data
            self._config_taken(request.data)
        if mode == Mode.TRY:
            timeout = request.try_mode_timeout.ToTimedelta() if request.HasField("try_mode_timeout") else "1m0s"
            details += f"\nThe config is applied in 'try' mode and will be automatically reverted back in {timeout}"
        if self.mode == "maintenance":
            # a maintenance node installs and reboots into the applied configuration; the install keeps
            # it on the network for a while after the reply, so the reply is not lost under load
            self.reboot(self.install_downtime, mode="configured", after=0.3)
        elif reboot_after:
            self.reboot(self.install_downtime, after=0.3)  # a moment after the reply, as machined does
        return machine_pb2.ApplyConfigurationResponse(messages=[machine_pb2.ApplyConfiguration(
            mode=mode, mode_details=details)])

    def _rpc_Reboot(self, request, context):
        def apply_staged():
            if self.staged_config is not None:
                self.config, self.staged_config = self.staged_config, None
                self._config_taken(self.config)
        apply_staged()
        self.reboot(self.install_downtime)
        if self.installed_tag is not None:
            self._boot_into(self.installed_tag)
            self.installed_tag = None
        return machine_pb2.RebootResponse(messages=[machine_pb2.Reboot(actor_id="stand-in")])

    def _rpc_Bootstrap(self, request, context):
        if self.bootstrapped:
            context.abort(grpc.StatusCode.ALREADY_EXISTS, "etcd data directory is not empty")
        self.bootstrapped = True
        if request.recover_etcd:
            # Talos restores etcd from the uploaded snapshot once the RPC has returned; a missing or bad one
            # shows in etcd's service state, not in this reply.
            self.etcd_restored_from, self.recovery_snapshot = self.recovery_snapshot, None
        return machine_pb2.BootstrapResponse(messages=[machine_pb2.Bootstrap()])

    def _rpc_EtcdRecover(self, request, context):
        # machined keeps the upload at /var/lib/etcd.snapshot; only a control plane takes one.
        self.recovery_snapshot = request.bytes
        return machine_pb2.EtcdRecoverResponse(messages=[machine_pb2.EtcdRecover()])

    def _rpc_Kubeconfig(self, request, context):
        content = self.kubeconfig_yaml.encode()
        payload = talos_style_tgz("kubeconfig", content) if self.kubeconfig_format == "tgz" else content
        size = self.kubeconfig_chunk or len(payload)
        return [common_pb2.Data(bytes=payload[i:i + size]) for i in range(0, len(payload), size)]

    def _rpc_EtcdSnapshot(self, request, context):
        data = self.etcd_snapshot_data
        for start in range(0, len(data), 1024):  # in chunks, as Talos streams it
            yield common_pb2.Data(bytes=data[start:start + 1024])

    def _rpc_EtcdMemberList(self, request, context):
        return machine_pb2.EtcdMemberListResponse(messages=[machine_pb2.EtcdMembers(members=self.etcd_members)])

    def _rpc_EtcdLeaveCluster(self, request, context):
        self.etcd_members = [m for m in self.etcd_members if m.hostname != self.hostname]
        return machine_pb2.EtcdLeaveClusterResponse(messages=[machine_pb2.EtcdLeaveCluster()])

    def _rpc_EtcdRemoveMemberByID(self, request, context):
        if not any(m.id == request.member_id for m in self.etcd_members):
            context.abort(grpc.StatusCode.NOT_FOUND, f"member {request.member_id:x} not found")
        self.etcd_members = [m for m in self.etcd_members if m.id != request.member_id]
        return machine_pb2.EtcdRemoveMemberByIDResponse(messages=[machine_pb2.EtcdRemoveMemberByID()])

    def _rpc_ServiceList(self, request, context):
        return machine_pb2.ServiceListResponse(messages=[machine_pb2.ServiceList(services=self.services)])

    def _rpc_Shutdown(self, request, context):
        def power_off():
            self.go_down()
            if self.on_power_off is not None:
                self.on_power_off()
        threading.Timer(0.05, power_off).start()  # after the reply, as machined does
        return machine_pb2.ShutdownResponse(messages=[machine_pb2.Shutdown(actor_id="stand-in")])

    def _rpc_Reset(self, request, context):
        self.reset_requested = True
        if request.reboot:
            self.reboot(self.install_downtime, mode="maintenance")
        else:
            threading.Timer(0.05, self.go_down).start()
        return machine_pb2.ResetResponse(messages=[machine_pb2.Reset(actor_id="stand-in")])

    def _boot_into(self, tag: str) -> None:
        """The version the node reports once it has gone down for the reboot under way."""
        def upgraded():
            self.version_tag = tag
        threading.Timer(0.05, upgraded).start()

    @staticmethod
    def _image_tag(image: str, default: str) -> str:
        return image.rsplit(":", 1)[-1] if ":" in image else default

    def _rpc_Upgrade(self, request, context):
        self.reboot(self.install_downtime)
        self._boot_into(self._image_tag(request.image, self.version_tag))
        return machine_pb2.UpgradeResponse(messages=[machine_pb2.Upgrade(ack="Upgrade request received",
                                                                         actor_id="stand-in")])

    def _rpc_ImageService_Pull(self, request, context):
        """Layer progress, then the pulled image's name, as containerd names it."""
        yield image_pb2.ImageServicePullResponse(pull_progress=image_pb2.ImageServicePullProgress(
            layer_id="sha256:0001", progress=image_pb2.ImageServicePullLayerProgress(status=1, offset=10, total=10)))
        self.pulled_images.append(request.image_ref)
        yield image_pb2.ImageServicePullResponse(name=request.image_ref)

    def _rpc_LifecycleService_Upgrade(self, request, context):
        """The installer's output lines, then its exit code; the node runs on until it reboots."""
        image = request.source.image_name
        if not image:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "installer image name is required")
        if image not in self.pulled_images:
            context.abort(grpc.StatusCode.INTERNAL, f"upgrade failed: image {image!r} not found")

        def progress(**kind):
            return lifecycle_pb2.LifecycleServiceUpgradeResponse(
                progress=lifecycle_pb2.LifecycleServiceInstallProgress(**kind))
        yield progress(message=f"installing {image}")
        if self.installer_exit_code == 0:
            self.installed_tag = self._image_tag(image, self.version_tag)
            yield progress(message="upgrade completed")
        else:
            for message in ("checking the install disk", "partitioning the install disk",
                            "failed to write the boot partition"):
                yield progress(message=message)
        yield progress(exit_code=self.installer_exit_code)
