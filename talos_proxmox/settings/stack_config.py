"""A stack's whole config, from `pulumi up` or from a stack file, to `Settings`, refusing anything wrong
before a resource exists. `__main__.py` and the render command both call `load_stack`, so they refuse
the same stacks with the same lines.

In order: plain-text credentials (CredentialsError); keys under a misspelled namespace (which Pulumi would
silently ignore); every typed setting (`load_settings`); every node's machine config with all its patches
(`config_preflight`); the adopted secrets bundle. Problems are one line each, and no line holds a secret
value: values under secret keys are never quoted, and every secret string is masked in what is left.
No Pulumi import.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from talos_proxmox.settings.credentials import SECURE, ensure_no_plaintext_credentials, is_secure, plain_leaves
from talos_proxmox.settings.model import PROJECT, Settings, SettingsError
from talos_proxmox.settings.stack import load_settings, stack_file_values
from talos_proxmox.talos_config import secrets_bundle
from talos_proxmox.day_two import backup_target, etcd_snapshot_file, recovery_snapshot

# Namespaces a stack of this program uses; a near miss of one of them is a typo, not another provider.
KNOWN_NAMESPACES = (PROJECT, "proxmoxve", "kubernetes", "pulumi")
MASK = "[secret]"
_MIN_MASKED = 4  # shorter strings ("true", "1") would mask unrelated words


@dataclass(frozen=True)
class StackConfig:
    """Config keys with namespace (`talos-proxmox:cluster`, `proxmoxve:endpoint`) to parsed values, and which
    keys are secret. From a stack file a secret's value is its `{secure: ...}` ciphertext."""
    values: Mapping[str, Any]
    secret_keys: frozenset[str]

    @classmethod
    def from_file(cls, path: str) -> "StackConfig":
        values = stack_file_values(path)
        return cls(values, frozenset(k for k, v in values.items() if is_secure(v)))

    @classmethod
    def from_runtime(cls, config: Mapping[str, str], is_secret: Callable[[str], bool]) -> "StackConfig":
        """The Pulumi runtime's config: strings, objects as JSON text, secrets decrypted."""
        values = {}
        for key, value in config.items():
            if isinstance(value, str) and value[:1] in "{[":
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            values[key] = value
        return cls(values, frozenset(k for k in config if is_secret(k)))

    def shaped(self) -> dict[str, Any]:
        """Stack-file shape, secrets as `{secure: ...}`, as `plaintext_credentials` takes it."""
        return {k: ({SECURE: "<encrypted>"} if k in self.secret_keys else v) for k, v in self.values.items()}


def misspelled_namespaces(keys: Iterator[str] | list[str]) -> list[str]:
    """One line per key whose namespace is a near miss of one this program reads (`talos-proxmx:ccm`)."""
    problems = []
    for key in sorted(keys):
        namespace, sep, name = key.partition(":")
        if not sep or namespace in KNOWN_NAMESPACES:
            continue
        close = difflib.get_close_matches(namespace, KNOWN_NAMESPACES, n=1, cutoff=0.75)
        if close:
            problems.append(f"{key}: namespace {namespace!r} is not one this program reads, so the key would be "
                            f"ignored (expected {close[0]}:{name})")
    return problems


def mask_secrets(lines: list[str], secrets: set[str]) -> list[str]:
    """`lines` with every secret string replaced by MASK; longest first, so no tail of a longer secret that
    contains a shorter one stays visible."""
    ordered = sorted((s for s in secrets if len(s) >= _MIN_MASKED), key=len, reverse=True)
    masked = []
    for line in lines:
        for secret in ordered:
            line = line.replace(secret, MASK)
        masked.append(line)
    return masked


def _project_path(source: str, base_dir: Path) -> Path:
    """A path of the stack config: `~` expanded, relative ones to the project directory."""
    path = Path(source).expanduser()
    return path if path.is_absolute() else base_dir / path


