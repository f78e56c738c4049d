"""Pulumi dynamic resources for the Talos secrets bundle, machine configurations and talosconfig.

Thin adapters around providers.talos_secrets, providers.machine_config and providers.talos_client:

- MachineSecrets: generated once (or adopted from an existing secrets.yaml) and never regenerated;
  diff never asks for a replacement, and a changed adoption input is refused by check. The cluster
  component protects it as well.
- MachineConfiguration: the rendered config for one node; diff reports a change exactly when the
  rendered bytes change (so only nodes whose patches changed show up in a preview). Check adds
  `redacted_config` (providers.config_redaction) as a plain input, so a preview shows the changed
  lines with every secret masked.
- Talosconfig: keeps its os:admin client certificate in state and reuses it; endpoint/node changes
  only rewrite the YAML. A new certificate is issued when the OS CA changed or the certificate is
  within `renew_before_days` of expiring.

Every output holding key material is a Pulumi secret (additional_secret_outputs), and check/diff
results and error messages only ever name properties, never values.
"""

from __future__ import annotations

import datetime
import hashlib
import uuid
from typing import Any, Mapping, Optional, Sequence

import pulumi
import pulumi.dynamic as dynamic
from pulumi.runtime import known_types, rpc

from providers import machine_config, pki, talos_client, talos_secrets
from providers.config_redaction import redact_config

DEFAULT_RENEW_BEFORE_DAYS = 30


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


def _check_result(news: dict, property_name: str, error: Exception | None) -> dynamic.CheckResult:
    failures = [dynamic.CheckFailure(property_name, str(error))] if error else []
    return dynamic.CheckResult(news, failures)


# --- MachineSecrets ----------------------------------------------------------------------------

def _secrets_bundle(props: Mapping[str, Any]) -> tuple[dict, bool]:
    """(bundle, adopted) for the inputs: the adopted bundle, or a fresh one."""
    if props.get("adopt_yaml"):
        return talos_secrets.load_secrets(props["adopt_yaml"]), True
    return talos_secrets.generate_secrets(props["talos_version"]), False


def _same_bundle(text_a: Optional[str], text_b: Optional[str]) -> bool:
    if not text_a or not text_b:
        return not text_a and not text_b
    return talos_secrets.load_secrets(text_a) == talos_secrets.load_secrets(text_b)


