"""NodeLifecycle: one node's day-two operations as a Pulumi dynamic resource.

- create: nothing happens on the node (a fresh node gets its configuration from ConfigurationApply);
  the versions it runs are recorded.
- update, installer image changed: `rolling.upgrade_node` (on Talos 1.13+ pull and install, drain through
  the Kubernetes API a control plane's kubeconfig reaches, reboot, uncordon; before, MachineService.Upgrade;
  either way back healthy on the new Talos version).
- update, cores, memory or CPU type changed: `vm_hardware.apply_hardware` (healthy, a Talos shutdown
  that drains the node, a Proxmox start that applies the VM's pending config, healthy again), through the Proxmox API with the provider's
  own credentials (proxmoxve:* config or PROXMOX_VE_* variables, read in `configure`).
- diff: a replacement when the node's VM is replaced (a new Proxmox host, VM id or MAC: Proxmox makes a
  new VM), so that the node is removed (delete) before its VM goes and starts afresh on the new one.
  Whether an up may replace a VM at all is NodeChanges' check (`node_changes.problems`), which runs
  before any VM is touched.
- delete: `node_removal.remove_node` (etcd leave or removal through a peer, then reset).

One at a time, control planes first, comes from how the resources are wired, not from here: each
node's NodeLifecycle depends on the previous node's in `rolling.roll_order`, so Pulumi runs the
updates one after another and a failed node stops every later one. The node's ConfigurationApply
depends on its NodeLifecycle, so a configuration that needs the new Talos reaches the node after its
upgrade; creation stays concurrent because creates here are no-ops. (A Kubernetes version change is the
cluster's KubernetesUpgrade, which runs after every NodeLifecycle.) Each
NodeLifecycle also depends on its VM, so removing a node deletes it, with etcd leave and reset,
before the VM is destroyed. It takes the VM's id as an input for the same reason: the VM is replaced
delete-before-replace, and the engine then deletes first every dependent whose diff, with that id
unknown, asks to be replaced (pulumi's calculateDependentReplacements).

NodeChanges: the nodes this up changes (each node's role and VM facts, the installer image and the
Kubernetes version), recorded; its check refuses what may not happen (`node_changes.problems`).
Every VM depends on it, so a refusal stops the up before any VM is touched, even with --skip-preview.
"""

from __future__ import annotations

import datetime
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dynamic

from talos_proxmox.day_two import (
    backup_target,
    cluster_health,
    cluster_lock,
    drift,
    etcd_snapshots,
    kubernetes_removals,
    node_changes,
    node_removal,
    rolling,
    vm_hardware,
)
from talos_proxmox.day_two.progress import note, progress_printer
from talos_proxmox.proxmox_api import privileges, vms
from talos_proxmox.proxmox_api.access import ProxmoxAccess, ProxmoxAccessError
from talos_proxmox.settings.model import DEFAULT_LIFECYCLE_TIMEOUT_SECONDS
from providers import has_unknowns, operations_lock, vm_replaced
from talos_proxmox.talos_api import errors, operations
from talos_proxmox.talos_api.client import read_talosconfig, split_endpoint

DEFAULT_TIMEOUT_SECONDS = float(DEFAULT_LIFECYCLE_TIMEOUT_SECONDS)
INPUTS = ("node_name", "address", "endpoint", "role", "installer_image", "talos_version",
          "timeout_seconds", "reset_on_delete", "etcd_snapshots", "vm", "vm_id", "vm_replacement", "position",
          "talosconfig")
# Recorded by lifecycles that take a replaced VM as a node removed and added. An older state (without it)
# was made by a program that refused VM replacements and kept the VM: its first up under this program
# records it, and a replacement waits for the up after (`diff`).
REMOVE_AND_ADD = "remove-and-add"
# The talosconfig's endpoints and nodes change whenever a node is added; only its credentials matter
# here, so adding a node leaves every other node's NodeLifecycle unchanged. The same for the node's
# place in the roll ("2 of 4", for progress lines) and the VM id Proxmox reports (the stack's is in `vm`).
_COMPARED_AS_IS = tuple(key for key in INPUTS if key not in ("talosconfig", "position", "vm_id"))


def _node(props: dict[str, Any]) -> rolling.RollNode:
    return rolling.RollNode(name=props["node_name"], address=props["address"], role=props["role"],
                            endpoint=props.get("endpoint") or None)


