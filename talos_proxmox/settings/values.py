"""Reading a stack's values: the reader that collects every problem, and the value checkers every section shares. No Pulumi here."""

from __future__ import annotations

import ipaddress
import re
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from talos_proxmox.settings.model import PROJECT, TIMEOUT_RANGE


_MAC = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


_VERSION = re.compile(r"^v?\d+\.\d+\.\d+([-+][0-9A-Za-z.-]+)?$")


_MTU_RANGE = (68, 65535)


_TIMEOUT_EXPECTED = "is not a timeout in seconds (expected an integer in {}-{}, at most a day)".format(*TIMEOUT_RANGE)


SECRET_VALUE = "[secret]"


def top_level_key(path: str) -> str:
    """`nodes` of `nodes[3].ip`, `cluster` of `cluster.patches[0]`."""
    return re.split(r"[.\[]", path, maxsplit=1)[0]


class _Reader:
    """Walks raw config, collecting one problem per bad key instead of stopping at the first.

    `secret_keys` are the top-level keys set with `pulumi config set --secret`: their values are
    never quoted, only named.
    """

    def __init__(self, secret_keys: frozenset[str] = frozenset()) -> None:
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.secret_keys = secret_keys
        self.bad_sections: list[str] = []  # problems inside these follow from the section itself: not repeated

    def shown(self, key: str, value: Any) -> str:
        return SECRET_VALUE if top_level_key(key) in self.secret_keys else repr(value)

    def fail(self, key: str, value: Any, expected: str) -> None:
        self.report(key, f"{self.shown(key, value)} {expected}")

    def report(self, key: str, problem: str) -> None:
        if not any(key.startswith((f"{bad}.", f"{bad}[")) for bad in self.bad_sections):
            self.problems.append(f"{PROJECT}:{key}: {problem}")

    def warn(self, key: str, value: Any, advice: str) -> None:
        self.warnings.append(f"{PROJECT}:{key}: {self.shown(key, value)} {advice}")

    def section(self, raw: Any, key: str, allowed: tuple[str, ...]) -> dict:
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            self.fail(key, raw, "is not a mapping")
            self.bad_sections.append(key)
            return {}
        for unknown in sorted(set(raw) - set(allowed)):
            self.fail(f"{key}.{unknown}", raw[unknown], f"is not a known key (expected one of: {', '.join(allowed)})")
        return dict(raw)

    def value(self, raw: Mapping, key: str, path: str, check: Callable[[Any], Any],
              expected: str, default: Any = ..., ) -> Any:
        """`check` converts a raw value or raises ValueError/TypeError; missing keys take `default`."""
        if key not in raw or raw[key] is None:
            if default is ...:
                self.report(path, f"is required: {expected.removeprefix('is not ')}")
            return None if default is ... else default
        try:
            return check(raw[key])
        except (ValueError, TypeError):
            self.fail(path, raw[key], expected)
            return None if default is ... else default


