"""Prometheus' expanding series notation (``metric{a="b"} 0+10x10 _ stale 1x3``).

promqltest ``load`` blocks and promtool's unit-test ``input_series`` both describe
series this way, so the conformance runner and the rule-test runner share this parser.
The semantics are those of Prometheus' ``ParseSeriesDesc``:

* ``a+bxN`` / ``a-bxN``: N+1 values ``a, a+b, ..., a+N*b`` (added one step at a time,
  so float rounding matches Prometheus);
* ``axN``: ``a`` repeated N+1 times; ``_``: one missing sample; ``_xN``: N missing;
* ``stale``: a staleness marker (:data:`agent.series.STALE_NAN`);
* numbers may be signed, use exponents, or be ``Inf``/``NaN`` (any case);
  hexadecimal is not allowed (``0x1`` would read as a repetition).

Missing samples come back as None, so the caller places samples at ``index *
interval`` and skips the None ones.
"""

from __future__ import annotations

import re

from agent.errors import PromQLError
from agent.series import STALE_NAN, Labels, labels_from

__all__ = ["expand_values", "parse_labels", "parse_series_line"]

_NUMBER = r"(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[iI][nN][fF]|[nN][aA][nN])"
_ITEM = re.compile(
    rf"""(?:
        (?P<blank>_)(?:x(?P<blank_times>\d+))?
      | (?P<value>stale|[+-]?{_NUMBER})
        (?:(?P<step>[+-]{_NUMBER})?x(?P<times>\d+))?
    )\Z""",
    re.VERBOSE,
)
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME = re.compile(r"\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"'}
_ESCAPE = re.compile(r"\\(?:([abfnrtv\\'\"])|x([0-9a-fA-F]{2})|([0-7]{3})|u([0-9a-fA-F]{4})|U([0-9a-fA-F]{8}))")


def _number(text: str) -> float:
    return float(text)  # Python's float() reads every form _NUMBER admits, Inf/NaN included


def expand_values(text: str) -> list[float | None]:
    """Expand the value part of a series description."""
    out: list[float | None] = []
    for item in text.split():
        m = _ITEM.match(item)
        if m is None:
            raise PromQLError(f"bad series value {item!r}: expected a number, '_', 'stale' or 'a+bxN'")
        if m.group("blank"):
            out += [None] * (int(m.group("blank_times")) if m.group("blank_times") else 1)
            continue
        raw = m.group("value")
        value = STALE_NAN if raw == "stale" else _number(raw)
        times = m.group("times")
        if times is None:
            out.append(value)
            continue
        step = m.group("step")
        if step is None:
            out += [value] * (int(times) + 1)
            continue
        inc = _number(step)
        for _ in range(int(times) + 1):
            out.append(value)
            value += inc  # a stale marker plus anything is an ordinary NaN, as in Go
    return out


def _unquote(body: str) -> str:
    def one(m: re.Match[str]) -> str:
        simple, hex2, octal, u4, u8 = m.groups()
        if simple:
            return _ESCAPES[simple]
        if hex2:
            return chr(int(hex2, 16))
        if octal:
            return chr(int(octal, 8))
        return chr(int(u4 or u8, 16))

    return _ESCAPE.sub(one, body)


def _string(text: str, pos: int) -> tuple[str, int]:
    """A PromQL string literal starting at ``pos``: its value and the index after it."""
    quote = text[pos : pos + 1]
    if quote == "`":
        end = text.find("`", pos + 1)
        if end < 0:
            raise PromQLError(f"unterminated raw string in {text!r}")
        return text[pos + 1 : end], end + 1
    if quote not in ('"', "'"):
        raise PromQLError(f"expected a quoted label value at {pos} in {text!r}")
    i = pos + 1
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == quote:
            return _unquote(text[pos + 1 : i]), i + 1
        i += 1
    raise PromQLError(f"unterminated string in {text!r}")


def parse_labels(text: str) -> tuple[Labels, int]:
    """``name{a="b", ...}`` (either part optional) at the start of ``text``: the label
    tuple and the index where the labels end."""
    pos = len(text) - len(text.lstrip())
    labels: dict[str, str] = {}
    m = _NAME.match(text, pos)
    name = None
    if m is not None:
        name = m.group(0)
        pos = m.end()
    if text.startswith("{", pos):
        pos += 1
        while True:
            while pos < len(text) and text[pos] in " \t,":
                pos += 1
            if text.startswith("}", pos):
                pos += 1
                break
            lm = _LABEL_NAME.match(text, pos)
            if lm is None:
                raise PromQLError(f"bad label set in {text!r}")
            labels[lm.group(1)], pos = _string(text, lm.end())
    elif name is None:
        raise PromQLError(f"expected a metric name or label set in {text!r}")
    return labels_from(name, labels), pos


def parse_series_line(line: str) -> tuple[Labels, list[float | None]]:
    """``metric{a="b"} 0+10x10 _ stale`` -> (labels, expanded values)."""
    labels, end = parse_labels(line)
    rest = line[end:]
    if rest and not rest[0].isspace():
        raise PromQLError(f"expected whitespace after the labels in {line!r}")
    return labels, expand_values(rest)