def _peers(props: dict[str, Any]) -> list[rolling.RollNode]:
    """The other control planes: the talosconfig's endpoints (the cluster's control planes), minus this node."""
    node = _node(props)
    endpoints = read_talosconfig(props["talosconfig"]).endpoints
    return [rolling.RollNode(name=endpoint, address=split_endpoint(endpoint)[0], role="controlplane",
                             endpoint=endpoint)
            for endpoint in endpoints if endpoint != node.dial and split_endpoint(endpoint)[0] != node.address]


def _credentials(talosconfig) -> Any:
    try:
        return read_talosconfig(talosconfig).credentials
    except (ValueError, TypeError):
        return talosconfig


def _operations_lock(props: dict[str, Any], what: str):
    """The cluster's operations lock (talos_proxmox.day_two.cluster_lock) for this node's step."""
    return operations_lock(props.get("talosconfig"), what, props.get("node_name"))


def _timeout(props: dict[str, Any]) -> float:
    return float(props.get("timeout_seconds") or DEFAULT_TIMEOUT_SECONDS)


def _outputs(props: dict[str, Any]) -> dict[str, Any]:
    """State: the inputs minus the machine configuration (the talosconfig stays, for delete)."""
    return {key: props.get(key) for key in INPUTS}


def snapshot_first(client, node: rolling.RollNode, props: dict[str, Any], event, reason: str) -> None:
    """A control plane's etcd, snapshotted before it goes down or leaves (lifecycle.etcdSnapshots), and
    also put in the backup bucket, encrypted, when the stack has one (`reason`: upgrade or removal)."""
    snapshots = props.get("etcd_snapshots")
    if node.role != "controlplane" or not snapshots:
        return
    path = etcd_snapshots.take_snapshot(client, node.name, node.address, directory=snapshots["directory"],
                                        cluster=snapshots["cluster"], keep=int(snapshots["keep"]),
                                        timeout=min(_timeout(props), rolling.CALL_TIMEOUT * 10))
    event(f"etcd-snapshot {path}", node.name)
    target = backup_target.BackupTarget.from_props(snapshots.get("target"))
    if target is not None:
        key = backup_target.upload_snapshot(target, path.read_bytes(), cluster=snapshots["cluster"], node=node.name,
                                            reason=reason, now=datetime.datetime.now(datetime.timezone.utc))
        event(f"etcd-snapshot s3://{target.bucket}/{key} (encrypted)", node.name)


def _cluster_api(node: rolling.RollNode, props: dict[str, Any]) -> cluster_health.KubeApi:
    """The Kubernetes API through this node (a control plane) or its peers; LookupError when none answers."""
    control_planes = ([node] if node.role == "controlplane" else []) + _peers(props)
    return kubernetes_api(control_planes, props["talosconfig"], _timeout(props))[0]


def upgrade_step(props: dict[str, Any]) -> None:
    node = _node(props)
    event = progress_printer("upgrade", position=props.get("position"))

    def kube() -> cluster_health.KubeApi:  # for the drain a Talos 1.13+ upgrade does on this side
        try:
            return _cluster_api(node, props)
        except LookupError as exc:
            raise rolling.RollError(node, f"not upgraded: it must be drained first, and {exc}") from None

    with rolling.client_for(node, props["talosconfig"]) as client:
        rolling.upgrade_node(client, node, props["installer_image"], talos_version=props.get("talos_version"),
                             timeout=_timeout(props), backoff=rolling.DEFAULT_BACKOFF, on_event=event,
                             before_upgrade=lambda: snapshot_first(client, node, props, event, "upgrade"), kube=kube)


def hardware_step(props: dict[str, Any], changes: dict[str, tuple], proxmox: ProxmoxAccess) -> None:
    node = _node(props)
    vm = vms.VmRef(props["vm"]["host"], int(props["vm_id"]))
    event = progress_printer("hardware", position=props.get("position"))

    def kube() -> Optional[cluster_health.KubeApi]:  # to see the other nodes Ready; not needed to power-cycle
        try:
            return _cluster_api(node, props)
        except LookupError as exc:
            event(f"other nodes not checked ({exc})", node.name)
            return None

    with rolling.client_for(node, props["talosconfig"]) as client:
        vm_hardware.apply_hardware(client, proxmox.connect(), node, vm, changes, timeout=_timeout(props),
                                   backoff=rolling.DEFAULT_BACKOFF, kube=kube, on_event=event)


