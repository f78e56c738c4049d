"""`AtomicUpgrades`: whether a Helm release is installed atomically, decided from the cluster itself.

Helm's `atomic` uninstalls a release whose first install fails (e.g. times out on a slow image pull).
For Cilium that removes the cluster's network, so the first install must not be atomic; upgrades must
be, so a failed one rolls back. This resource's output `atomic` feeds the release: false when it is
created (the release is being installed now), and from then on asked again only when the release's
chart, version or values change (an upgrade is about to run): true once Helm has a deployed revision
of it. An up that changes nothing about the release changes nothing here either.
The kubeconfig is a secret input and is kept out of the outputs.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

import pulumi
import pulumi.dynamic as dynamic

from talos_proxmox.day_two.cluster_health import (
    KubeApi,
    KubeApiError,
    KubeconfigError,
    helm_release_deployed,
    read_kubeconfig,
)

IDENTITY = ("namespace", "release")


def _outputs(props: dict[str, Any], atomic: bool) -> dict[str, Any]:
    return {"namespace": props["namespace"], "release": props["release"],
            "release_sha256": props["release_sha256"], "atomic": atomic}


def _deployed(props: dict[str, Any]) -> bool:
    try:
        return helm_release_deployed(KubeApi(read_kubeconfig(props["kubeconfig"])), props["namespace"],
                                     props["release"])
    except (KubeApiError, KubeconfigError) as exc:  # not atomic this time: a failed upgrade then stays, not goes
        sys.stderr.write(f"talos-proxmox: release {props['release']}: cannot tell whether it is deployed "
                         f"({exc}); upgrading it without atomic\n")
        return False


class AtomicUpgradesProvider(dynamic.ResourceProvider):
    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=f"{props['namespace']}/{props['release']}", outs=_outputs(props, False))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        moved = [key for key in IDENTITY if olds.get(key) != news.get(key)]
        upgrading = not olds.get("atomic") and olds.get("release_sha256") != news.get("release_sha256")
        return dynamic.DiffResult(changes=bool(moved) or upgrading, replaces=moved, stables=[],
                                  delete_before_replace=True)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=_outputs(news, _deployed(news)))

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # nothing was made in the cluster


class AtomicUpgrades(dynamic.Resource):
    """`atomic` for the Helm release `release` in `namespace`; `release_sha256` fingerprints its chart,
    version and values (cluster_plan.addon_values.release_sha256)."""

    atomic: pulumi.Output[bool]

    def __init__(self, name: str, *, kubeconfig: pulumi.Input[str], namespace: str, release: str,
                 release_sha256: str, opts: Optional[pulumi.ResourceOptions] = None):
        props = {"kubeconfig": pulumi.Output.secret(kubeconfig), "namespace": namespace, "release": release,
                 "release_sha256": release_sha256, "atomic": None}
        opts = pulumi.ResourceOptions.merge(pulumi.ResourceOptions(additional_secret_outputs=["kubeconfig"]), opts)
        super().__init__(AtomicUpgradesProvider(), name, props, opts)
