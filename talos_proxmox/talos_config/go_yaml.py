"""YAML text exactly as Go's `yaml.Marshal` writes it (go.yaml.in/yaml/v4, which keeps the v3 defaults).

The Image Factory names a schematic by the SHA-256 of this text, so every byte matters: 4-space
indent, block sequences indented under their key, `{}`/`[]` for empty collections, and Go's rules for
when a string is plain, 'single-quoted', "double-quoted" or a `|` literal block. Only what a
schematic can hold is supported: dicts (emitted in the order given; use `go_sorted` for Go maps),
lists, str, bool, int, float and None. Pure code, no Pulumi.
"""

from __future__ import annotations

import functools
import math
import re
from decimal import Decimal
from typing import Any, Mapping

BEST_INDENT = 4  # yaml.Marshal's indent
MAX_SIMPLE_KEY_BYTES = 128  # longer keys would need the explicit "? key" form, which we do not emit

PLAIN, SINGLE, DOUBLE, LITERAL = "plain", "single", "double", "literal"

# Strings YAML 1.1 reads as bools; Go quotes them with single quotes although YAML 1.2 reads them as str.
_OLD_BOOLS = frozenset("y Y yes Yes YES on On ON n N no No NO off Off OFF".split())
_BASE60_FLOAT = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")
# Plain scalars with these exact spellings resolve to bool, null, float or the merge key, not str.
_RESOLVE_MAP = frozenset(
    "true True TRUE false False FALSE ~ null Null NULL .nan .NaN .NAN .inf .Inf .INF "
    "+.inf +.Inf +.INF -.inf -.Inf -.INF -0 -0.0 <<".split()
) | {""}
_YAML_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?$")
_GO_INT = re.compile(r"^[-+]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|0[0-7]*|[1-9][0-9]*)$")
_DOT_FLOAT = re.compile(r"^\.[0-9]+(?:[eE][-+]?[0-9]+)?$")
# The timestamp layouts Go's resolver tries: date only, "T" form with a zone, space form without.
_TIMESTAMP = re.compile(
    r"^(\d{4})-(\d{1,2})-(\d{1,2})"
    r"(?:[Tt](\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.\d+)?(?:Z|[-+]\d{2}:\d{2})"
    r"| (\d{1,2}):(\d{1,2}):(\d{1,2})(?:\.\d+)?)?$"
)
# Line separators Go treats as line breaks inside otherwise printable text; emitting them
# byte-exactly needs more of the emitter than a schematic is worth, so they are refused.
_UNSUPPORTED_BREAKS = ("\u2028", "\u2029")


class GoYamlError(ValueError):
    """A value that Go's marshaller would write in a form this module does not reproduce."""


class OctalInt(int):
    """An integer a Go type marshals as an octal `!!int` (Talos's FileMode writes `0o644`, not 420)."""


# ---------------------------------------------------------------------------------------------
# How a string scalar is styled


def _is_timestamp(s: str) -> bool:
    m = _TIMESTAMP.match(s)
    if not m:
        return False
    year, month, day = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not 1 <= month <= 12:
        return False
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    days = [31, 29 if leap else 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31][month - 1]
    if not 1 <= day <= days:
        return False
    clock = m.group(4, 5, 6) if m.group(4) is not None else m.group(7, 8, 9)
    if clock[0] is None:
        return True
    hour, minute, second = map(int, clock)
    return hour <= 23 and minute <= 59 and second <= 59


def _int_fits(text: str) -> bool:
    """Whether Go parses `text` (already matching _GO_INT) as int64 or uint64."""
    body = text.lstrip("+-")
    low = body[:2].lower()
    if low in ("0x", "0o", "0b"):
        value = int(body[2:], {"0x": 16, "0o": 8, "0b": 2}[low])
    elif len(body) > 1 and body[0] == "0":
        value = int(body, 8)
    else:
        value = int(body)
    if text.startswith("-"):
        return value <= 2**63
    if text.startswith("+"):
        return value < 2**63
    return value < 2**64


def resolves_to_str(s: str) -> bool:
    """True when the unquoted scalar `s` reads back as a string (Go's resolver, YAML 1.2 core rules)."""
    if s in _RESOLVE_MAP:
        return False
    first = s[0]
    if first == ".":
        return not _DOT_FLOAT.match(s)
    if first in "+-0123456789":
        if _is_timestamp(s):
            return False
        plain = s.replace("_", "")
        if _GO_INT.match(plain) and _int_fits(plain):
            return False
        if _YAML_FLOAT.match(plain):
            return False
    return True