class NodeLifecycleProvider(dynamic.ResourceProvider):
    def configure(self, req: dynamic.ConfigureRequest) -> None:
        # The host passes the whole stack config (namespaces kept); read only when a VM change rolls.
        self._config_get = req.config.get

    def _proxmox(self, node: rolling.RollNode) -> ProxmoxAccess:
        try:
            return ProxmoxAccess.from_settings(getattr(self, "_config_get", lambda _key: None))
        except ProxmoxAccessError as exc:
            raise rolling.RollError(node, f"its VM's hardware changed, which rolls through the Proxmox API: "
                                          f"{exc}") from None

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        failures = []
        if news.get("role") not in rolling.REQUIRED_SERVICES:
            failures.append(dynamic.CheckFailure(
                "role", f"role: {news.get('role')!r} is not a node role (expected controlplane or worker)"))
        if not news.get("address"):
            failures.append(dynamic.CheckFailure("address", "address: expected the node's IP, e.g. 10.255.200.201"))
        timeout = news.get("timeout_seconds")
        if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
            failures.append(dynamic.CheckFailure("timeout_seconds",
                                                 f"timeout_seconds: {timeout!r} is not a positive number"))
        return dynamic.CheckResult(news, failures)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=f"lifecycle-{props['node_name']}", outs=_outputs(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # A replacement only with the VM: replacing for anything else would reset a node that, say, only
        # changed its address.
        if vm_replaced(olds, news):
            if olds.get("vm_replacement") != REMOVE_AND_ADD:
                # Its apply was recorded without the VM's id, so it would not follow the new VM: stop before
                # anything is deleted (the engine asks this while planning the VM's replacement).
                raise ValueError(
                    f"node {olds.get('node_name')}: its VM would be replaced, and its state comes from a version of "
                    f"this program that kept VMs instead; `pulumi up` once without this change (it records the "
                    f"node as this version does), then make it")
            return dynamic.DiffResult(changes=True, replaces=["vm_id"], stables=[], delete_before_replace=True)
        changed = [key for key in _COMPARED_AS_IS if olds.get(key) != news.get(key)]
        # A preview does not know the talosconfig while the Talosconfig resource updates (e.g. a control
        # plane's endpoint added or removed); that update keeps a usable certificate, so unknown is no change.
        if (not has_unknowns(news.get("talosconfig"))
                and _credentials(olds.get("talosconfig")) != _credentials(news.get("talosconfig"))):
            changed.append("talosconfig")
        return dynamic.DiffResult(changes=bool(changed), replaces=[], stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        upgrade = olds.get("installer_image") != news.get("installer_image")
        changes = vm_hardware.hardware_changes(olds.get("vm"), news.get("vm") or {})
        if upgrade or changes:
            with _operations_lock(news, "roll"):
                if upgrade:
                    upgrade_step(news)
                if changes:
                    hardware_step(news, changes, self._proxmox(_node(news)))
        return dynamic.UpdateResult(outs=_outputs(news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        """Refresh: the Talos version the node runs (another than the stack's is recorded, so the next up rolls
        it back to the stack's) and, for a control plane, its etcd membership (missing: named, with the way;
        nothing recorded: the up does not guess). An unreachable node keeps its last known state."""
        if not props.get("talosconfig"):
            return dynamic.ReadResult(id_=id_, outs=props)
        node = _node(props)
        name = f"node {node.name}"
        state = drift.read_node_state(node.address, node.name, props["talosconfig"], node.dial,
                                      control_plane=node.role == "controlplane")
        if state.unreachable:
            note("refresh", f"{name}: unreachable, keeps its last known state ({state.unreachable})")
            return dynamic.ReadResult(id_=id_, outs=props)
        if state.etcd_member is False:
            note("refresh", drift.missing_member(name))
        found = drift.version_drift(name, state.talos_version, props.get("talos_version"))
        if found is None:
            return dynamic.ReadResult(id_=id_, outs=props)
        note("refresh", found)
        return dynamic.ReadResult(id_=id_, outs={**props, "installer_image": f"(running Talos {state.talos_version})"})

    def delete(self, _id: str, props: dict[str, Any]) -> None:
        with _operations_lock(props, "removal"):
            self._remove(props)

    def _remove(self, props: dict[str, Any]) -> None:
        talosconfig = props["talosconfig"]
        node = _node(props)
        event = progress_printer("remove", position=props.get("position"))
        try:
            with rolling.client_for(node, talosconfig) as client:
                snapshot_first(client, node, props, event, "removal")
        except errors.TalosApiError as exc:  # a node already gone has no etcd to save; its peers keep theirs
            event(f"etcd-snapshot-skipped ({exc.__class__.__name__})", node.name)
        peers = _peers(props)
        steps = node_removal.remove_node(
            _node(props), lambda node: rolling.client_for(node, talosconfig), peers,
            reset=props.get("reset_on_delete", True) is not False, timeout=_timeout(props),
            reach_timeout=min(node_removal.REACH_TIMEOUT, _timeout(props)), backoff=rolling.DEFAULT_BACKOFF,
            cluster_key=cluster_lock.key_for(talosconfig), on_event=event)
        if node_removal.leaves_a_cluster(steps):
            delete_kubernetes_node(node, peers, talosconfig, _timeout(props), event)
        else:  # its peers were removed before it: asking each for a kubeconfig would only wait them out
            event("kubernetes-node-not-deleted (the last control plane: no cluster is left)", node.name)


def kubernetes_api(control_planes, talosconfig, timeout: float) -> tuple[cluster_health.KubeApi, rolling.RollNode]:
    """The Kubernetes API through the admin kubeconfig of the first of `control_planes` that hands one
    out, and that node. LookupError names each that did not (by error class: never a credential)."""
    problems = []
    for peer in control_planes:
        try:
            text = operations.fetch_kubeconfig(peer.address, talosconfig, endpoint=peer.dial,
                                               timeout=min(timeout, node_removal.REACH_TIMEOUT))
            return cluster_health.KubeApi(cluster_health.read_kubeconfig(text)), peer
        except Exception as exc:  # noqa: BLE001 - try the next control plane; report if none works
            problems.append(f"{peer.name}: {exc.__class__.__name__}")
    raise LookupError(f"no control plane gave a kubeconfig ({'; '.join(problems) or 'none left'})")


def delete_kubernetes_node(node: rolling.RollNode, peers, talosconfig, timeout: float, event) -> None:
    """The removed node's Node object, deleted through a kubeconfig from a remaining control plane. With
    none left (the cluster itself is going), there is nothing to clean up: reported, not an error."""
    try:
        api, peer = kubernetes_api(peers, talosconfig, timeout)
        step = cluster_health.delete_node(api, node.name)
    except Exception as exc:  # noqa: BLE001 - reported: the node itself is already out of the cluster
        event(f"kubernetes-node-not-deleted ({exc if isinstance(exc, LookupError) else exc.__class__.__name__})",
              node.name)
        return
    event(f"{step} via {peer.name}", node.name)


class NodeLifecycle(dynamic.Resource):
    """A node's Talos upgrades and hardware rolls, and its removal from the cluster.

    Wire it with depends_on=[the node's VM, the previous node's NodeLifecycle in roll order], and
    make the node's ConfigurationApply depend on it (see the module docstring). The talosconfig's
    endpoints (the control planes) are where this node's etcd member is removed from when it
    cannot leave by itself.
    """

    node_name: pulumi.Output[str]
    installer_image: pulumi.Output[str]
    talos_version: pulumi.Output[str]

    def __init__(self, name: str, *, node_name: str, address: pulumi.Input[str], role: str,
                 installer_image: pulumi.Input[str], talos_version: pulumi.Input[str],
                 talosconfig: pulumi.Input[str], endpoint: Optional[pulumi.Input[str]] = None,
                 timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
                 reset_on_delete: bool = True, etcd_snapshots: Optional[dict] = None,
                 vm: Optional[dict] = None, vm_id: Optional[pulumi.Input[int]] = None,
                 position: Optional[str] = None, opts: Optional[pulumi.ResourceOptions] = None):
        props = {
            "node_name": node_name, "address": address, "endpoint": endpoint, "role": role,
            "installer_image": installer_image, "talos_version": talos_version,
            "timeout_seconds": timeout_seconds, "reset_on_delete": reset_on_delete,
            # {directory, keep, cluster} or None; the directory as the stack says (relative to the project).
            "etcd_snapshots": etcd_snapshots,
            # The VM as the stack says it (resource_inputs.vm_facts), the id Proxmox gave it, "n of N".
            "vm": vm, "vm_id": vm_id, "vm_replacement": REMOVE_AND_ADD, "position": position,
            "talosconfig": pulumi.Output.secret(talosconfig),
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["talosconfig"]))
        super().__init__(NodeLifecycleProvider(), name, props, opts)


_PLAN = ("installer_image", "kubernetes_version", "talos_version", "allow_downgrade", "nodes")


def _plan(props: dict[str, Any]) -> dict[str, Any]:
    return {key: props.get(key) for key in _PLAN}


class NodeChangesProvider(dynamic.ResourceProvider):
    """Records the plan; nothing on any node or VM happens here (see the module docstring). Its check
    also reads the API token's privileges on the cluster's Proxmox paths (a read, in the preview too)."""

    def configure(self, req: dynamic.ConfigureRequest) -> None:
        self._config_get = req.config.get

    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        old = _plan(olds) if olds.get("nodes") is not None else None
        failures = [dynamic.CheckFailure("nodes", problem) for problem in node_changes.problems(old, _plan(news))]
        failures += [dynamic.CheckFailure("proxmox_paths", problem) for problem in self._privilege_problems(news)]
        target = backup_target.BackupTarget.from_props(news.get("backup_target"))
        if target is not None:
            failures += [dynamic.CheckFailure("backup_target", p) for p in backup_target.target_problems(target)]
        if old is not None and not failures:
            failures += [dynamic.CheckFailure("kubernetes_version", p) for p in self._stored_object_problems(old, news)]
        return dynamic.CheckResult(news, failures)

    @staticmethod
    def _stored_object_problems(old: dict[str, Any], news: dict[str, Any]) -> list[str]:
        """Objects stored under an API version the new Kubernetes minor removes (as upgrade-k8s checks)."""
        before, after, talosconfig = old.get("kubernetes_version"), news.get("kubernetes_version"), news.get("talosconfig")
        if not before or not after or has_unknowns(after) or not kubernetes_removals.removed_apis(before, after):
            return []
        if not talosconfig or has_unknowns(talosconfig):
            return []  # a new talosconfig is made by this up: the cluster is read with it in the next preview
        control_planes = [rolling.RollNode(name=n["name"], address=n["address"], role="controlplane")
                          for n in news.get("control_planes") or ()]
        what = f"cluster.kubernetesVersion {before} -> {after}"
        try:
            api, _peer = kubernetes_api(control_planes, talosconfig, node_removal.REACH_TIMEOUT)

            def count(path: str) -> Optional[int]:
                found = api.get(path)
                return None if found is None else len(found.get("items") or ())

            return [f"{what}: {problem}" for problem in kubernetes_removals.stored_object_problems(before, after, count)]
        except (LookupError, cluster_health.KubeApiError) as exc:
            return [f"{what}: the objects of the API versions Kubernetes {after} removes could not be listed "
                    f"({exc}): the upgrade is refused until they can be"]

    def _privilege_problems(self, news: dict[str, Any]) -> list[str]:
        paths = news.get("proxmox_paths")
        try:
            access = ProxmoxAccess.from_settings(getattr(self, "_config_get", lambda _key: None))
        except ProxmoxAccessError:
            return []  # no credentials here: the Proxmox provider says what it misses itself
        if not paths:
            return []
        wanted = privileges.needs(paths["hosts"], paths["vm_datastore"], paths["iso_datastore"], paths["bridge"],
                                  [None if vm_id is None else int(vm_id) for vm_id in paths["vm_ids"]],
                                  paths.get("access_users") or ())
        api = access.connect()
        try:
            return privileges.missing(
                wanted, lambda path: privileges.effective(api.access.permissions.get(path=path) or {}, path))
        except Exception as exc:  # noqa: BLE001 - proxmoxer raises its own and requests' errors
            return [f"could not read the Proxmox API token's privileges from {access.host}:{access.port}: "
                    f"{type(exc).__name__}: {exc}"]

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_="node-changes", outs=_plan(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        return dynamic.DiffResult(changes=_plan(olds) != _plan(news), replaces=[], stables=[],
                                  delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=_plan(news))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class NodeChanges(dynamic.Resource):
    """The cluster's node plan (`resource_inputs.node_change_plan`), checked against the last up's before
    anything else happens to a node: make every node's VM depend on it."""

    nodes: pulumi.Output[dict]

    def __init__(self, name: str, *, installer_image: str, kubernetes_version: Optional[str], nodes: dict,
                 talos_version: Optional[str] = None, allow_downgrade: bool = False,
                 proxmox_paths: Optional[dict] = None, backup_target: Optional[dict] = None,
                 talosconfig: Optional[pulumi.Input[str]] = None, control_planes: Optional[list[dict]] = None,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {"installer_image": installer_image, "kubernetes_version": kubernetes_version, "nodes": nodes,
                 "talos_version": talos_version, "allow_downgrade": allow_downgrade,
                 # (resource_inputs.proxmox_paths, backup_target.target_of) not part of the plan: checked,
                 # never recorded as a change; the target holds the bucket's credentials
                 "proxmox_paths": proxmox_paths,
                 "backup_target": None if backup_target is None else pulumi.Output.secret(backup_target),
                 # to list what a Kubernetes minor upgrade would strand (kubernetes_removals), never recorded
                 "talosconfig": None if talosconfig is None else pulumi.Output.secret(talosconfig),
                 "control_planes": control_planes}
        super().__init__(NodeChangesProvider(), name, props, opts)
