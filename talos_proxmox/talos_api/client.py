"""A client for the Talos machine API (machine.MachineService on port 50000).

Two ways to connect, as talosctl does:
  - insecure (credentials=None): for nodes in maintenance mode. No client certificate and no
    server verification at all (talosctl --insecure): whoever answers at that address receives
    what we send, so use it only on a network you trust, for the first configuration apply.
  - mTLS (credentials from the talosconfig): the client certificate (role os:admin) is presented
    and the server must present a certificate from the OS CA that names the dialled address.
    Talos puts the node's addresses into its apid certificate, so no target-name override is used.

TLS is done by OpenSSL through tls_bridge (see there why grpcio's own TLS cannot talk to Talos).

Endpoints are the addresses we dial; several give failover: a call that finds an endpoint
unreachable moves on to the next and remembers the one that answered. A target node is passed
in the `node` gRPC metadata header (`nodes` for several), as talosctl does, and apid forwards the
call; without one the endpoint answers itself.
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import grpc
import yaml
from google.protobuf import empty_pb2

from talos_proxmox.talos_config import pki

from . import errors, tls_bridge
from .generated.common import common_pb2
from .generated.cosi import resource_pb2, resource_pb2_grpc
from .generated.machine import (image_pb2, image_pb2_grpc, lifecycle_pb2, lifecycle_pb2_grpc, machine_pb2,
                                machine_pb2_grpc)

TALOS_API_PORT = 50000

APPLY_MODES = {
    "auto": machine_pb2.ApplyConfigurationRequest.AUTO,
    "no-reboot": machine_pb2.ApplyConfigurationRequest.NO_REBOOT,
    "reboot": machine_pb2.ApplyConfigurationRequest.REBOOT,
    "staged": machine_pb2.ApplyConfigurationRequest.STAGED,
    "try": machine_pb2.ApplyConfigurationRequest.TRY,
}
REBOOT_MODES = {"default": machine_pb2.RebootRequest.DEFAULT, "powercycle": machine_pb2.RebootRequest.POWERCYCLE,
                "force": machine_pb2.RebootRequest.FORCE}
UPGRADE_REBOOT_MODES = {"default": machine_pb2.UpgradeRequest.DEFAULT,
                        "powercycle": machine_pb2.UpgradeRequest.POWERCYCLE}
WIPE_MODES = {"all": machine_pb2.ResetRequest.ALL, "system-disk": machine_pb2.ResetRequest.SYSTEM_DISK,
              "user-disks": machine_pb2.ResetRequest.USER_DISKS}

# Where `talosctl upgrade` pulls the installer by default (--namespace system).
CONTAINERD_NAMESPACES = {"system": common_pb2.NS_SYSTEM, "cri": common_pb2.NS_CRI}
INSTALLER_CONTAINERD = common_pb2.ContainerdInstance(driver=common_pb2.CRI, namespace=common_pb2.NS_SYSTEM)
# Kubeconfig and other streams can exceed grpcio's 4 MiB default receive limit.
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def _choice(value: str, options: Mapping[str, int], key: str) -> int:
    if value not in options:
        raise ValueError(f"{key} {value!r} is not supported; expected one of {', '.join(options)}")
    return options[value]


def split_endpoint(endpoint: str, default_port: int = TALOS_API_PORT) -> tuple[str, int]:
    """'10.0.0.5' / '10.0.0.5:50001' / 'fd00::5' / '[fd00::5]:50001' / 'node.lan' -> (host, port)."""
    text = endpoint.strip()
    if not text:
        raise ValueError("endpoint is empty; expected an address such as 10.0.0.5 or 10.0.0.5:50000")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        try:
            ipaddress.IPv6Address(text)
            return text, default_port
        except ValueError:
            host, _, port = text.rpartition(":") if ":" in text else (text, "", "")
    if port and not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r}: port {port!r} is not a number")
    return host, int(port) if port else default_port


@dataclass(frozen=True, repr=False)
class ClientCredentials:
    """What mTLS needs: the OS CA certificate and the client certificate and key, all PEM."""

    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def __repr__(self) -> str:  # never show key material
        return "ClientCredentials(<redacted>)"


@dataclass(frozen=True, repr=False)
class TalosConfigContext:
    """One context of a talosconfig: credentials plus its endpoints and nodes."""

    credentials: ClientCredentials
    endpoints: tuple[str, ...]
    nodes: tuple[str, ...]

    def __repr__(self) -> str:
        return f"TalosConfigContext(endpoints={self.endpoints!r}, nodes={self.nodes!r}, credentials=<redacted>)"


def read_talosconfig(talosconfig: str | Mapping, context: str | None = None) -> TalosConfigContext:
    """The named (default: current) context of a talosconfig given as YAML text or a mapping."""
    config = yaml.safe_load(talosconfig) if isinstance(talosconfig, str) else talosconfig
    if not isinstance(config, Mapping) or not isinstance(config.get("contexts"), Mapping):
        raise ValueError("talosconfig: expected a mapping with 'context' and 'contexts'")
    name = context or config.get("context")
    entry = config["contexts"].get(name)
    if not isinstance(entry, Mapping):
        raise ValueError(f"talosconfig: context {name!r} not found; have {', '.join(map(str, config['contexts']))}")
    try:
        credentials = ClientCredentials(
            ca_pem=pki.pem_from_b64(entry.get("ca"), field=f"contexts.{name}.ca"),
            cert_pem=pki.pem_from_b64(entry.get("crt"), field=f"contexts.{name}.crt"),
            key_pem=pki.pem_from_b64(entry.get("key"), field=f"contexts.{name}.key"),
        )
    except pki.PKIError as exc:
        raise ValueError(f"talosconfig: {exc}") from None
    return TalosConfigContext(
        credentials=credentials,
        endpoints=tuple(entry.get("endpoints") or ()),
        nodes=tuple(entry.get("nodes") or ()),
    )


# (namespace, type, id) of the machine's boot status (pkg/machinery/resources/runtime/machine_status.go).
MACHINE_STATUS = ("runtime", "MachineStatuses.runtime.talos.dev", "machine")


class _Connection:
    """One endpoint: its TLS bridge and the gRPC channel through it."""

    def __init__(self, endpoint: str, context, connect_timeout: float):
        host, port = split_endpoint(endpoint)
        self.endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.bridge = tls_bridge.TlsBridge(host, port, context, connect_timeout=connect_timeout)
        options = _CHANNEL_OPTIONS + [("grpc.default_authority", self.endpoint)]
        self.channel = grpc.insecure_channel(self.bridge.address, options=options)
        self.stubs = {
            "machine": machine_pb2_grpc.MachineServiceStub(self.channel),
            "resources": resource_pb2_grpc.StateStub(self.channel),  # COSI resources, as `talosctl get` reads them
            "images": image_pb2_grpc.ImageServiceStub(self.channel),
            "lifecycle": lifecycle_pb2_grpc.LifecycleServiceStub(self.channel),
        }

    def close(self) -> None:
        self.channel.close()
        self.bridge.close()


class TalosClient:
    """Talos machine API client. Thread-safe; close() (or `with`) releases the connections.

    Every RPC method takes `timeout` (seconds, default the client's) and `node`/`nodes` to
    override the client's target for that call. Unary methods return the reply message after
    checking each reply's common.Metadata for a per-node error; failures raise
    errors.TalosApiError subclasses.
    """

    def __init__(
        self,
        endpoints: Sequence[str] | str,
        *,
        credentials: ClientCredentials | None = None,
        node: str | None = None,
        nodes: Sequence[str] = (),
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
    ):
        endpoints = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not endpoints:
            raise ValueError("endpoints: at least one Talos API endpoint is required")
        for endpoint in endpoints:
            split_endpoint(endpoint)
        if node and nodes:
            raise ValueError("give either node or nodes, not both")
        self.endpoints = tuple(endpoints)
        self.insecure = credentials is None
        self.node = node
        self.nodes = tuple(nodes)
        self.timeout = timeout
        self._connect_timeout = connect_timeout
        if credentials is None:
            self._tls = tls_bridge.client_context()
        else:
            self._tls = tls_bridge.client_context(
                credentials.ca_pem, credentials.cert_pem, pki.standard_key_pem(credentials.key_pem)
            )
        self._connections: dict[int, _Connection] = {}
        self._current = 0
        self._lock = threading.Lock()

    @classmethod
    def from_talosconfig(
        cls,
        talosconfig: str | Mapping,
        *,
        context: str | None = None,
        endpoints: Sequence[str] | None = None,
        node: str | None = None,
        nodes: Sequence[str] | None = None,
        timeout: float = 60.0,
    ) -> "TalosClient":
        """mTLS client from a talosconfig; endpoints default to the context's."""
        ctx = read_talosconfig(talosconfig, context)
        chosen = list(endpoints or ctx.endpoints)
        if not chosen:
            raise ValueError("talosconfig context has no endpoints; pass endpoints=")
        return cls(chosen, credentials=ctx.credentials, node=node, nodes=nodes or (), timeout=timeout)

    # --- plumbing ------------------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            connections, self._connections = list(self._connections.values()), {}
        for connection in connections:
            connection.close()

    def __enter__(self) -> "TalosClient":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def _connection(self, index: int) -> _Connection:
        with self._lock:
            if index not in self._connections:
                self._connections[index] = _Connection(self.endpoints[index], self._tls, self._connect_timeout)
            return self._connections[index]

    def _drop(self, index: int) -> None:
        # A fresh channel per attempt after a failure: grpc's own reconnect backoff would otherwise
        # fail the next calls fast for up to minutes after the node is back.
        with self._lock:
            connection = self._connections.pop(index, None)
        if connection is not None:
            connection.close()

    def _metadata(self, node: str | None, nodes: Sequence[str] | None) -> list[tuple[str, str]]:
        if node is None and nodes is None:
            node, nodes = self.node, self.nodes
        if node:
            return [("node", node)]
        return [("nodes", n) for n in nodes or ()]

    def _call(self, rpc: str, request, *, timeout, node, nodes, stream: bool = False, service: str = "machine",
              upload: bool = False):
        """`upload`: a client-streaming RPC; `request` makes a fresh iterator of its messages per attempt."""
        metadata = self._metadata(node, nodes)
        timeout = self.timeout if timeout is None else timeout
        start = self._current
        last: errors.TalosApiError | None = None
        for step in range(len(self.endpoints)):
            index = (start + step) % len(self.endpoints)
            connection = self._connection(index)
            method = getattr(connection.stubs[service], rpc)
            try:
                if upload:
                    reply = method(request(), timeout=timeout, metadata=metadata)
                elif stream:
                    reply = list(method(request, timeout=timeout, metadata=metadata))
                else:
                    reply = method(request, timeout=timeout, metadata=metadata)
            except grpc.RpcError as exc:
                error = errors.from_rpc_error(connection.endpoint, rpc, exc, connection.bridge.last_error)
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self._drop(index)
                # Fail over only when the endpoint could not take the call at all.
                if isinstance(error, errors.TalosUnavailable):
                    last = error
                    continue
                raise error from None
            self._current = index
            # Only MachineService replies carry per-node metadata; elsewhere a failure is the call's status.
            messages = [] if service != "machine" else reply if stream else reply.messages
            failed = errors.node_errors(connection.endpoint, rpc, messages)
            if failed is not None:
                raise failed
            return reply
        if len(self.endpoints) > 1:
            raise errors.TalosUnavailable(
                ", ".join(self.endpoints), rpc, f"no endpoint answered; last: {last}", grpc.StatusCode.UNAVAILABLE
            )
        raise last

    # --- RPCs ----------------------------------------------------------------------------------

    def get_resource(self, namespace: str, type_: str, id_: str, *, timeout=None,
                     node=None) -> resource_pb2.Resource:
        """One COSI resource of one node (`talosctl get <type> <id>`); NOT_FOUND raises."""
        request = resource_pb2.GetRequest(namespace=namespace, type=type_, id=id_)
        return self._call("Get", request, timeout=timeout, node=node, nodes=None, service="resources").resource

    def list_resources(self, namespace: str, type_: str, *, timeout=None,
                       node=None) -> list[resource_pb2.Resource]:
        """Every COSI resource of one type on one node (`talosctl get <type>`), as the node streams them."""
        request = resource_pb2.ListRequest(namespace=namespace, type=type_)
        return [reply.resource for reply in self._call("List", request, timeout=timeout, node=node, nodes=None,
                                                       stream=True, service="resources")]

    def machine_status(self, *, timeout=None, node=None) -> dict:
        """The node's MachineStatus spec: `stage` (booting, running, ...) and `status.ready` with its
        unmet conditions — what `talosctl health` reads to see the boot sequence finished."""
        resource = self.get_resource(MACHINE_STATUS[0], MACHINE_STATUS[1], MACHINE_STATUS[2], timeout=timeout,
                                     node=node)
        spec = yaml.safe_load(resource.spec.yaml_spec or "") or {}
        return spec if isinstance(spec, dict) else {}

    def version(self, *, timeout=None, node=None, nodes=None) -> machine_pb2.VersionResponse:
        return self._call("Version", empty_pb2.Empty(), timeout=timeout, node=node, nodes=nodes)

    def apply_configuration(
        self,
        data: bytes | str,
        *,
        mode: str = "auto",
        dry_run: bool = False,
        try_timeout: float | None = None,
        timeout=None,
        node=None,
        nodes=None,
    ) -> machine_pb2.ApplyConfigurationResponse:
        """Send a machine configuration. mode: auto, no-reboot, reboot, staged, try.

        try_timeout (seconds) is how long Talos keeps a 'try' config before rolling back. 'reboot'
        is Talos's deprecated REBOOT value: maintenance nodes accept it, configured nodes answer
        UNIMPLEMENTED (stage and call reboot() instead). Dry-run replies carry Talos's diff text
        in mode_details.
        """
        request = machine_pb2.ApplyConfigurationRequest(
            data=data.encode() if isinstance(data, str) else data,
            mode=_choice(mode, APPLY_MODES, "mode"),
            dry_run=dry_run,
        )
        if try_timeout is not None:
            request.try_mode_timeout.FromNanoseconds(round(try_timeout * 1e9))
        return self._call("ApplyConfiguration", request, timeout=timeout, node=node, nodes=nodes)

    def bootstrap(self, *, recover_etcd: bool = False, recover_skip_hash_check: bool = False,
                  timeout=None, node=None, nodes=None) -> machine_pb2.BootstrapResponse:
        request = machine_pb2.BootstrapRequest(recover_etcd=recover_etcd,
                                               recover_skip_hash_check=recover_skip_hash_check)
        return self._call("Bootstrap", request, timeout=timeout, node=node, nodes=nodes)

    def kubeconfig(self, *, timeout=None, node=None) -> bytes:
        """The admin kubeconfig stream as sent (Talos sends a .tar.gz; see kubeconfig.extract_kubeconfig)."""
        chunks = self._call("Kubeconfig", empty_pb2.Empty(), timeout=timeout, node=node, nodes=None, stream=True)
        return b"".join(chunk.bytes for chunk in chunks)

    def etcd_snapshot(self, *, timeout=None, node=None) -> bytes:
        """The node's etcd data snapshot (`talosctl etcd snapshot`), streamed as common.Data chunks."""
        chunks = self._call("EtcdSnapshot", machine_pb2.EtcdSnapshotRequest(), timeout=timeout, node=node,
                            nodes=None, stream=True)
        return b"".join(chunk.bytes for chunk in chunks)

    def etcd_recover(self, snapshot: bytes, *, chunk_size: int = 1 << 20, timeout=None,
                     node=None) -> machine_pb2.EtcdRecoverResponse:
        """Upload an etcd snapshot for a Bootstrap with `recover_etcd` (`talosctl bootstrap --recover-from`);
        the node keeps it at /var/lib/etcd.snapshot. Chunks well under Talos's 32 MiB message limit."""
        def chunks():
            return (common_pb2.Data(bytes=snapshot[i:i + chunk_size]) for i in range(0, len(snapshot), chunk_size))
        return self._call("EtcdRecover", chunks, timeout=timeout, node=node, nodes=None, upload=True)

    def etcd_member_list(self, *, query_local: bool = False, timeout=None, node=None,
                         nodes=None) -> machine_pb2.EtcdMemberListResponse:
        request = machine_pb2.EtcdMemberListRequest(query_local=query_local)
        return self._call("EtcdMemberList", request, timeout=timeout, node=node, nodes=nodes)

    def etcd_leave_cluster(self, *, timeout=None, node=None, nodes=None) -> machine_pb2.EtcdLeaveClusterResponse:
        return self._call("EtcdLeaveCluster", machine_pb2.EtcdLeaveClusterRequest(), timeout=timeout,
                          node=node, nodes=nodes)

    def etcd_remove_member_by_id(self, member_id: int, *, timeout=None, node=None,
                                 nodes=None) -> machine_pb2.EtcdRemoveMemberByIDResponse:
        request = machine_pb2.EtcdRemoveMemberByIDRequest(member_id=member_id)
        return self._call("EtcdRemoveMemberByID", request, timeout=timeout, node=node, nodes=nodes)

    def service_list(self, *, timeout=None, node=None, nodes=None) -> machine_pb2.ServiceListResponse:
        return self._call("ServiceList", empty_pb2.Empty(), timeout=timeout, node=node, nodes=nodes)

    def reboot(self, *, mode: str = "default", timeout=None, node=None, nodes=None) -> machine_pb2.RebootResponse:
        request = machine_pb2.RebootRequest(mode=_choice(mode, REBOOT_MODES, "mode"))
        return self._call("Reboot", request, timeout=timeout, node=node, nodes=nodes)

    def shutdown(self, *, force: bool = False, timeout=None, node=None, nodes=None) -> machine_pb2.ShutdownResponse:
        """Power the node off; without force Talos cordons and drains it first."""
        return self._call("Shutdown", machine_pb2.ShutdownRequest(force=force), timeout=timeout, node=node, nodes=nodes)

    def reset(
        self,
        *,
        graceful: bool = True,
        reboot: bool = False,
        system_partitions_to_wipe: Iterable[str] = (),
        user_disks_to_wipe: Iterable[str] = (),
        wipe_mode: str = "all",
        timeout=None,
        node=None,
        nodes=None,
    ) -> machine_pb2.ResetResponse:
        """Wipe the node. graceful leaves etcd first; no system_partitions_to_wipe wipes them all.

        system_partitions_to_wipe are partition labels such as STATE or EPHEMERAL.
        """
        request = machine_pb2.ResetRequest(
            graceful=graceful,
            reboot=reboot,
            system_partitions_to_wipe=[machine_pb2.ResetPartitionSpec(label=label, wipe=True)
                                       for label in system_partitions_to_wipe],
            user_disks_to_wipe=list(user_disks_to_wipe),
            mode=_choice(wipe_mode, WIPE_MODES, "wipe_mode"),
        )
        return self._call("Reset", request, timeout=timeout, node=node, nodes=nodes)

    def upgrade(
        self,
        image: str,
        *,
        preserve: bool = False,
        stage: bool = False,
        force: bool = False,
        reboot_mode: str = "default",
        timeout=None,
        node=None,
        nodes=None,
    ) -> machine_pb2.UpgradeResponse:
        """Start an upgrade to the installer `image` (MachineService.Upgrade, deprecated upstream
        in favour of LifecycleService.Upgrade but served through Talos 1.17)."""
        request = machine_pb2.UpgradeRequest(
            image=image, preserve=preserve, stage=stage, force=force,
            reboot_mode=_choice(reboot_mode, UPGRADE_REBOOT_MODES, "reboot_mode"),
        )
        return self._call("Upgrade", request, timeout=timeout, node=node, nodes=nodes)

    def image_pull(self, reference: str, *, namespace: str, timeout=None,
                   node=None) -> machine_pb2.ImagePullResponse:
        """Pull `reference` into the node's containerd: namespace "cri" (Kubernetes' images) or "system"
        (the kubelet's), as `talosctl upgrade-k8s` pre-pulls (MachineService.ImagePull, every Talos line)."""
        request = machine_pb2.ImagePullRequest(
            namespace=_choice(namespace, CONTAINERD_NAMESPACES, "namespace"), reference=reference)
        return self._call("ImagePull", request, timeout=timeout, node=node, nodes=None)

    def pull_image(self, image: str, *, timeout=None, node=None) -> str:
        """Pull `image` into the system containerd (ImageService.Pull, Talos 1.13+); returns the name
        the node gives the pulled image, which LifecycleService.Upgrade takes."""
        request = image_pb2.ImageServicePullRequest(containerd=INSTALLER_CONTAINERD, image_ref=image)
        replies = self._call("Pull", request, timeout=timeout, node=node, nodes=None, stream=True, service="images")
        names = [reply.name for reply in replies if reply.WhichOneof("response") == "name"]
        if not names:
            raise errors.TalosApiError(self.endpoints[self._current], "Pull",
                                       f"the pull of {image} ended without naming the pulled image")
        return names[-1]

    def lifecycle_upgrade(self, image_name: str, *, timeout=None, node=None) -> tuple[int | None, list[str]]:
        """Install the pulled installer `image_name` (LifecycleService.Upgrade, Talos 1.13+); the node
        keeps running the old version until it reboots. Returns (the installer's exit code, or None
        when the stream ended without one; its output lines)."""
        request = lifecycle_pb2.LifecycleServiceUpgradeRequest(
            containerd=INSTALLER_CONTAINERD, source=lifecycle_pb2.InstallArtifactsSource(image_name=image_name))
        replies = self._call("Upgrade", request, timeout=timeout, node=node, nodes=None, stream=True,
                             service="lifecycle")
        exit_code, lines = None, []
        for reply in replies:
            kind = reply.progress.WhichOneof("response")
            if kind == "exit_code":
                exit_code = reply.progress.exit_code
            elif kind == "message":
                lines.append(reply.progress.message)
        return exit_code, lines
