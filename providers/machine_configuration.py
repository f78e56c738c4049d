"""One node's machine configuration as a Pulumi resource (MachineConfiguration).

diff reports a change exactly when the rendered bytes change, so only nodes whose patches changed show up
in a preview. check adds `redacted_config` (talos_proxmox.talos_config.redaction) as a plain input, so a
preview shows the changed lines with every secret masked.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi.dynamic as dynamic

from providers import check_result, has_unknowns
from talos_proxmox.engine_values import with_integers
from talos_proxmox.settings.stack import cluster_rename_problem
from talos_proxmox.talos_config import machine_config, secrets_bundle
from talos_proxmox.talos_config.redaction import redact_config

CONFIG_INPUTS = ("secrets", "cluster_name", "endpoint", "role", "talos_version", "kubernetes_version", "patches")


def render_config(props: Mapping[str, Any]) -> str:
    return machine_config.render(props["secrets"], props["cluster_name"], props["endpoint"], props["role"],
                                 props["talos_version"], props["kubernetes_version"],
                                 with_integers(props.get("patches") or []))


def config_outputs(props: Mapping[str, Any], rendered: str) -> dict[str, Any]:
    """State of a MachineConfiguration: its non-secret inputs, the config, its SHA-256 and the config
    with every secret masked (`redacted_config`, plain, what a preview may show).

    The bundle itself is not copied into the outputs; the inputs record it (as a secret)."""
    outs = {k: props.get(k) for k in CONFIG_INPUTS if k != "secrets"}
    outs["machine_configuration"] = rendered
    outs["config_sha256"] = hashlib.sha256(rendered.encode()).hexdigest()
    outs["redacted_config"] = redact_config(rendered, props["secrets"])
    return outs


class MachineConfigurationProvider(dynamic.ResourceProvider):
    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        # Before anything is touched: a preview fails here, naming the key, and no node gets a config.
        rename = cluster_rename_problem((olds or {}).get("cluster_name"), news.get("cluster_name"))
        if rename is not None:
            return dynamic.CheckResult(news, [dynamic.CheckFailure("cluster_name", rename)])
        if any(has_unknowns(news.get(k)) for k in CONFIG_INPUTS):
            return check_result(news, "", None)  # validated once the values are known
        try:
            rendered = render_config(news)
        except secrets_bundle.SecretsBundleError as exc:
            return check_result(news, "secrets", exc)
        except machine_config.MachineConfigError as exc:
            first_word = str(exc).split(" ", 1)[0]
            return check_result(news, first_word if first_word in CONFIG_INPUTS else "patches", exc)
        # A checked input, so that `pulumi preview --diff` shows the changed YAML lines, secrets masked.
        return check_result({**news, "redacted_config": redact_config(rendered, news["secrets"])}, "", None)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=uuid.uuid4().hex, outs=config_outputs(props, render_config(props)))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        if any(has_unknowns(news.get(k)) for k in CONFIG_INPUTS):
            return dynamic.DiffResult(changes=True, replaces=[], stables=[], delete_before_replace=False)
        changed = render_config(news) != olds.get("machine_configuration")
        return dynamic.DiffResult(changes=changed, replaces=[], stables=[], delete_before_replace=False)

    def update(self, _id: str, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=config_outputs(news, render_config(news)))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # a rendered config is data; removing a node is the node's business


class MachineConfiguration(dynamic.Resource):
    """One node's complete machine configuration (`machine_configuration`, a secret), its SHA-256 and
    `redacted_config` (plain)."""

    machine_configuration: pulumi.Output[str]
    config_sha256: pulumi.Output[str]
    role: pulumi.Output[str]
    redacted_config: pulumi.Output[str]  # not secret: the config with every secret value masked

    def __init__(self, name: str, *, secrets: pulumi.Input[dict], cluster_name: pulumi.Input[str],
                 endpoint: pulumi.Input[str], role: pulumi.Input[str], talos_version: pulumi.Input[str],
                 kubernetes_version: pulumi.Input[str], patches: pulumi.Input[Sequence[Any]] = (),
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {
            "secrets": pulumi.Output.secret(secrets),
            "cluster_name": cluster_name, "endpoint": endpoint, "role": role,
            "talos_version": talos_version, "kubernetes_version": kubernetes_version,
            "patches": list(patches) if isinstance(patches, (list, tuple)) else patches,
            "machine_configuration": None, "config_sha256": None, "redacted_config": None,
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["machine_configuration", "secrets"]))
        super().__init__(MachineConfigurationProvider(), name, props, opts)