def _printable(c: str) -> bool:
    o = ord(c)
    return (o == 0x0A or 0x20 <= o <= 0x7E or 0xA0 <= o <= 0xD7FF
            or (0xE000 <= o <= 0xFFFD and o != 0xFEFF))


def _is_break(c: str) -> bool:
    return c in "\r\n\x85\u2028\u2029"


class _Analysis:
    """What the emitter may do with a scalar's text (plain, quoted, block)."""

    __slots__ = ("multiline", "plain_allowed", "single_allowed", "block_allowed")

    def __init__(self, value: str):
        if not value:
            self.multiline, self.plain_allowed = False, True
            self.single_allowed, self.block_allowed = True, False
            return
        block_ind = value.startswith(("---", "..."))
        line_breaks = special = tabs = False
        leading_space = leading_break = trailing_space = trailing_break = False
        break_space = space_break = False
        prev_space = prev_break = False
        preceded_by_ws = True
        n = len(value)
        for i, c in enumerate(value):
            followed_by_ws = i + 1 >= n or value[i + 1] in " \t"
            if i == 0:
                if c in "#,[]{}&*!|>'\"%@`":
                    block_ind = True
                elif c in "?:" and followed_by_ws:
                    block_ind = True
                elif c == "-" and followed_by_ws:
                    block_ind = True
            elif c == ":" and followed_by_ws:
                block_ind = True
            elif c == "#" and preceded_by_ws:
                block_ind = True
            if c == "\t":
                tabs = True
            elif not _printable(c):
                special = True
            if c == " ":
                leading_space = leading_space or i == 0
                trailing_space = trailing_space or i == n - 1
                break_space = break_space or prev_break
                prev_space, prev_break = True, False
            elif _is_break(c):
                line_breaks = True
                leading_break = leading_break or i == 0
                trailing_break = trailing_break or i == n - 1
                space_break = space_break or prev_space
                prev_space, prev_break = False, True
            else:
                prev_space = prev_break = False
            preceded_by_ws = c in " \t\0" or _is_break(c)
        self.multiline = line_breaks
        self.plain_allowed = not (leading_space or leading_break or trailing_space or trailing_break
                                  or break_space or space_break or tabs or special
                                  or line_breaks or block_ind)
        self.single_allowed = not (break_space or space_break or tabs or special)
        self.block_allowed = not (trailing_space or space_break or special)


def string_style(s: str, simple_key: bool = False) -> str:
    """The style Go's marshaller picks for string `s` (as a block-context value, or a mapping key)."""
    if "\n" in s:
        style = LITERAL if s.strip() else DOUBLE
    elif s in _OLD_BOOLS or s == "<<" or (s and s[0] in "+-0123456789" and ":" in s
                                           and _BASE60_FLOAT.match(s)):
        style = SINGLE
    elif not s or not resolves_to_str(s):
        style = DOUBLE  # would read back as null/bool/number/timestamp
    else:
        style = PLAIN
    info = _Analysis(s)
    if simple_key and info.multiline:
        style = DOUBLE
    if style == PLAIN and (not info.plain_allowed or (not s and simple_key)):
        style = SINGLE
    if style == SINGLE and not info.single_allowed:
        style = DOUBLE
    if style == LITERAL and (not info.block_allowed or simple_key):
        style = DOUBLE
    return style


_ESCAPES = {0x00: "0", 0x07: "a", 0x08: "b", 0x09: "t", 0x0A: "n", 0x0B: "v", 0x0C: "f", 0x0D: "r",
            0x1B: "e", 0x22: '"', 0x5C: "\\", 0x85: "N", 0xA0: "_", 0x2028: "L", 0x2029: "P"}


def _double_quoted(s: str) -> str:
    # Go checks for a byte-order mark at the start of the whole value on every character, so a
    # leading BOM makes it escape everything; we follow it to keep the bytes identical.
    escape_all = s.startswith("\ufeff")
    out = ['"']
    for c in s:
        o = ord(c)
        if escape_all or not _printable(c) or _is_break(c) or c in '"\\':
            if o in _ESCAPES:
                out.append("\\" + _ESCAPES[o])
            elif o <= 0xFF:
                out.append("\\x%02X" % o)
            elif o <= 0xFFFF:
                out.append("\\u%04X" % o)
            else:
                out.append("\\U%08X" % o)
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Numbers