def _secrets_file(settings: Settings, base_dir: Path) -> tuple[Settings, list[str]]:
    """cluster.secretsFile resolved against the project directory, read and validated as a bundle."""
    source = settings.cluster.secrets_file
    if source is None:
        return settings, []
    path = _project_path(source, base_dir)
    key = f"{PROJECT}:cluster.secretsFile"
    if not path.is_file():
        return settings, [f"{key}: {source!r} does not exist (expected a secrets bundle written by "
                          f"`talosctl gen secrets`, relative to {base_dir})"]
    try:
        secrets_bundle.load_secrets_file(str(path))
    except secrets_bundle.SecretsBundleError as err:
        lines = [line.strip(" -") for line in str(err).splitlines() if line.strip(" -")]
        details = lines[1:] if len(lines) > 1 else lines  # past the "bundle is invalid:" heading
        more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
        return settings, [f"{key}: {source!r} is not a Talos secrets bundle: {details[0]}{more}"]
    cluster = dataclasses.replace(settings.cluster, secrets_file=str(path))
    return dataclasses.replace(settings, cluster=cluster), []


def _recover_from(settings: Settings, base_dir: Path) -> tuple[Settings, list[str]]:
    """cluster.recoverFrom (a file, resolved against the project directory, or an object in the backup bucket)
    read, decrypted if need be, and checked to be an etcd snapshot of this cluster."""
    source = settings.cluster.recover_from
    if source is None:
        return settings, []
    key = f"{PROJECT}:cluster.recoverFrom"
    identity_file = settings.cluster.recover_identity_file
    if identity_file is not None:
        identity_file = str(_project_path(identity_file, base_dir))
    resolved = source if recovery_snapshot.is_object(source) else str(_project_path(source, base_dir))
    try:
        data = recovery_snapshot.read_recovery_snapshot(resolved, target=backup_target.target_of(settings),
                                                        identity_file=identity_file)
        facts = etcd_snapshot_file.read_snapshot(data)
    except recovery_snapshot.RecoverySnapshotError as err:
        return settings, [f"{key}: {source!r} {err}"]
    except etcd_snapshot_file.SnapshotError as err:
        return settings, [f"{key}: {source!r} cannot be recovered from: {err}"]
    problem = etcd_snapshot_file.foreign_snapshot_problem(facts, [(n.name, n.ip) for n in settings.control_planes])
    if problem is not None:
        return settings, [f"{key}: {source!r} {problem}"]
    cluster = dataclasses.replace(settings.cluster, recover_from=resolved, recover_identity_file=identity_file,
                                  recover_from_sha256=hashlib.sha256(data).hexdigest())
    return dataclasses.replace(settings, cluster=cluster), []


def load_stack(config: StackConfig, base_dir: Path) -> Settings:
    """Settings for the stack, or SettingsError (CredentialsError for credentials) with every problem."""
    from talos_proxmox.cluster_plan.config_preflight import node_config_problems

    ensure_no_plaintext_credentials(config.shaped())
    secrets = {leaf for k in config.secret_keys for _path, leaf in plain_leaves(config.values[k], k)
               if isinstance(leaf, str)}
    prefix = f"{PROJECT}:"
    problems = misspelled_namespaces(list(config.values))
    raw, secret_tops = {}, set()
    for key, value in config.values.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        if is_secure(value):  # a stack file's ciphertext: only the Pulumi CLI can decrypt it
            problems.append(f"{key}: is a secret, which only `pulumi preview`/`pulumi up` can decrypt (expected a "
                            "plain value for the offline render command)")
            continue
        raw[name] = value
        if key in config.secret_keys:
            secret_tops.add(name)
    settings = None
    try:
        settings = load_settings(raw, secret_tops)
    except SettingsError as err:
        problems += err.problems
    if settings is not None and not problems:
        problems += node_config_problems(settings)
        settings, file_problems = _secrets_file(settings, base_dir)
        problems += file_problems
        settings, file_problems = _recover_from(settings, base_dir)
        problems += file_problems
    if problems:
        raise SettingsError(mask_secrets(problems, secrets))
    return dataclasses.replace(settings, warnings=tuple(mask_secrets(list(settings.warnings), secrets)))
