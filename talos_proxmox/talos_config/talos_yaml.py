"""YAML the way Talos reads and writes it (Go yaml.v3 semantics), for machine configs and talosconfig.

Reading: PyYAML implements YAML 1.1, which turns `10:11:22:33:44:55` into a sexagesimal integer and
`on`/`yes` into booleans; Talos (Go yaml.v3) keeps those as strings. `load_documents` uses a loader
with yaml.v3's resolution rules (true/false only; Go integer syntax incl. 0x/0o/0b; no timestamps).

Writing: `dump_documents` joins documents written by talos_proxmox.talos_config.go_yaml (Go's yaml.Marshal,
byte for byte), the layout of `talosctl gen config` output; the output is a pure function of the input.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

import yaml

from talos_proxmox.talos_config import go_yaml

class TalosLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser when installed
    """SafeLoader with Go yaml.v3 scalar resolution."""


TalosLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag.rsplit(":", 1)[-1] not in ("bool", "int", "float", "timestamp")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_BOOL_RE = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_INT_RE = re.compile(r"^[-+]?(?:0[xX][0-9a-fA-F_]+|0[oO][0-7_]+|0[bB][01_]+|0[0-7_]*|[1-9][0-9_]*)$")
_FLOAT_RE = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$")
TalosLoader.add_implicit_resolver("tag:yaml.org,2002:bool", _BOOL_RE, list("tTfF"))
TalosLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT_RE, list("-+0123456789"))
TalosLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_RE, list("-+0123456789."))


def _construct_int(loader, node):
    text = loader.construct_scalar(node).replace("_", "")
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if body[:2] in ("0x", "0X"):
        return sign * int(body[2:], 16)
    if body[:2] in ("0o", "0O"):
        return sign * int(body[2:], 8)
    if body[:2] in ("0b", "0B"):
        return sign * int(body[2:], 2)
    if len(body) > 1 and body.startswith("0"):
        return sign * int(body[1:], 8)  # Go's base-0 parsing reads a leading zero as octal
    return sign * int(body)


def _construct_float(loader, node):
    text = loader.construct_scalar(node).lower()
    if text.endswith("inf"):
        return float("-inf") if text.startswith("-") else float("inf")
    if text == ".nan":
        return float("nan")
    return float(text)


TalosLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
TalosLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def load_documents(text: str) -> list[Any]:
    """Every non-empty document of a YAML stream, with Go yaml.v3 scalar resolution."""
    return [doc for doc in yaml.load_all(text, Loader=TalosLoader) if doc is not None]


def yaml_error_location(exc: yaml.YAMLError) -> str:
    """' at line L, column C' for a YAML error, without the problem text (which can quote secrets)."""
    mark = getattr(exc, "problem_mark", None)
    return f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""


# --- writing -----------------------------------------------------------------------------------


def dump_documents(documents: Iterable[dict]) -> str:
    """A multi-document stream as talosctl writes machine configs: Go's yaml.Marshal of each
    document (talos_proxmox.talos_config.go_yaml), '---' between them. Key order is the caller's."""
    return "---\n".join(go_yaml.marshal(document) for document in documents)
