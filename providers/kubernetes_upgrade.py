"""KubernetesUpgrade: the cluster's Kubernetes version change, as `talosctl upgrade-k8s` makes it
(talos_proxmox.day_two.kubernetes_upgrade), and the bootstrap manifests' sync after it and after every
Talos version change (talos_proxmox.day_two.bootstrap_manifests).

- create: nothing happens on a new cluster (its nodes get their configurations from ConfigurationApply and
  Talos applies the manifests at bootstrap); the versions are recorded. A stack deployed by a version of this
  program that had no KubernetesUpgrade creates it on an existing cluster: when the first control plane
  already runs a configuration with another Kubernetes version, this up changes it, so the nodes that answer
  are upgraded as an update would (rather than every node's apply sending the new version at once).
- update, Kubernetes version changed: pre-pull, each control plane component across the control planes,
  each node's kubelet through its whole new configuration (one node at a time, control planes first), then
  the manifests. Talos version changed alone: the manifests only (a new Talos renders a new CoreDNS).
- diff: a change only when either version changed; nodes added or removed, new configurations or
  credentials are not an upgrade (the update reads them from the new inputs).

Wiring (components/cluster.py): after every node's NodeLifecycle (a Talos upgrade rolls first, then
Kubernetes moves), before every node's ConfigurationApply (which then re-sends what the kubelet step applied,
which Talos takes as no change).
"""

from __future__ import annotations

from typing import Any, Optional

import pulumi
import pulumi.dynamic as dynamic

from providers import operations_lock
from providers.node_lifecycle import kubernetes_api
from talos_proxmox.day_two import bootstrap_manifests, kubernetes_upgrade, rolling
from talos_proxmox.day_two.progress import note, progress_printer
from talos_proxmox.settings.model import DEFAULT_LIFECYCLE_TIMEOUT_SECONDS
from talos_proxmox.talos_api import operations

VERSIONS = ("kubernetes_version", "talos_version")
PROBE_SECONDS = 5.0  # whether a node runs a configuration already (create only)


def _nodes(props: dict[str, Any]) -> list[rolling.RollNode]:
    return [rolling.RollNode(name=node["name"], address=node["address"], role=node["role"])
            for node in props.get("nodes") or ()]


def _timeout(props: dict[str, Any]) -> float:
    return float(props.get("timeout_seconds") or DEFAULT_LIFECYCLE_TIMEOUT_SECONDS)


def _outputs(props: dict[str, Any]) -> dict[str, Any]:
    """State: the versions and the nodes; never the configurations or the talosconfig."""
    return {key: props.get(key) for key in (*VERSIONS, "nodes", "timeout_seconds")}


def sync_manifests(props: dict[str, Any], kube, client, node: rolling.RollNode) -> None:
    """Read the manifests from `node` (the first control plane), apply them, print what changed, and wait
    for what changed to roll out."""
    timeout = _timeout(props)
    result = bootstrap_manifests.sync(kube, bootstrap_manifests.read_manifests(client, node.address,
                                                                                timeout=rolling.CALL_TIMEOUT))
    for line in result.lines:
        note("manifests", line)
    bootstrap_manifests.wait_rolled_out(
        kube, result.changed, timeout=min(timeout, bootstrap_manifests.ROLLOUT_TIMEOUT),
        backoff=rolling.DEFAULT_BACKOFF, on_progress=lambda line: note("manifests", line))


def apply_whole_configuration(props: dict[str, Any], node: rolling.RollNode) -> None:
    """The node's new configuration (its new kubelet and whatever else this up changes), then healthy."""
    try:
        operations.apply_machine_configuration(
            node.address, props["configurations"][node.name], props["talosconfig"], endpoint=node.dial, mode="auto",
            insecure_first=False, timeout=_timeout(props))
    except Exception as exc:  # noqa: BLE001 - named by node for the upgrade's error
        raise rolling.RollError(node, f"applying its configuration for Kubernetes "
                                      f"{props.get('kubernetes_version')} failed: {exc}") from None
    with rolling.client_for(node, props["talosconfig"]) as client:
        rolling.wait_healthy(client, node, timeout=_timeout(props), backoff=rolling.DEFAULT_BACKOFF)