def go_float(x: float) -> str:
    """strconv.FormatFloat(x, 'g', -1, 64) with YAML's spellings of infinity and NaN."""
    if math.isnan(x):
        return ".nan"
    if math.isinf(x):
        return ".inf" if x > 0 else "-.inf"
    sign, digits, exp = Decimal(repr(x)).as_tuple()
    neg = "-" if sign else ""
    digs = "".join(map(str, digits)).rstrip("0")
    if not digs:
        return neg + "0"
    point = len(digits) + exp  # value = 0.<digs> * 10**point
    x_exp = point - 1
    if x_exp < -4 or x_exp >= 6:  # Go's shortest %g switches to an exponent from 1e+06 on
        mant = digs[0] + ("." + digs[1:] if len(digs) > 1 else "")
        return f"{neg}{mant}e{'-' if x_exp < 0 else '+'}{abs(x_exp):02d}"
    if point <= 0:
        return f"{neg}0.{'0' * -point}{digs}"
    if point >= len(digs):
        return f"{neg}{digs}{'0' * (point - len(digs))}"
    return f"{neg}{digs[:point]}.{digs[point:]}"


# ---------------------------------------------------------------------------------------------
# Map key order for Go maps (yaml sorts them with a "natural" order: digit runs compare as numbers)


def plain_text(value: None | bool | int | float, path: str) -> str:
    """How Go writes a null, boolean or number: always a plain scalar."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return go_float(value)
    if not -2**63 <= value < 2**64:
        raise GoYamlError(f"{path}: integer {value} does not fit in 64 bits")
    return f"0o{value:o}" if isinstance(value, OctalInt) else str(value)


def _wrap_int64(n: int) -> int:
    return (n + 2**63) % 2**64 - 2**63


def _go_key_less(a: str, b: str) -> bool:
    digits = False
    for i in range(min(len(a), len(b))):
        ca, cb = a[i], b[i]
        if ca == cb:
            digits = ca.isdecimal()
            continue
        al, bl = ca.isalpha(), cb.isalpha()
        if al and bl:
            return ca < cb
        if al or bl:
            return al if digits else bl
        an = bn = 0
        if ca == "0" or cb == "0":
            j = i - 1
            while j >= 0 and a[j].isdecimal():
                if a[j] != "0":
                    an = bn = 1
                    break
                j -= 1
        ai = i
        while ai < len(a) and a[ai].isdecimal():
            an = an * 10 + (ord(a[ai]) - 48)
            ai += 1
        bi = i
        while bi < len(b) and b[bi].isdecimal():
            bn = bn * 10 + (ord(b[bi]) - 48)
            bi += 1
        an, bn = _wrap_int64(an), _wrap_int64(bn)  # Go's int64 arithmetic wraps on long digit runs
        if an != bn:
            return an < bn
        if ai != bi:
            return ai < bi
        return ca < cb
    return len(a) < len(b)


def go_sorted(mapping: Mapping[str, Any]) -> dict:
    """The mapping, recursively, with keys in the order Go's yaml writes a map[string]any."""

    def cmp(a: str, b: str) -> int:
        return -1 if _go_key_less(a, b) else (1 if _go_key_less(b, a) else 0)

    def walk(v: Any) -> Any:
        if isinstance(v, Mapping):
            for k in v:
                if not isinstance(k, str):
                    raise GoYamlError(f"map key {k!r} must be a string")
            return {k: walk(v[k]) for k in sorted(v, key=functools.cmp_to_key(cmp))}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    return walk(mapping)


# ---------------------------------------------------------------------------------------------
# The emitter: block mappings and sequences, with the indentation bookkeeping Go's emitter keeps


