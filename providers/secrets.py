"""The cluster's secrets bundle as a Pulumi resource (MachineSecrets).

Generated once (or adopted from an existing secrets.yaml) and never regenerated: diff never asks for a
replacement, and a changed adoption input is refused by check. The cluster component protects it too.
Every output holding key material is a Pulumi secret; messages name properties, never values.
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping, Optional

import pulumi
import pulumi.dynamic as dynamic

from providers import check_result, has_unknowns
from talos_proxmox.talos_config import secrets_bundle

def _secrets_bundle(props: Mapping[str, Any]) -> tuple[dict, bool]:
    """(bundle, adopted) for the inputs: the adopted bundle, or a fresh one."""
    if props.get("adopt_yaml"):
        return secrets_bundle.load_secrets(props["adopt_yaml"]), True
    return secrets_bundle.generate_secrets(props["talos_version"]), False


def _same_bundle(text_a: Optional[str], text_b: Optional[str]) -> bool:
    if not text_a or not text_b:
        return not text_a and not text_b
    return secrets_bundle.load_secrets(text_a) == secrets_bundle.load_secrets(text_b)


class MachineSecretsProvider(dynamic.ResourceProvider):
    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        if has_unknowns(news.get("adopt_yaml")) or has_unknowns(news.get("talos_version")):
            return check_result(news, "", None)
        try:
            secrets_bundle.parse_contract(news.get("talos_version"))
        except ValueError as exc:
            return check_result(news, "talos_version", exc)
        try:
            if news.get("adopt_yaml"):
                secrets_bundle.load_secrets(news["adopt_yaml"])
            # Adopting another bundle into an existing resource would re-key a running cluster.
            # Dropping the adoption input later is fine: the bundle in state stays.
            exists = bool(olds.get("talos_version"))
            if exists and news.get("adopt_yaml") and not _same_bundle(olds.get("adopt_yaml"), news["adopt_yaml"]):
                return check_result(news, "adopt_yaml", ValueError(
                    "adopt_yaml: not the secrets bundle this resource holds; MachineSecrets never replaces a "
                    "cluster's secrets in place (adopt only when creating it, or create a new MachineSecrets)"))
        except secrets_bundle.SecretsBundleError as exc:
            return check_result(news, "adopt_yaml", exc)
        return check_result(news, "", None)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        bundle, adopted = _secrets_bundle(props)
        outs = {
            "talos_version": props["talos_version"],
            "adopt_yaml": props.get("adopt_yaml"),
            "adopted": adopted,
            "bundle": bundle,
            "secrets_yaml": secrets_bundle.dump_secrets(bundle),
        }
        return dynamic.CreateResult(id_=uuid.uuid4().hex, outs=outs)

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        # Never a replacement: new secrets would orphan every node of a running cluster. Nor an update for a
        # new talos_version alone (a Talos upgrade): the bundle stays (so does the talos_version output, the
        # version it was made for), and an update would leave it unknown in the preview (the Python
        # dynamic-provider host does not pass `stables` on), showing the talosconfig and kubeconfig changing.
        changed = "adopt_yaml" in news and news["adopt_yaml"] != olds.get("adopt_yaml")
        return dynamic.DiffResult(changes=changed, replaces=[],
                                  stables=["bundle", "secrets_yaml", "adopted"], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        # Inputs are recorded; the bundle in state is kept as it is.
        outs = {k: olds.get(k) for k in ("adopted", "bundle", "secrets_yaml")}
        outs.update(talos_version=news["talos_version"], adopt_yaml=news.get("adopt_yaml"))
        return dynamic.UpdateResult(outs=outs)

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None


class MachineSecrets(dynamic.Resource):
    """The cluster's secrets bundle (`talosctl gen secrets`), generated once or adopted from a file.

    `bundle` is the bundle as a dict (the `secrets` input of MachineConfiguration and Talosconfig)
    and `secrets_yaml` the secrets.yaml text; both are Pulumi secrets. `secrets_file` adopts the
    secrets.yaml of a cluster made by hand (read and validated in the program), `adopt_yaml` the
    same as text. Protect this resource.
    """

    bundle: pulumi.Output[dict]
    secrets_yaml: pulumi.Output[str]
    adopted: pulumi.Output[bool]
    talos_version: pulumi.Output[str]

    def __init__(self, name: str, talos_version: pulumi.Input[str], *, secrets_file: Optional[str] = None,
                 adopt_yaml: Optional[pulumi.Input[str]] = None, opts: Optional[pulumi.ResourceOptions] = None):
        if secrets_file and adopt_yaml is not None:
            raise ValueError("MachineSecrets: give secrets_file (a path) or adopt_yaml (its text), not both")
        if secrets_file:
            # Read and validate in the program so a bad file fails before anything is planned.
            adopt_yaml = secrets_bundle.dump_secrets(secrets_bundle.load_secrets_file(secrets_file))
        props = {
            "talos_version": talos_version,
            "adopt_yaml": pulumi.Output.secret(adopt_yaml) if adopt_yaml is not None else None,
            "adopted": None, "bundle": None, "secrets_yaml": None,
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["bundle", "secrets_yaml", "adopt_yaml"]))
        super().__init__(MachineSecretsProvider(), name, props, opts)
