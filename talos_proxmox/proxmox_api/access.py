"""How to reach the Proxmox VE API: the provider's own settings, so one set of credentials serves both.

The Proxmox provider (bpg/proxmox under pulumi-proxmoxve) reads `proxmoxve:endpoint`, `apiToken`,
`username`, `password` and `insecure` from the stack config, else PROXMOX_VE_ENDPOINT, ... from the
environment. Day-two code reads the same, in the same order, so a stack that deploys also rolls.
Credentials stay out of reprs and messages.
"""

from __future__ import annotations

import os
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

# (stack config key, environment variable), as the provider resolves them.
SOURCES = {
    "endpoint": ("proxmoxve:endpoint", "PROXMOX_VE_ENDPOINT"),
    "api_token": ("proxmoxve:apiToken", "PROXMOX_VE_API_TOKEN"),
    "username": ("proxmoxve:username", "PROXMOX_VE_USERNAME"),
    "password": ("proxmoxve:password", "PROXMOX_VE_PASSWORD"),
    "insecure": ("proxmoxve:insecure", "PROXMOX_VE_INSECURE"),
}
DEFAULT_PORT = 8006


def _settings(config_get: Callable[[str], Any],
              environ: Optional[Mapping[str, str]]) -> Callable[[str], Optional[str]]:
    environ = os.environ if environ is None else environ

    def setting(name: str) -> Optional[str]:
        key, variable = SOURCES[name]
        value = config_get(key)
        if value is None or value == "":
            value = environ.get(variable) or None
        return None if value is None else str(value)
    return setting


def _endpoint(setting: Callable[[str], Optional[str]]) -> tuple[urllib.parse.SplitResult, bool]:
    endpoint = setting("endpoint")
    if not endpoint:
        raise ProxmoxAccessError("proxmoxve:endpoint is not set (nor PROXMOX_VE_ENDPOINT): expected the "
                                 "Proxmox API's URL, e.g. https://pve.lab.local:8006/")
    url = urllib.parse.urlsplit(endpoint)
    if url.scheme not in ("https", "http") or not url.hostname:
        raise ProxmoxAccessError(f"proxmoxve:endpoint: {endpoint!r} is not a URL; expected e.g. "
                                 "https://pve.lab.local:8006/")
    insecure = (setting("insecure") or "false").strip().lower()
    if insecure not in ("true", "false", "1", "0"):
        raise ProxmoxAccessError(f"proxmoxve:insecure: {insecure!r} is not true or false")
    return url, insecure in ("false", "0")


def api_endpoint(config_get: Callable[[str], Any], environ: Optional[Mapping[str, str]] = None) -> tuple[str, bool]:
    """The API's JSON root (what plugins in the cluster are given) and whether its certificate is verified,
    from the provider's endpoint and insecure settings; no credential is read."""
    url, verify_tls = _endpoint(_settings(config_get, environ))
    return f"{url.scheme}://{url.netloc}/api2/json", verify_tls


class ProxmoxAccessError(ValueError):
    """The Proxmox API cannot be reached with what the stack and the environment give; names the keys."""


@dataclass(frozen=True)
class ProxmoxAccess:
    host: str
    port: int
    verify_tls: bool
    user: str  # USER@REALM
    token_name: Optional[str] = None  # with token_value: an API token, else a password login
    token_value: Optional[str] = field(default=None, repr=False)
    password: Optional[str] = field(default=None, repr=False)

    @classmethod
    def from_settings(cls, config_get: Callable[[str], Any],
                      environ: Optional[Mapping[str, str]] = None) -> "ProxmoxAccess":
        """From a config lookup by full key (a dynamic provider's `ConfigureRequest.config.get`) and the
        environment, each setting from the config first, as the provider takes it."""
        setting = _settings(config_get, environ)
        url, verify_tls = _endpoint(setting)
        common = dict(host=url.hostname, port=url.port or DEFAULT_PORT, verify_tls=verify_tls)
        token = setting("api_token")
        if token:
            user_and_name, separator, value = token.partition("=")
            user, bang, name = user_and_name.partition("!")
            if not (separator and bang and value and "@" in user and name):
                raise ProxmoxAccessError("proxmoxve:apiToken (or PROXMOX_VE_API_TOKEN) is not of the form "
                                         "USER@REALM!TOKENID=SECRET (the value is not shown)")
            return cls(user=user, token_name=name, token_value=value, **common)
        username, password = setting("username"), setting("password")
        if username and password:
            return cls(user=username, password=password, **common)
        raise ProxmoxAccessError("no Proxmox credentials: set proxmoxve:apiToken (pulumi config set --secret) or "
                                 "PROXMOX_VE_API_TOKEN, or proxmoxve:username and proxmoxve:password")

    def connect(self, timeout: float = 30.0):
        """A proxmoxer client over HTTPS."""
        from proxmoxer import ProxmoxAPI  # imported here: rendering and settings never need it

        if not self.verify_tls:
            import urllib3

            urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # the stack chose insecure
        credentials = (dict(token_name=self.token_name, token_value=self.token_value) if self.token_name
                       else dict(password=self.password))
        return ProxmoxAPI(self.host, port=self.port, user=self.user, verify_ssl=self.verify_tls,
                          timeout=timeout, service="PVE", **credentials)
