"""Prometheus' template functions (``humanize``, ``printf``, ``reReplaceAll``, ``eq``, ...), as Go runs them.

Why: an annotation such as ``{{ $value | humanizeDuration }}`` must render as Prometheus 2.42
renders it, so each function follows Prometheus' ``template.go`` (and Go's ``text/template``
builtins for ``eq``/``lt``/``not``/``index``) down to its rounding, unit prefixes, overflow
and error texts. :data:`FUNCS` is the function map the renderer calls; :data:`SIGNATURES`
gives each function's arity and the static types it accepts, so the parser rejects
``humanize $labels`` or ``gt $value 1`` when the rule file loads instead of at the first alert.
``and``/``or`` are in the signatures only: they short-circuit, so the renderer runs them itself.

Regexps (``match``, ``reReplaceAll``) are Go's, unanchored as in Prometheus, on RE2
(:func:`agent.gocompat.regex.compile_go`): the same syntax and answers, in linear time over
whatever label value an alert carries.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta

from agent.errors import RegexError, TemplateError
from agent.gocompat.fmt import format_float, quote, sprintf
from agent.gocompat.regex import Regexp, compile_go, expand
from agent.rules.template.values import MAP, ROOT, Value, go_type, truth

__all__ = ["FUNCS", "SIGNATURES", "go_regexp"]

_FLOAT_SYNTAX = re.compile(r"[+-]?(?:inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)|nan", re.I)


def _to_float(v: Value) -> float:
    if isinstance(v, str):
        if not _FLOAT_SYNTAX.fullmatch(v):
            raise TemplateError(f"strconv.ParseFloat: parsing {quote(v, chr(34))}: invalid syntax")
        if math.isinf(float(v)) and "inf" not in v.lower():
            raise TemplateError(f"strconv.ParseFloat: parsing {quote(v, chr(34))}: value out of range")
        return float(v)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TemplateError(f"can't convert {go_type(v)} to float")
    return float(v)


def _g4(x: float) -> str:
    return format_float(x, "g", 4)  # Go's %.4g


def _shrink(x: float) -> tuple[float, str]:
    prefix = ""
    for p in "munpfazy":
        if abs(x) >= 1:
            break
        prefix, x = p, x * 1000
    return x, prefix


def _humanize(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return _g4(x)
    if abs(x) < 1:
        x, prefix = _shrink(x)
        return _g4(x) + prefix
    prefix = ""
    for p in "kMGTPEZY":
        if abs(x) < 1000:
            break
        prefix, x = p, x / 1000
    return _g4(x) + prefix


def _humanize1024(x: float) -> str:
    if abs(x) <= 1 or not math.isfinite(x):
        return _g4(x)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(x) < 1024:
            break
        prefix, x = p, x / 1024
    return _g4(x) + prefix


def _humanize_duration(x: float) -> str:
    if not math.isfinite(x) or x == 0:
        return _g4(x) + ("s" if x == 0 else "")
    if abs(x) < 1:
        x, prefix = _shrink(x)
        return f"{_g4(x)}{prefix}s"
    sign, x = ("-", -x) if x < 0 else ("", x)
    total = int(x) if x < 2.0**63 else 2**63  # Go's int64(x) on amd64 overflows to MinInt64 = -(2**63)
    days, hours, minutes, seconds = (t if x < 2.0**63 else -t for t in (total // 86400, total // 3600 % 24,
                                                                         total // 60 % 60, total % 60))
    if days:
        return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
    if hours:
        return f"{sign}{hours}h {minutes}m {seconds}s"
    return f"{sign}{minutes}m {seconds}s" if minutes else f"{sign}{_g4(x)}s"


def _humanize_timestamp(x: float) -> str:
    if not math.isfinite(x):
        return _g4(x)
    if not -(2.0**63) <= x * 1e9 <= 2.0**63:
        raise TemplateError(f"{format_float(x)} cannot be represented as a nanoseconds timestamp "
                            "since it overflows int64")
    nanos = int(x * 1e9)
    millis = abs(nanos) // 1_000_000 * (-1 if nanos < 0 else 1)  # Go truncates toward zero
    t = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)
    frac = f".{t.microsecond // 1000:03d}".rstrip("0").rstrip(".")
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d} {t.hour:02d}:{t.minute:02d}:{t.second:02d}{frac} +0000 UTC"


def _str(v: Value) -> str:
    if not isinstance(v, str):
        raise TemplateError(f"wrong type for value; expected string; got {go_type(v)}")
    return v


def _rune_case(c: str, how: Callable[[str], str]) -> str:
    """Go's simple (one-rune) case mapping; Python's full mapping can be longer (ß -> SS), then Go keeps the rune."""
    m = how(c)
    if len(m) > 1 and how is str.upper:
        m = c.title()  # letters with iota subscript: the one-rune title case is the simple upper case
    return m if len(m) == 1 else {"İ": "i"}.get(c, c)


def _case(s: str, how: Callable[[str], str]) -> str:
    return "".join(_rune_case(c, how) for c in s)


def _is_separator(c: str) -> bool:
    """Go's strings.Title word boundary: ASCII other than [0-9A-Za-z_], or a non-ASCII space."""
    if c.isascii():
        return not (c.isalnum() or c == "_")
    return not (c.isalpha() or c.isdecimal()) and c.isspace()


