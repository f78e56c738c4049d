"""ConfigurationApply, NodesInstalled, Bootstrap, Kubeconfig: Talos API calls as Pulumi dynamic resources.

Thin adapters around talos_proxmox.talos_api.operations. Inputs that carry configurations or keys
(machine_configuration, talosconfig) are made secrets here whatever the caller passes, and they are
not copied into the outputs: the state keeps a hash of the applied configuration, so a diff says
"changed" without ever showing the configuration. The kubeconfig output is a secret.

The endpoint defaults to the node itself, as `talosctl -n <ip> -e <ip>` would do.

A node's first apply returns once the node has taken its configuration; the install and reboot that
follow are waited for by NodesInstalled, for every new node at once. The dynamic-provider host serves
four calls at a time (pulumi/dynamic/__main__.py), so a create that waited for its own node's install
would hold one of them for minutes and nine nodes would install in three waves.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any, Mapping, Optional

import pulumi
import pulumi.dynamic as dynamic

from providers import has_unknowns, operations_lock, vm_replaced

from talos_proxmox.day_two import drift, recovery_snapshot, rolling
from talos_proxmox.day_two.backup_target import BackupTarget
from talos_proxmox.day_two.progress import note, progress_printer
from talos_proxmox.talos_api import operations
from talos_proxmox.talos_api.client import TalosClient, read_talosconfig
from talos_proxmox.talos_api.kubeconfig import client_certificate_expires
from talos_proxmox.talos_config import client_config

DEFAULT_TIMEOUT_SECONDS = 600.0


def _timeout(props: dict[str, Any]) -> float:
    return float(props.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)


def _sha256(value: Any) -> Optional[str]:
    """operations.config_sha256, or None while a preview does not know the value yet (so it differs)."""
    return None if has_unknowns(value) else operations.config_sha256(value)


def _state(olds: dict[str, Any]) -> dict[str, Any]:
    """Old outputs without the SDK's own entries (the pickled provider)."""
    return {key: value for key, value in olds.items() if not key.startswith("__")}


def _check_failures(props: dict[str, Any]) -> list[dynamic.CheckFailure]:
    failures = []
    if not props.get("node"):
        failures.append(dynamic.CheckFailure("node", "node: expected the node's address, e.g. 10.5.0.2"))
    mode = props.get("mode")
    if mode is not None:
        try:
            operations.check_mode(mode)
        except ValueError as exc:
            failures.append(dynamic.CheckFailure("mode", str(exc)))
    timeout = props.get("timeout_seconds")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        failures.append(dynamic.CheckFailure("timeout_seconds", f"timeout_seconds: {timeout!r} is not a positive number"))
    return failures


