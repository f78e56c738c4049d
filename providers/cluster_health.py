"""`ClusterHealth`: a dynamic resource whose create (and update) waits for a healthy cluster.

It holds nothing in the cluster: create polls the Kubernetes API (talos_proxmox/day_two/cluster_health.py) until
every expected node is Ready and CoreDNS is available, or fails the deployment with what was still
wrong. It waits again only when the node count or a trigger (e.g. a Helm release revision) changes.
The kubeconfig is a secret input and is kept out of the outputs.
"""

from __future__ import annotations

import uuid
from typing import Any, Optional, Sequence

import pulumi
import pulumi.dynamic as dynamic

from talos_proxmox.day_two.cluster_health import KubeApi, read_kubeconfig, wait_for_health
from talos_proxmox.day_two.progress import note

# Changes to these wait again; a new kubeconfig or timeout alone does not make the cluster unhealthy.
RECHECK_INPUTS = ("expected_nodes", "triggers")


def _outputs(props: dict[str, Any], server: str) -> dict[str, Any]:
    return {"expected_nodes": props["expected_nodes"], "timeout_seconds": props["timeout_seconds"],
            "triggers": props.get("triggers") or [], "server": server}


def _wait(props: dict[str, Any]) -> str:
    access = read_kubeconfig(props["kubeconfig"])
    wait_for_health(KubeApi(access), int(props["expected_nodes"]), float(props["timeout_seconds"]),
                    poll_seconds=float(props.get("poll_seconds") or 5.0),
                    on_waiting=lambda line: note("health", line))
    return access.server


class ClusterHealthProvider(dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        server = _wait(props)
        return dynamic.CreateResult(id_=uuid.uuid4().hex, outs=_outputs(props, server))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        changed = [k for k in RECHECK_INPUTS if (olds.get(k) or None) != (news.get(k) or None)]
        return dynamic.DiffResult(changes=bool(changed), replaces=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=_outputs(news, _wait(news)))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # nothing was created in the cluster


class ClusterHealth(dynamic.Resource):
    """Waits (at create, and when `expected_nodes` or `triggers` change) until the cluster is healthy."""

    server: pulumi.Output[str]
    expected_nodes: pulumi.Output[int]

    def __init__(self, name: str, kubeconfig: pulumi.Input[str], expected_nodes: int, timeout_seconds: int,
                 triggers: Optional[Sequence[pulumi.Input[Any]]] = None, poll_seconds: float = 5.0,
                 opts: Optional[pulumi.ResourceOptions] = None):
        if expected_nodes < 1 or timeout_seconds <= 0:
            raise ValueError(f"ClusterHealth {name}: expected_nodes {expected_nodes} and timeout_seconds "
                             f"{timeout_seconds} must both be positive")
        props = {
            "kubeconfig": pulumi.Output.secret(kubeconfig),
            "expected_nodes": expected_nodes,
            "timeout_seconds": timeout_seconds,
            "poll_seconds": poll_seconds,
            "triggers": list(triggers or []),
            "server": None,
        }
        opts = pulumi.ResourceOptions.merge(
            pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"]), opts)
        super().__init__(ClusterHealthProvider(), name, props, opts)
