"""YAML the way Talos reads and writes it (Go yaml.v3 semantics), for machine configs and talosconfig.

Reading: PyYAML implements YAML 1.1, which turns `10:11:22:33:44:55` into a sexagesimal integer and
`on`/`yes` into booleans; Talos (Go yaml.v3) keeps those as strings. `load_documents` uses a loader
with yaml.v3's resolution rules (true/false only; Go integer syntax incl. 0x/0o/0b; no timestamps).

Writing: `dump_documents` emits what yaml.v3 with four-space indentation emits (the layout of
`talosctl gen config` output): nested blocks indented by four, sequences indented under their key,
a mapping inside a sequence item continues two columns after the dash, strings that would read back
as another type double-quoted, multi-line strings as literal blocks, no line folding. Key order is
the caller's; the output is a pure function of the input.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

import yaml

_STR_TAG = "tag:yaml.org,2002:str"


class TalosLoader(yaml.SafeLoader):
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

# yaml.v3 quotes these for YAML 1.1 readers even though it resolves them as strings itself.
_OLD_BOOLS = frozenset("y Y yes Yes YES n N no No NO on On ON off Off OFF".split())
_BASE60_RE = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
_PLAIN_UNSAFE_START = set("-?:,[]{}#&*!|>'\"%@`")
_INDENT = 4


def _resolves_to_non_string(text: str) -> bool:
    if text in _OLD_BOOLS or _BASE60_RE.match(text):
        return True
    return TalosLoader.resolve(TalosLoader, yaml.ScalarNode, text, (True, False)) != _STR_TAG


def _plain_allowed(text: str) -> bool:
    if text != text.strip() or text[0] in _PLAIN_UNSAFE_START and not (text[0] in "-?:" and len(text) > 1 and text[1] != " "):
        return False
    if ": " in text or " #" in text or text.endswith(":") or "\t" in text:
        return False
    return all(ch.isprintable() for ch in text)


def format_scalar(value: Any) -> str:
    """One scalar as yaml.v3 writes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value:
            return ".nan"
        if value in (float("inf"), float("-inf")):
            return "+.inf" if value > 0 else "-.inf"
        return repr(value)
    text = str(value)
    if text == "" or _resolves_to_non_string(text):
        return json.dumps(text, ensure_ascii=False)
    if _plain_allowed(text):
        return text
    if all(ch.isprintable() for ch in text):
        return "'" + text.replace("'", "''") + "'"
    return json.dumps(text, ensure_ascii=False)


def _is_literal(value: Any) -> bool:
    return isinstance(value, str) and "\n" in value and all(ch.isprintable() or ch == "\n" for ch in value)


def _literal_lines(text: str, col: int) -> tuple[str, list[str]]:
    indicator = "|" if text.endswith("\n") else "|-"
    if text.endswith("\n\n"):
        indicator = "|+"
    if text.startswith(" "):
        indicator = indicator[0] + str(_INDENT) + indicator[1:]
    body = text[:-1] if text.endswith("\n") else text
    return indicator, [(" " * col + line) if line else "" for line in body.split("\n")]


def _emit_entry(prefix: str, value: Any, child_col: int, out: list[str]) -> None:
    """`prefix` is everything before the value on its line (indent, '- ', 'key:')."""
    if isinstance(value, dict) and value:
        out.append(prefix)
        _emit_mapping(value, child_col, out)
    elif isinstance(value, list) and value:
        out.append(prefix)
        _emit_sequence(value, child_col, out)
    elif _is_literal(value):
        indicator, lines = _literal_lines(value, child_col)
        out.append(f"{prefix} {indicator}")
        out.extend(lines)
    elif isinstance(value, dict):
        out.append(f"{prefix} {{}}")
    elif isinstance(value, list):
        out.append(f"{prefix} []")
    else:
        out.append(f"{prefix} {format_scalar(value)}")


def _emit_mapping(mapping: dict, col: int, out: list[str], first_prefix: str | None = None) -> None:
    for index, (key, value) in enumerate(mapping.items()):
        lead = first_prefix if (index == 0 and first_prefix is not None) else " " * col
        _emit_entry(f"{lead}{format_scalar(key)}:", value, col + _INDENT if first_prefix is None else col + 2, out)


def _emit_sequence(items: list, col: int, out: list[str]) -> None:
    for item in items:
        dash = " " * col + "- "
        if isinstance(item, dict) and item:
            # yaml.v3: keys continue two columns after the dash, their blocks four columns after it.
            _emit_mapping(item, col + 2, out, first_prefix=dash)
        elif isinstance(item, list) and item:
            nested: list[str] = []
            _emit_sequence(item, col + 2, nested)
            out.append(dash + nested[0].lstrip())
            out.extend(nested[1:])
        else:
            _emit_entry(dash.rstrip(), item, col + _INDENT, out)


def dump_document(document: dict) -> str:
    out: list[str] = []
    _emit_mapping(document, 0, out)
    return "\n".join(out) + "\n"


def dump_documents(documents: Iterable[dict]) -> str:
    """A multi-document stream, '---' between documents, as talosctl writes machine configs."""
    return "---\n".join(dump_document(doc) for doc in documents)