def _title(s: str) -> str:
    return "".join(_rune_case(c, str.title) if _is_separator(prev) else c for prev, c in zip(" " + s, s, strict=False))


def _strip_port(s: str) -> str:
    """Go's net.SplitHostPort host part; the input unchanged where Go reports an error."""
    colon = s.rfind(":")
    if colon < 0:
        return s
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or end + 1 != colon or "[" in s[1:] or "]" in s[end + 1:]:
            return s
        return s[1:end]
    host = s[:colon]
    return s if ":" in host or "[" in s or "]" in s else host


def go_regexp(pattern: str) -> Regexp:
    """A Go regexp (``regexp.MustCompile``, unanchored), in RE2 as in Prometheus' template functions."""
    try:
        return compile_go(pattern, what="regexp")
    except RegexError as exc:
        raise TemplateError(str(exc)) from exc


def _re_replace_all(pattern: str, repl: str, text: str) -> str:
    """Go's ReplaceAllString: an empty match right after a previous match is not replaced."""
    rx, out, last, pos = go_regexp(pattern), list[str](), 0, 0
    while pos <= len(text) and (m := rx.search(text, pos)) is not None:
        out.append(text[last:m.start()])
        if m.end() > last or m.start() == 0:
            out.append(expand(repl, m))
        last, pos = m.end(), max(m.end(), pos + 1)
    return "".join(out) + text[last:]


def _kind(v: Value) -> str:
    kind = go_type(v)
    if kind in (MAP, ROOT):
        raise TemplateError("invalid type for comparison")
    return kind


def _eq(args: Sequence[Value]) -> bool:
    for other in args[1:]:
        if _kind(args[0]) != _kind(other):
            raise TemplateError("incompatible types for comparison")
        if args[0] == other:
            return True
    return False


def _lt(a: Value, b: Value) -> bool:
    if _kind(a) != _kind(b):
        raise TemplateError("incompatible types for comparison")
    if _kind(a) == "bool":
        raise TemplateError("invalid type for comparison")
    return a < b  # type: ignore[operator]  # same basic kind, checked above


# name: (min args, max args or -1, static parameter check, static result type; "*" = the arguments' type)
SIGNATURES: dict[str, tuple[int, int, str, str]] = {
    **dict.fromkeys(["humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp"],
                    (1, 1, "num", "string")),
    **dict.fromkeys(["toUpper", "toLower", "title", "stripPort"], (1, 1, "str", "string")),
    **dict.fromkeys(["ne", "lt", "le", "gt", "ge"], (2, 2, "cmp", "bool")),
    "printf": (1, -1, "fmt", "string"), "reReplaceAll": (3, 3, "str", "string"), "match": (2, 2, "str", "bool"),
    "eq": (2, -1, "cmp", "bool"), "and": (1, -1, "", "*"), "or": (1, -1, "", "*"), "not": (1, 1, "", "bool"),
    "index": (2, 2, "index", "string"),
}
FUNCS: dict[str, Callable[[list[Value]], Value]] = {
    "humanize": lambda a: _humanize(_to_float(a[0])),
    "humanize1024": lambda a: _humanize1024(_to_float(a[0])),
    "humanizeDuration": lambda a: _humanize_duration(_to_float(a[0])),
    "humanizePercentage": lambda a: _g4(_to_float(a[0]) * 100) + "%",
    "humanizeTimestamp": lambda a: _humanize_timestamp(_to_float(a[0])),
    "printf": lambda a: sprintf(_str(a[0]), a[1:]),
    "toUpper": lambda a: _case(_str(a[0]), str.upper),
    "toLower": lambda a: _case(_str(a[0]), str.lower),
    "title": lambda a: _title(_str(a[0])),
    "stripPort": lambda a: _strip_port(_str(a[0])),
    "reReplaceAll": lambda a: _re_replace_all(_str(a[0]), _str(a[1]), _str(a[2])),
    "match": lambda a: go_regexp(_str(a[0])).search(_str(a[1])) is not None,
    "eq": _eq,
    "ne": lambda a: not _eq(a),
    "lt": lambda a: _lt(a[0], a[1]),
    "le": lambda a: _lt(a[0], a[1]) or _eq(a),
    "gt": lambda a: not (_lt(a[0], a[1]) or _eq(a)),
    "ge": lambda a: not _lt(a[0], a[1]),
    "not": lambda a: not truth(a[0]),
    "index": lambda a: _field_of(a[0], a[1]),
}


def _field_of(m: Value, key: Value) -> str:
    if not isinstance(m, Mapping) or not isinstance(key, str):
        raise TemplateError(f"can't index item of type {go_type(m)} with {go_type(key)}")
    return m.get(key, "")