def _string(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError
    return v


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise TypeError
    return v


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError
    return v


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ValueError
        return v
    return check


def _matching(pattern: re.Pattern) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if not isinstance(v, str) or not pattern.match(v):
            raise ValueError
        return v
    return check


def is_dns_name(value: Any, max_length: int = 253) -> bool:
    """Lowercase RFC 1123 labels joined by dots, at most `max_length` characters (63 for a hostname)."""
    return isinstance(value, str) and len(value) <= max_length and all(_NAME.match(label) for label in value.split("."))


def _dns_domain(v: Any) -> str:
    """A DNS name such as cluster.local or k8s.example.org."""
    if not is_dns_name(v):
        raise ValueError
    return v


def _ip(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError
    return str(ipaddress.ip_address(v))


def _cidr(v: Any) -> str:
    if not isinstance(v, str) or "/" not in v:
        raise ValueError
    return str(ipaddress.ip_network(v, strict=True))


def _cidr_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise TypeError
    return tuple(_cidr(x) for x in v)


def _ip_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not v:
        raise TypeError
    return tuple(_ip(x) for x in v)


def _string_list(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise TypeError
    return tuple(_string(x) for x in v)


def _list_of(check: Callable[[Any], str]) -> Callable[[Any], tuple[str, ...]]:
    def check_all(v: Any) -> tuple[str, ...]:
        if not isinstance(v, list):
            raise TypeError
        return tuple(check(x) for x in v)
    return check_all


def _version(v: Any) -> str:
    if not isinstance(v, str) or not _VERSION.match(v):
        raise ValueError
    return v


def _talos_version(v: Any) -> str:
    """What both later readers take: the machine config's contract (a supported line, no build metadata) and the
    image layer's tag (`v1.13.7+x` is no installer tag). Their errors are ValueErrors."""
    from talos_proxmox.image_factory.images import normalize_version
    from talos_proxmox.talos_config.machine_config import parse_talos_version

    v = _version(v)
    parse_talos_version(v)
    return normalize_version(v)


def _kubernetes_version_value(v: Any) -> str:
    """Without a leading "v", as talosctl takes it: v1.31.0 and 1.31.0 are one version, not a change. As the
    machine config reads it (no build metadata: `1.35.0+k3s1` names no kubelet image); its error is a ValueError."""
    from talos_proxmox.talos_config.machine_config import _kubernetes_version

    return _kubernetes_version(_version(v))


def _mapping(v: Any) -> dict:
    if not isinstance(v, Mapping):
        raise TypeError
    return dict(v)


def _url_text(v: Any) -> str:
    """A URL as one token: no spaces or control characters, which every URL parser handles differently."""
    if not isinstance(v, str):
        raise TypeError
    if any(c.isspace() or ord(c) < 0x20 or ord(c) == 0x7f for c in v):
        raise ValueError
    return v


def _endpoint(v: Any) -> str:
    """https://host:port as Talos parses it (Go's url.Parse, then siderolabs/net ValidateEndpointURI): a port in
    1-65535, and a host that is an IP address (IPv6 in brackets, no zone) or a DNS name, which Go's parser and the
    API server certificate's SANs take."""
    parts = urlsplit(_url_text(v))
    if parts.scheme != "https" or not parts.hostname or parts.port is None or parts.port == 0:
        raise ValueError
    if not is_dns_name(parts.hostname):
        if "%" in parts.hostname:
            raise ValueError
        ipaddress.ip_address(parts.hostname)
    return v


def _mac(v: Any) -> str:
    """A unicast MAC: the group bit (least significant of the first octet) clear, and not all zeros."""
    if not isinstance(v, str) or not _MAC.match(v.lower()):
        raise ValueError
    mac = v.lower()
    if int(mac[:2], 16) & 1 or mac == "00:00:00:00:00:00":
        raise ValueError
    return mac


def _one_of(*choices: str) -> Callable[[Any], str]:
    def check(v: Any) -> str:
        if v not in choices:
            raise ValueError
        return v
    return check


def _patches(reader: _Reader, raw: Any, path: str) -> tuple[Any, ...]:
    """Talos config patches: each a strategic-merge mapping or an RFC 6902 list of operations."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        reader.fail(path, raw, "is not a list of patches")
        return ()
    for i, patch in enumerate(raw):
        where = f"{path}[{i}]"
        if isinstance(patch, Mapping):
            continue
        if isinstance(patch, list) and patch and all(
            isinstance(op, Mapping) and op.get("op") in _JSON_PATCH_OPS and isinstance(op.get("path"), str)
            for op in patch
        ):
            continue
        reader.fail(where, patch, "is neither a mapping (strategic merge patch) nor a list of JSON patch "
                                  "operations with 'op' and 'path'")
    return tuple(raw)


_JSON_PATCH_OPS = ("add", "remove", "replace", "move", "copy", "test")