class MachineSecretsProvider(dynamic.ResourceProvider):
    def check(self, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        if has_unknowns(news.get("adopt_yaml")) or has_unknowns(news.get("talos_version")):
            return _check_result(news, "", None)
        try:
            talos_secrets.parse_contract(news.get("talos_version"))
        except ValueError as exc:
            return _check_result(news, "talos_version", exc)
        try:
            if news.get("adopt_yaml"):
                talos_secrets.load_secrets(news["adopt_yaml"])
            # Adopting another bundle into an existing resource would re-key a running cluster.
            # Dropping the adoption input later is fine: the bundle in state stays.
            exists = bool(olds.get("talos_version"))
            if exists and news.get("adopt_yaml") and not _same_bundle(olds.get("adopt_yaml"), news["adopt_yaml"]):
                return _check_result(news, "adopt_yaml", ValueError(
                    "adopt_yaml: not the secrets bundle this resource holds; MachineSecrets never replaces a "
                    "cluster's secrets in place (adopt only when creating it, or create a new MachineSecrets)"))
        except talos_secrets.SecretsBundleError as exc:
            return _check_result(news, "adopt_yaml", exc)
        return _check_result(news, "", None)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        bundle, adopted = _secrets_bundle(props)
        outs = {
            "talos_version": props["talos_version"],
            "adopt_yaml": props.get("adopt_yaml"),
            "adopted": adopted,
            "bundle": bundle,
            "secrets_yaml": talos_secrets.dump_secrets(bundle),
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
            adopt_yaml = talos_secrets.dump_secrets(talos_secrets.load_secrets_file(secrets_file))
        props = {
            "talos_version": talos_version,
            "adopt_yaml": pulumi.Output.secret(adopt_yaml) if adopt_yaml is not None else None,
            "adopted": None, "bundle": None, "secrets_yaml": None,
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["bundle", "secrets_yaml", "adopt_yaml"]))
        super().__init__(MachineSecretsProvider(), name, props, opts)


# --- MachineConfiguration ----------------------------------------------------------------------

CONFIG_INPUTS = ("secrets", "cluster_name", "endpoint", "role", "talos_version", "kubernetes_version", "patches")


def render_config(props: Mapping[str, Any]) -> str:
    return machine_config.render(props["secrets"], props["cluster_name"], props["endpoint"], props["role"],
                                 props["talos_version"], props["kubernetes_version"], props.get("patches") or [])


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
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        if any(has_unknowns(news.get(k)) for k in CONFIG_INPUTS):
            return _check_result(news, "", None)  # validated once the values are known
        try:
            rendered = render_config(news)
        except talos_secrets.SecretsBundleError as exc:
            return _check_result(news, "secrets", exc)
        except machine_config.MachineConfigError as exc:
            first_word = str(exc).split(" ", 1)[0]
            return _check_result(news, first_word if first_word in CONFIG_INPUTS else "patches", exc)
        # A checked input, so that `pulumi preview --diff` shows the changed YAML lines, secrets masked.
        return _check_result({**news, "redacted_config": redact_config(rendered, news["secrets"])}, "", None)

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


# --- Talosconfig -------------------------------------------------------------------------------

TALOSCONFIG_INPUTS = ("secrets", "context", "endpoints", "nodes", "renew_before_days")


def _certificate_usable(props: Mapping[str, Any], olds: Mapping[str, Any]) -> bool:
    """Whether the certificate in state is signed by the bundle's OS CA and is not due for renewal."""
    cert = olds.get("client_certificate")
    if not cert:
        return False
    try:
        os_ca, _ = talos_secrets.ca_pair(props["secrets"], "os")
        pki.verify_issued_by(cert.encode(), os_ca)
    except (pki.PKIError, talos_secrets.SecretsBundleError):
        return False
    renew_before = datetime.timedelta(days=float(props.get("renew_before_days") or DEFAULT_RENEW_BEFORE_DAYS))
    now = datetime.datetime.now(datetime.timezone.utc)
    return talos_client.certificate_expires(cert.encode()) - renew_before > now


def talosconfig_outputs(props: Mapping[str, Any], olds: Mapping[str, Any]) -> dict[str, Any]:
    """State of a Talosconfig: reuse the certificate in `olds` when usable, else issue one."""
    if _certificate_usable(props, olds):
        cert, key = olds["client_certificate"].encode(), olds["client_key"].encode()
    else:
        cert, key = talos_client.issue_admin_certificate(props["secrets"])
    text = talos_client.talosconfig_with_certificate(
        props["secrets"], props["context"], props["endpoints"], props.get("nodes") or [], cert, key)
    return {
        "context": props["context"],
        "endpoints": list(props["endpoints"]),
        "nodes": list(props.get("nodes") or []),
        "renew_before_days": props.get("renew_before_days"),
        "client_certificate": cert.decode(),
        "client_key": key.decode(),
        "expires": talos_client.certificate_expires(cert).isoformat(),
        "talosconfig": text,
    }


class TalosconfigProvider(dynamic.ResourceProvider):
    def check(self, _olds: dict[str, Any], news: dict[str, Any]) -> dynamic.CheckResult:
        if any(has_unknowns(news.get(k)) for k in TALOSCONFIG_INPUTS):
            return _check_result(news, "", None)
        try:
            cert, key = talos_client.issue_admin_certificate(news["secrets"])
            talos_client.talosconfig_with_certificate(news["secrets"], news.get("context"), news.get("endpoints"),
                                                      news.get("nodes") or [], cert, key)
        except talos_secrets.SecretsBundleError as exc:
            return _check_result(news, "secrets", exc)
        except talos_client.TalosconfigError as exc:
            return _check_result(news, str(exc).split(":", 1)[0], exc)
        return _check_result(news, "", None)

    def create(self, props: dict[str, Any]) -> dynamic.CreateResult:
        return dynamic.CreateResult(id_=uuid.uuid4().hex, outs=talosconfig_outputs(props, {}))

    def diff(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.DiffResult:
        if any(has_unknowns(news.get(k)) for k in TALOSCONFIG_INPUTS):
            return dynamic.DiffResult(changes=True, replaces=[], stables=[], delete_before_replace=False)
        inputs_changed = (news.get("context") != olds.get("context")
                          or list(news.get("endpoints") or []) != olds.get("endpoints")
                          or list(news.get("nodes") or []) != olds.get("nodes")
                          or news.get("renew_before_days") != olds.get("renew_before_days"))
        return dynamic.DiffResult(changes=inputs_changed or not _certificate_usable(news, olds), replaces=[],
                                  stables=[], delete_before_replace=False)

    def update(self, _id: str, olds: dict[str, Any], news: dict[str, Any]) -> dynamic.UpdateResult:
        return dynamic.UpdateResult(outs=talosconfig_outputs(news, olds))

    def read(self, id_: str, props: dict[str, Any]) -> dynamic.ReadResult:
        return dynamic.ReadResult(id_=id_, outs=props)

    def delete(self, _id: str, _props: dict[str, Any]) -> None:
        return None  # Talos has no revocation; the certificate simply expires


class Talosconfig(dynamic.Resource):
    """A talosctl config for the cluster (`talosconfig`, a secret) with a long-lived os:admin certificate."""

    talosconfig: pulumi.Output[str]
    client_certificate: pulumi.Output[str]
    client_key: pulumi.Output[str]
    expires: pulumi.Output[str]

    def __init__(self, name: str, *, secrets: pulumi.Input[dict], context: pulumi.Input[str],
                 endpoints: pulumi.Input[Sequence[str]], nodes: pulumi.Input[Sequence[str]] = (),
                 renew_before_days: int = DEFAULT_RENEW_BEFORE_DAYS,
                 opts: Optional[pulumi.ResourceOptions] = None):
        props = {
            "secrets": pulumi.Output.secret(secrets), "context": context, "endpoints": endpoints,
            "nodes": nodes, "renew_before_days": renew_before_days,
            "talosconfig": None, "client_certificate": None, "client_key": None, "expires": None,
        }
        opts = pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(
            additional_secret_outputs=["talosconfig", "client_key", "secrets"]))
        super().__init__(TalosconfigProvider(), name, props, opts)