class _Writer:
    def __init__(self) -> None:
        self.out: list[str] = []
        self.column = 0
        self.whitespace = True
        self.indention = True
        self.indent = -1
        self.indents: list[int] = []

    # -- low level
    def put(self, text: str) -> None:
        self.out.append(text)
        self.column += len(text)

    def put_break(self) -> None:
        self.out.append("\n")
        self.column = 0
        self.indention = True

    def write_indent(self) -> None:
        indent = max(self.indent, 0)
        if not self.indention or self.column > indent or (self.column == indent and not self.whitespace):
            self.put_break()
        if self.column < indent:
            self.put(" " * (indent - self.column))
        self.whitespace = True

    def write_indicator(self, text: str, need_ws: bool, is_ws: bool, is_indention: bool) -> None:
        if need_ws and not self.whitespace:
            self.put(" ")
        self.put(text)
        self.whitespace = is_ws
        self.indention = self.indention and is_indention

    def increase_indent(self, flow: bool, in_sequence_item: bool) -> None:
        self.indents.append(self.indent)
        if self.indent < 0:
            self.indent = BEST_INDENT if flow else 0
        elif in_sequence_item:
            self.indent += 2  # the first level inside "- " just skips the indicator
        else:
            self.indent = BEST_INDENT * ((self.indent + BEST_INDENT) // BEST_INDENT)

    def pop_indent(self) -> None:
        self.indent = self.indents.pop()

    # -- nodes
    def node(self, value: Any, path: str, in_sequence_item: bool, simple_key: bool = False) -> None:
        if isinstance(value, Mapping):
            self.mapping(value, path, in_sequence_item)
        elif isinstance(value, (list, tuple)):
            self.sequence(value, path, in_sequence_item)
        else:
            self.scalar(value, path, in_sequence_item, simple_key)

    def empty_collection(self, brackets: str) -> None:
        self.write_indicator(brackets[0], True, True, False)
        self.write_indicator(brackets[1], False, False, False)

    def mapping(self, value: Mapping, path: str, in_sequence_item: bool) -> None:
        if not value:
            self.empty_collection("{}")
            return
        self.increase_indent(False, in_sequence_item)
        for key, item in value.items():
            if not isinstance(key, str):
                raise GoYamlError(f"{path}: map key {key!r} must be a string")
            if _Analysis(key).multiline or len(key.encode()) > MAX_SIMPLE_KEY_BYTES:
                raise GoYamlError(f"{path}: map key {key!r} must be one line of at most "
                                  f"{MAX_SIMPLE_KEY_BYTES} bytes")
            self.write_indent()
            self.scalar(key, path, False, simple_key=True)
            self.write_indicator(":", False, False, False)
            self.node(item, f"{path}.{key}" if path else key, False)
        self.pop_indent()

    def sequence(self, value: list, path: str, in_sequence_item: bool) -> None:
        if not value:
            self.empty_collection("[]")
            return
        self.increase_indent(False, in_sequence_item)
        for i, item in enumerate(value):
            self.write_indent()
            self.write_indicator("-", True, False, True)
            self.node(item, f"{path}[{i}]", True)
        self.pop_indent()

    def scalar(self, value: Any, path: str, in_sequence_item: bool, simple_key: bool = False) -> None:
        if value is None or isinstance(value, (bool, int, float)):
            text, style = plain_text(value, path), PLAIN
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise GoYamlError(f"{path}: {value!r} is not valid UTF-8 text") from exc
            if any(sep in value for sep in _UNSUPPORTED_BREAKS):
                raise GoYamlError(f"{path}: {value!r} contains U+2028/U+2029 line separators; "
                                  "use \\n line breaks")
            text, style = value, string_style(value, simple_key)
        else:
            raise GoYamlError(f"{path}: {type(value).__name__} value {value!r} cannot be written; "
                              "expected a string, number, boolean, null, list or mapping")
        self.increase_indent(True, in_sequence_item)
        if style == PLAIN:
            if text and not self.whitespace:
                self.put(" ")
            self.put(text)
            if text:
                self.whitespace = False
            self.indention = False
        elif style == SINGLE:
            self.write_indicator("'", True, False, False)
            self.put(text.replace("'", "''"))
            self.write_indicator("'", False, False, False)
            self.whitespace = self.indention = False
        elif style == DOUBLE:
            self.write_indicator('"', True, False, False)
            self.put(_double_quoted(text)[1:-1])
            self.write_indicator('"', False, False, False)
            self.whitespace = self.indention = False
        else:
            self.literal(text)
        self.pop_indent()

    def literal(self, text: str) -> None:
        self.write_indicator("|", True, False, False)
        if text.startswith(" "):
            self.write_indicator(str(BEST_INDENT), False, False, False)
        if not text.endswith("\n"):
            self.write_indicator("-", False, False, False)
        elif text == "\n" or text.endswith("\n\n"):
            self.write_indicator("+", False, False, False)
        self.put_break()
        self.whitespace = True
        at_line_start = True
        for c in text:
            if c == "\n":
                self.put_break()
                at_line_start = True
            else:
                if at_line_start:
                    self.write_indent()
                self.put(c)
                self.indention = False
                at_line_start = False


def marshal(document: Mapping[str, Any]) -> str:
    """The YAML text Go's yaml.Marshal gives for a document whose root is a mapping."""
    w = _Writer()
    w.mapping(document, "", False)
    w.indent = -1
    w.write_indent()
    return "".join(w.out)
