"""Credential hygiene for stack config: credentials come from secret config or the environment only.

A stack file is committed; a plain-text `proxmoxve:apiToken` in it is a leaked token. The Proxmox
provider (bpg/proxmox under pulumi-proxmoxve 8.x) reads PROXMOX_VE_API_TOKEN, PROXMOX_VE_USERNAME,
PROXMOX_VE_PASSWORD, ... from the environment when the config key is unset, and a value set with
`pulumi config set --secret` is stored encrypted (`key: {secure: ...}` in the stack file).

`plaintext_credentials(stack_config)` takes the `config:` mapping of a stack file (or the program's
runtime config through `StackConfig.from_runtime(...).shaped()`) and returns one message per credential stored in
plain text: the provider's credential keys, and in any namespace, at any depth (objects, lists,
Talos patches), keys named like a credential (…token, …password, …secret, privateKey, kubeconfig).
Messages name the key and what to do, never the value. No Pulumi import.
"""

from __future__ import annotations

import re
from typing import Any, Iterator, Mapping

SECURE = "secure"

# proxmoxve provider keys that are credentials, and the environment variable the provider reads instead.
PROXMOX_CREDENTIALS = {
    "proxmoxve:apiToken": "PROXMOX_VE_API_TOKEN",
    "proxmoxve:password": "PROXMOX_VE_PASSWORD",
    "proxmoxve:authTicket": "PROXMOX_VE_AUTH_TICKET",
    "proxmoxve:csrfPreventionToken": "PROXMOX_VE_CSRF_PREVENTION_TOKEN",
    "proxmoxve:otp": "PROXMOX_VE_OTP",
    "proxmoxve:ssh.password": "PROXMOX_VE_SSH_PASSWORD",
    "proxmoxve:ssh.privateKey": "PROXMOX_VE_SSH_PRIVATE_KEY",
    "proxmoxve:ssh.socks5Password": "PROXMOX_VE_SSH_SOCKS5_PASSWORD",
}

# Any other key whose name says it holds a credential (compared case-insensitively).
_CREDENTIAL_NAME = re.compile(
    r"(token|password|passwd|passphrase|secret|privatekey|apikey|accesskey|kubeconfig|talosconfig|credentials?|otp)$",
    re.IGNORECASE,
)


class CredentialsError(ValueError):
    """Plain-text credentials in the stack config; `problems` has one message per key."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("credentials in plain text in the stack config:\n" + "\n".join(f"  - {p}" for p in problems))


def is_secure(value: Any) -> bool:
    """A stack-file value written by `pulumi config set --secret`: {secure: <ciphertext>}."""
    return isinstance(value, Mapping) and set(value) == {SECURE} and isinstance(value[SECURE], str)


def plain_leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    """(path, value) of every plain leaf; encrypted values are leaves that are skipped."""
    if is_secure(value):
        return
    if isinstance(value, Mapping):
        for key, child in value.items():
            yield from plain_leaves(child, f"{path}.{key}")
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from plain_leaves(child, f"{path}[{index}]")
    else:
        yield path, value


def _last_name(path: str) -> str:
    """The key a leaf sits under, through list indexes: `x.credentials[1]` sits under `credentials`."""
    return re.split(r"[.:]", re.sub(r"(\[\d+\])+$", "", path))[-1]


def is_credential_name(name: str) -> bool:
    """Whether a key or variable name says it holds a credential (apiToken, PROXMOX_VE_PASSWORD, ...)."""
    return bool(_CREDENTIAL_NAME.search(name.replace("_", "")))


def _advice(path: str) -> str:
    key = re.split(r"[.\[]", path, maxsplit=1)[0]
    env = PROXMOX_CREDENTIALS.get(path)
    how = f"`pulumi config set --secret {key} ...`" if key == path else \
        f"`pulumi config set --secret --path '{path}' ...`"
    return how + (f" or the {env} environment variable" if env else "")


def plaintext_credentials(stack_config: Mapping[str, Any]) -> list[str]:
    """One message per credential stored in plain text in a stack file's `config:` mapping."""
    problems = []
    for key in sorted(stack_config or {}):
        for path, value in plain_leaves(stack_config[key], key):
            if value is None or value == "" or isinstance(value, bool):
                continue
            if path in PROXMOX_CREDENTIALS or is_credential_name(_last_name(path)):
                problems.append(f"{path}: a credential in plain text; expected a secret ({_advice(path)})")
    return problems


def ensure_no_plaintext_credentials(stack_config: Mapping[str, Any]) -> None:
    """Raise CredentialsError listing every plain-text credential; run before any resource is registered."""
    problems = plaintext_credentials(stack_config)
    if problems:
        raise CredentialsError(problems)
