"""Pulumi dynamic providers, one module per resource family, each a thin adapter over talos_proxmox.

Code here runs in two places: in the Pulumi program (the resource classes register inputs), and in the
engine's dynamic-provider host, which unpickles each provider by its module path and calls check,
diff, create, update, read and delete. Decisions (what to render, when to roll, what is healthy) belong
to the pure core in talos_proxmox; a provider only maps Pulumi's calls onto it.

| module | resources |
|---|---|
| secrets | MachineSecrets: the cluster's secrets bundle |
| machine_configuration | MachineConfiguration: one node's rendered config |
| talosconfig | Talosconfig: the talosctl config with its os:admin certificate |
| schematic | Schematic: the Image Factory schematic |
| talos_operations | ConfigurationApply, Bootstrap, Kubeconfig: calls to the Talos API |
| node_lifecycle | NodeLifecycle: upgrades, Kubernetes rolls and removal of one node; NodeChanges: the node plan, checked before any VM |
| cluster_health | ClusterHealth: the wait for a healthy cluster |

Stacks deployed before the layout change hold providers pickled under four module paths that are gone;
`pickled_paths` keeps them loadable, registered below whenever this package is imported.
"""

from __future__ import annotations

from typing import Any, Mapping

import pulumi.dynamic as dynamic
from pulumi.runtime import known_types, rpc

from talos_proxmox.day_two import cluster_lock
from talos_proxmox.day_two.progress import note


def has_unknowns(value: Any) -> bool:
    """True when a preview has not computed (part of) the value yet. The dynamic-provider host hands
    such values to check and diff as `pulumi.output.Unknown`; the wire's sentinel string counts too."""
    if known_types.is_unknown(value):
        return True
    if isinstance(value, str):
        return value == rpc.UNKNOWN
    if isinstance(value, Mapping):
        return any(has_unknowns(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_unknowns(v) for v in value)
    return False


def vm_replaced(olds: Mapping, news: Mapping) -> bool:
    """True when the VM whose id a resource records (`vm_id`, an output of the node's VM) is being
    replaced: the id is unknown (the engine asks with it unknown when it works out what a delete-before-
    replace of the VM takes along) or differs. A state recorded before the id was kept (None) is no
    replacement. Numbers come back from the engine as floats."""
    new = news.get("vm_id")
    if has_unknowns(new):
        return True
    old = olds.get("vm_id")
    return old is not None and new is not None and float(old) != float(new)


def check_result(news: dict, property_name: str, error: Exception | None) -> dynamic.CheckResult:
    failures = [dynamic.CheckFailure(property_name, str(error))] if error else []
    return dynamic.CheckResult(news, failures)


from providers import pickled_paths  # noqa: E402 - after the helpers above, which the providers import

pickled_paths.register()


def operations_lock(talosconfig: Any, what: str, name: Any):
    """The cluster's operations lock (talos_proxmox.day_two.cluster_lock) for `what` of node `name`: one
    node down at a time across every process managing the cluster; waits are printed."""
    return cluster_lock.hold(cluster_lock.key_for(talosconfig), f"{what} of {name}",
                             on_wait=lambda message: note(what, f"{name}: {message}"))


# In Pulumi's dynamic-provider host (not in the program): end the host once its engine is gone and it is
# between node steps (engine_watch).
from providers import engine_watch  # noqa: E402

engine_watch.start_in_provider_host()