class _TalosNodeProvider(dynamic.ResourceProvider):
    """What the three resources share: input checks; read keeps the state (a node cannot be asked
    what was applied, bootstrapped or fetched without handling secrets); delete has nothing to undo
    (a configuration or a bootstrap cannot be taken back; removing a node is its own step)."""

    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        return dynamic.CheckResult(news, _check_failures(news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


# --- ConfigurationApply ---------------------------------------------------------------------------

# vm_id: the node's VM (an output of it). A new VM boots the ISO unconfigured, so its apply is replaced,
# delete-before-replace with the VM, and the new one starts with the first (insecure) apply.
_APPLY_SETTINGS = ("node", "endpoint", "mode", "try_timeout_seconds", "timeout_seconds", "vm_id")
# Kept in state but no reason to apply again: the health gate of an apply that reboots checks by role.
_APPLY_FACTS = ("role",)


class ConfigurationApplyProvider(_TalosNodeProvider):
    def _apply(self, props: dict[str, Any], *, insecure_first: bool, wait: Optional[bool] = None) -> dict[str, Any]:
        outcome = operations.apply_machine_configuration(
            props["node"], props["machine_configuration"], props["talosconfig"],
            endpoint=props.get("endpoint"), mode=props.get("mode") or "auto",
            try_timeout=props.get("try_timeout_seconds"), insecure_first=insecure_first,
            # A first apply does not wait for the install (NodesInstalled does); later ones wait for the node.
            wait=not insecure_first if wait is None else wait, timeout=_timeout(props),
        )
        return {
            **{key: props.get(key) for key in (*_APPLY_SETTINGS, *_APPLY_FACTS)},
            "config_sha256": operations.config_sha256(props["machine_configuration"]),
            "applied_via": outcome.via,
            "applied_mode": outcome.mode,
            "warnings": list(outcome.warnings),
            # Kept (as secret outputs) so that a refresh can read the node and compare: see read.
            "machine_configuration": props["machine_configuration"],
            "talosconfig": props["talosconfig"],
        }

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        """Refresh: what the node runs. A config changed by hand, or a node back in maintenance mode, is
        recorded so that the next up applies the stack's config again; an unreachable node keeps its last
        known state. Each finding is printed, secrets masked."""
        applied, talosconfig = props.get("machine_configuration"), props.get("talosconfig")
        if not applied or not talosconfig:
            return dynamic.ReadResult(id_=id_, outs=props)  # recorded before refreshes could read the node
        reading = drift.read_node(props["node"], talosconfig, props.get("endpoint"))
        name = f"node {props['node']}"
        if reading.state == drift.UNREACHABLE:
            note("refresh", f"{name}: unreachable, keeps its last known state ({reading.detail})")
            return dynamic.ReadResult(id_=id_, outs=props)
        if reading.state == drift.MAINTENANCE:
            note("refresh", f"{name}: in maintenance mode; the next up applies its config again and waits for it")
            return dynamic.ReadResult(id_=id_, outs={**props, "config_sha256": None, "applied_mode": "maintenance"})
        if drift.same_configuration(applied, reading.running_config):
            return dynamic.ReadResult(id_=id_, outs=props)
        for line in drift.drift_report(name, applied, reading.running_config):
            note("refresh", line)
        running_sha = operations.config_sha256(reading.running_config)
        return dynamic.ReadResult(id_=id_, outs={**props, "config_sha256": f"running:{running_sha}"})

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        outs = self._apply(props, insecure_first=True)
        return dynamic.CreateResult(id_=f"{props['node']}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        changed = [key for key in _APPLY_SETTINGS if olds.get(key) != news.get(key)]
        if olds.get("config_sha256") != _sha256(news["machine_configuration"]):
            changed.append("machine_configuration")
        replaces = ["node"] if "node" in changed else []
        if vm_replaced(olds, news):
            replaces.append("vm_id")
        return dynamic.DiffResult(changes=bool(changed), replaces=replaces, stables=[],
                                  delete_before_replace="vm_id" in replaces)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if olds.get("config_sha256") == operations.config_sha256(news["machine_configuration"]):
            # only how we talk to the node changed: nothing to send
            return dynamic.UpdateResult(outs={**_state(olds), **{key: news.get(key) for key in (*_APPLY_SETTINGS, *_APPLY_FACTS)},
                                              "machine_configuration": news.get("machine_configuration"),
                                              "talosconfig": news.get("talosconfig")})
        if olds.get("applied_mode") == "maintenance":
            # found in maintenance mode by a refresh: its first apply again, and back once it has installed
            return dynamic.UpdateResult(outs=self._apply(news, insecure_first=True, wait=True))
        if (news.get("mode") or "auto") == "auto" and operations.apply_needs_reboot(
                news["node"], news["machine_configuration"], news["talosconfig"], endpoint=news.get("endpoint"),
                timeout=_timeout(news)):
            # A change Talos takes only by rebooting (one made by hand, put back after a refresh, or kernel
            # arguments): one node down at a time across the cluster, and the next only once it is healthy.
            node = rolling.RollNode(news["node"], news["node"], news.get("role") or "worker", news.get("endpoint"))
            with operations_lock(news["talosconfig"], "reboot to apply the configuration", news["node"]):
                outs = self._apply(news, insecure_first=False)
                with rolling.client_for(node, news["talosconfig"]) as client:
                    rolling.wait_healthy(client, node, timeout=_timeout(news), backoff=rolling.DEFAULT_BACKOFF)
            note("apply", f"{news['node']}: rebooted into its configuration and healthy")
            return dynamic.UpdateResult(outs=outs)
        return dynamic.UpdateResult(outs=self._apply(news, insecure_first=False))


class ConfigurationApply(dynamic.Resource):
    """A machine configuration applied to one node (insecure the first time, mTLS afterwards)."""

    node: pulumi.Output[str]
    endpoint: pulumi.Output[Optional[str]]
    mode: pulumi.Output[str]
    config_sha256: pulumi.Output[str]
    applied_via: pulumi.Output[str]
    applied_mode: pulumi.Output[str]
    warnings: pulumi.Output[list]

    def __init__(self, name: str, *, node: pulumi.Input[str], machine_configuration: pulumi.Input[str],
                 talosconfig: pulumi.Input[str], endpoint: Optional[pulumi.Input[str]] = None,
                 mode: str = "auto", try_timeout_seconds: Optional[float] = None,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, vm_id: Optional[pulumi.Input[int]] = None,
                 role: Optional[str] = None, opts: Optional[pulumi.ResourceOptions] = None):
        operations.check_mode(mode)
        props = {
            "node": node, "endpoint": endpoint, "mode": mode, "try_timeout_seconds": try_timeout_seconds,
            "timeout_seconds": timeout_seconds, "vm_id": vm_id, "role": role,
            "machine_configuration": pulumi.Output.secret(machine_configuration),
            "talosconfig": pulumi.Output.secret(talosconfig),
            "config_sha256": None, "applied_via": None, "applied_mode": None, "warnings": None,
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["machine_configuration", "talosconfig"]))
        super().__init__(ConfigurationApplyProvider(), name, props, opts)


# --- NodesInstalled -------------------------------------------------------------------------------


def _installing(olds: dict[str, Any], news: dict[str, Any]) -> dict[str, str]:
    """name -> address of the nodes in `news` that `olds` did not have: not at that address, or in another
    VM (`_rejoining`: a replaced VM installs afresh)."""
    before = {node["name"]: node["address"] for node in olds.get("nodes") or []}
    rejoining = {node.name for node in _rejoining(olds, news)}
    return {node["name"]: node["address"] for node in news["nodes"]
            if node["name"] in rejoining or before.get(node["name"]) != node["address"]}


def _rejoining(olds: dict[str, Any], news: dict[str, Any]) -> list[rolling.RollNode]:
    """The nodes of `news` in a new VM at the same address: they join a running cluster. A node recorded
    without its VM id is not taken as in a new VM."""
    before = {node["name"]: node for node in olds.get("nodes") or []}
    return [rolling.RollNode(node["name"], node["address"], node.get("role") or "worker") for node in news["nodes"]
            if node["name"] in before and before[node["name"]]["address"] == node["address"]
            and vm_replaced(before[node["name"]], node)]


class NodesInstalledProvider(_TalosNodeProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        return dynamic.CheckResult(news, [])

    def _wait(self, props: dict[str, Any], nodes: dict[str, str],
              rejoining: list[rolling.RollNode] = ()) -> dict[str, Any]:
        credentials = read_talosconfig(props["talosconfig"]).credentials
        order = [node["name"] for node in props["nodes"]]
        printers = {name: progress_printer("install", position=f"{order.index(name) + 1} of {len(order)}")
                    for name in nodes}
        for name in nodes:
            printers[name]("waiting", name)
        operations.wait_until_all_ready(
            nodes, lambda address: TalosClient([address], credentials=credentials, node=address),
            timeout=_timeout(props), on_ready=lambda name, tag: printers[name](f"configured ({tag})", name))
        # A node in a new VM rejoins a running cluster: the up is done once it is healthy (its services,
        # and a control plane in etcd as every member sees it), as after any roll step.
        for node in rejoining:
            with rolling.client_for(node, props["talosconfig"]) as client:
                rolling.wait_healthy(client, node, timeout=_timeout(props), backoff=rolling.DEFAULT_BACKOFF)
            printers[node.name]("healthy", node.name)
        return {"nodes": props["nodes"], "timeout_seconds": props.get("timeout_seconds")}

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_="nodes-installed", outs=self._wait(props, _installing({}, props)))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        changed = olds.get("nodes") != news.get("nodes") or olds.get("timeout_seconds") != news.get("timeout_seconds")
        return dynamic.DiffResult(changes=changed, replaces=[], stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=self._wait(news, _installing(olds, news), _rejoining(olds, news)))


class NodesInstalled(dynamic.Resource):
    """Every node that got its first configuration has installed and answers over mTLS; nodes added
    later, or put in a new VM, are waited for on the up that does it (the latter until healthy).
    `nodes`: [{name, address, role, vm_id}] in roll order, vm_id an output of the node's VM."""

    nodes: pulumi.Output[list]

    def __init__(self, name: str, *, nodes: list[dict], talosconfig: pulumi.Input[str],
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS, opts: Optional[pulumi.ResourceOptions] = None):
        props = {"nodes": nodes, "timeout_seconds": timeout_seconds, "talosconfig": pulumi.Output.secret(talosconfig)}
        super().__init__(NodesInstalledProvider(), name, props, opts)


# --- Bootstrap ------------------------------------------------------------------------------------


class BootstrapProvider(_TalosNodeProvider):
    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        snapshot = None
        if props.get("recover_from"):
            snapshot = _recovery_snapshot(props)
            note("create", f"recovering etcd on {props['node']} from {props['recover_from']} "
                           f"({len(snapshot)} bytes): uploading, then bootstrapping from it")
        bootstrapped_now = operations.bootstrap_etcd(props["node"], props["talosconfig"],
                                                     endpoint=props.get("endpoint"), timeout=_timeout(props),
                                                     recover_from=snapshot)
        if snapshot is not None and not bootstrapped_now:
            note("create", f"etcd on {props['node']} holds data already: Talos refused to recover it from "
                           f"{props['recover_from']}, and the cluster goes on with the data it has")
        outs = {"node": props["node"], "endpoint": props.get("endpoint"),
                "timeout_seconds": props.get("timeout_seconds"), "already_bootstrapped": not bootstrapped_now,
                "recover_from": props.get("recover_from"), "recover_from_sha256": props.get("recover_from_sha256")}
        return dynamic.CreateResult(id_=f"bootstrap-{props['node']}", outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # A cluster is bootstrapped once, ever. Another first control plane (the first one was taken out
        # of the stack, or moved into a new VM) is only recorded: a second Bootstrap would start a new
        # etcd on a node whose data directory happens to be empty, splitting the cluster. The one
        # exception is a recovery the stack asks for (cluster.recoverFrom, a snapshot not recovered from
        # before): every control plane was lost, and etcd starts again from that snapshot.
        recover = bool(news.get("recover_from_sha256")) and news.get("recover_from_sha256") != olds.get(
            "recover_from_sha256")
        changed = [k for k in ("node", "endpoint", "timeout_seconds") if olds.get(k) != news.get(k)]
        return dynamic.DiffResult(changes=bool(changed) or recover, replaces=["recover_from_sha256"] if recover else [],
                                  stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs={**_state(olds), **{k: news.get(k) for k in ("node", "endpoint",
                                                                                     "timeout_seconds")}})


def _recovery_snapshot(props: dict[str, Any]) -> bytes:
    """The snapshot the stack load checked, read again (fetched, decrypted): refused if it changed since."""
    source = props["recover_from"]
    try:
        snapshot = recovery_snapshot.read_recovery_snapshot(
            source, target=BackupTarget.from_props(props.get("recover_target")),
            identity_file=props.get("recover_identity_file"))
    except recovery_snapshot.RecoverySnapshotError as err:
        raise ValueError(f"cluster.recoverFrom: {source!r} {err}") from None
    if hashlib.sha256(snapshot).hexdigest() != props.get("recover_from_sha256"):
        raise ValueError(f"cluster.recoverFrom: {source!r} changed since the stack was loaded (its sha256 differs): "
                         "nothing was uploaded; run `pulumi up` again to check and recover from it as it is now")
    return snapshot


class Bootstrap(dynamic.Resource):
    """etcd bootstrapped on the first control plane node, once: never again, whichever node is first later;
    with `recover_from` (an etcd snapshot file or an object of the backup bucket, `recover_target`, decrypted
    with `recover_identity_file` if need be, and its sha256), from that snapshot, once per snapshot."""

    node: pulumi.Output[str]
    already_bootstrapped: pulumi.Output[bool]

    def __init__(self, name: str, *, node: pulumi.Input[str], talosconfig: pulumi.Input[str],
                 endpoint: Optional[pulumi.Input[str]] = None, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
                 recover_from: Optional[str] = None, recover_from_sha256: Optional[str] = None,
                 recover_identity_file: Optional[str] = None, recover_target: Optional[dict] = None,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {"node": node, "endpoint": endpoint, "timeout_seconds": timeout_seconds,
                 "talosconfig": pulumi.Output.secret(talosconfig), "already_bootstrapped": None,
                 "recover_from": recover_from, "recover_from_sha256": recover_from_sha256,
                 "recover_identity_file": recover_identity_file,
                 # the bucket's credentials: only an object needs them, and then only as a secret
                 "recover_target": pulumi.Output.secret(recover_target) if recover_target else None}
        super().__init__(BootstrapProvider(), name, props, opts)


# --- Kubeconfig -----------------------------------------------------------------------------------


class KubeconfigProvider(_TalosNodeProvider):
    def _fetch(self, props: dict[str, Any]) -> dict[str, Any]:
        kubeconfig = operations.fetch_kubeconfig(props["node"], props["talosconfig"],
                                                 endpoint=props.get("endpoint"), timeout=_timeout(props))
        expires = client_certificate_expires(kubeconfig)
        return {"node": props["node"], "endpoint": props.get("endpoint"),
                "timeout_seconds": props.get("timeout_seconds"),
                "talosconfig_sha256": operations.config_sha256(props["talosconfig"]),
                "credentials_sha256": operations.credentials_sha256(props["talosconfig"]), "kubeconfig": kubeconfig,
                "expires": expires.isoformat() if expires else None}

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=f"kubeconfig-{props['node']}", outs=self._fetch(props))

    def _refetch(self, olds: dict[str, Any], news: dict[str, Any]) -> bool:
        # Talos issues a fresh client certificate per call: fetch again only when the node or the
        # credentials changed, not when the talosconfig only lists other endpoints (a control plane
        # added or removed). A preview does not know the talosconfig while the Talosconfig resource
        # updates; that update keeps a usable certificate, so unknown counts as unchanged.
        if olds.get("node") != news.get("node") or olds.get("endpoint") != news.get("endpoint"):
            return True
        if _kubeconfig_renewal_due(olds):
            return True  # Talos signs a fresh certificate with each kubeconfig it hands out
        if has_unknowns(news["talosconfig"]):
            return False
        if olds.get("credentials_sha256"):
            return olds["credentials_sha256"] != operations.credentials_sha256(news["talosconfig"])
        return olds.get("talosconfig_sha256") != operations.config_sha256(news["talosconfig"])  # older state

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        changed = self._refetch(olds, news) or olds.get("timeout_seconds") != news.get("timeout_seconds")
        return dynamic.DiffResult(changes=changed, replaces=[], stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        if self._refetch(olds, news):
            return dynamic.UpdateResult(outs=self._fetch(news))
        return dynamic.UpdateResult(outs={**_state(olds), "timeout_seconds": news.get("timeout_seconds")})


    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        """Refresh: a warning when the kubeconfig's client certificate is due for renewal (the next up renews it)."""
        expires = _kubeconfig_expires(props)
        if expires and client_config.renewal_due(expires):
            note("refresh", client_config.expiry_warning("the kubeconfig's client certificate", expires) +
                 ": the next `pulumi up` fetches a new one from a control plane, and `pulumi stack output "
                 "kubeconfig` gives it")
        return dynamic.ReadResult(id_=id_, outs=props)


def _kubeconfig_expires(state: Mapping[str, Any]) -> Optional[datetime.datetime]:
    if state.get("expires"):
        return datetime.datetime.fromisoformat(state["expires"])
    kubeconfig = state.get("kubeconfig")  # state written before `expires` was
    return client_certificate_expires(kubeconfig) if isinstance(kubeconfig, str) else None


def _kubeconfig_renewal_due(state: Mapping[str, Any]) -> bool:
    expires = _kubeconfig_expires(state)
    return expires is not None and client_config.renewal_due(expires)


class Kubeconfig(dynamic.Resource):
    """The cluster's admin kubeconfig from a control plane node (a secret output), fetched again when its
    client certificate is within client_config.DEFAULT_RENEW_BEFORE_DAYS of expiring (`expires`)."""

    node: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    expires: pulumi.Output[Optional[str]]

    def __init__(self, name: str, *, node: pulumi.Input[str], talosconfig: pulumi.Input[str],
                 endpoint: Optional[pulumi.Input[str]] = None, timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {"node": node, "endpoint": endpoint, "timeout_seconds": timeout_seconds,
                 "talosconfig": pulumi.Output.secret(talosconfig), "talosconfig_sha256": None,
                 "credentials_sha256": None, "kubeconfig": None, "expires": None}
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"]))
        super().__init__(KubeconfigProvider(), name, props, opts)