def _kube(props: dict[str, Any], nodes: list[rolling.RollNode]):
    control_planes = [node for node in rolling.roll_order(nodes) if node.role == "controlplane"]
    try:
        return kubernetes_api(control_planes, props["talosconfig"], _timeout(props))[0], control_planes[0]
    except LookupError as exc:
        raise rolling.RollError(control_planes[0], f"the Kubernetes upgrade needs the Kubernetes API, and "
                                                   f"{exc}") from None


def running_kubernetes(props: dict[str, Any], node: rolling.RollNode) -> Optional[str]:
    """The Kubernetes version (its kubelet's tag, without the v) `node` runs, or None when it does not answer
    with a configuration (a new cluster's node in maintenance mode or still booting)."""
    try:
        with rolling.client_for(node, props["talosconfig"], timeout=PROBE_SECONDS) as client:
            running = client.get_resource(*kubernetes_upgrade.MACHINE_CONFIG, node=node.address).spec.yaml_spec
    except Exception:  # noqa: BLE001 - anything but an answer means no running cluster to upgrade
        return None
    image = kubernetes_upgrade.component_image(running, "kubelet") or ""
    return image.rsplit(":", 1)[-1].lstrip("v") or None


class KubernetesUpgradeProvider(dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        nodes = _nodes(props)
        first = next((node for node in rolling.roll_order(nodes) if node.role == "controlplane"), None)
        running = running_kubernetes(props, first) if first else None
        if running and running != str(props.get("kubernetes_version") or "").lstrip("v"):
            answering = [{"name": node.name} for node in nodes if running_kubernetes(props, node)]
            self.update("kubernetes-upgrade", {**props, "kubernetes_version": running, "nodes": answering}, props)
        return dynamic.CreateResult(id_="kubernetes-upgrade", outs=_outputs(props))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        changed = [key for key in VERSIONS if olds.get(key) != news.get(key)]
        return dynamic.DiffResult(changes=bool(changed), replaces=[], stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # A node added by this up gets its configuration, already at the new versions, from its first apply.
        known = {node["name"] for node in olds.get("nodes") or ()}
        nodes = [node for node in _nodes(news) if node.name in known]
        kube, first = _kube(news, nodes)
        event = progress_printer("kubernetes")

        def guard(what: str, node: rolling.RollNode):
            return operations_lock(news.get("talosconfig"), what, node.name)

        def manifests(client) -> None:
            sync_manifests(news, kube, client, first)

        if olds.get("kubernetes_version") != news.get("kubernetes_version"):
            kubernetes_upgrade.upgrade(
                nodes, news["configurations"], news["kubernetes_version"],
                client_for=lambda node: rolling.client_for(node, news["talosconfig"]), kube=kube,
                apply_node=lambda node: apply_whole_configuration(news, node), sync_manifests=manifests,
                timeout=_timeout(news), backoff=kubernetes_upgrade.WAIT_POLL, on_event=event, guard=guard)
        else:
            with rolling.client_for(first, news["talosconfig"]) as client:
                manifests(client)
        return dynamic.UpdateResult(outs=_outputs(news))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # a version cannot be taken back; the nodes go with their own resources


class KubernetesUpgrade(dynamic.Resource):
    """The cluster's Kubernetes version (and Talos version, for the manifests), over `nodes`
    ([{name, address, role}]) with their new `configurations` ({name: machine configuration})."""

    kubernetes_version: pulumi.Output[Optional[str]]
    talos_version: pulumi.Output[str]

    def __init__(self, name: str, *, kubernetes_version: pulumi.Input[Optional[str]], talos_version: pulumi.Input[str],
                 nodes: list[dict], configurations: dict[str, pulumi.Input[str]], talosconfig: pulumi.Input[str],
                 timeout_seconds: float = float(DEFAULT_LIFECYCLE_TIMEOUT_SECONDS),
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {
            "kubernetes_version": kubernetes_version, "talos_version": talos_version, "nodes": nodes,
            "timeout_seconds": timeout_seconds,
            "configurations": pulumi.Output.secret(configurations),
            "talosconfig": pulumi.Output.secret(talosconfig),
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["talosconfig", "configurations"]))
        super().__init__(KubernetesUpgradeProvider(), name, props, opts)
