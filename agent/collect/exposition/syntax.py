"""The token syntax both exposition formats share: metric and label names, label sets,
escapes and Go-compatible numbers.

Why a module of its own: the Prometheus text format (:mod:`agent.collect.exposition.text`) and
OpenMetrics (:mod:`agent.collect.exposition.openmetrics`) frame lines differently but spell a series the same
way, ``name{label="value",...}``, up to a few differences (text format allows blanks
around label tokens and a trailing comma, OpenMetrics neither; their escape rules differ).
Each rule here is written once, with the format passed as ``om``, so the two parsers
cannot drift apart on what they have in common. Everything here is strict: it answers
what Prometheus' Go parser, or the OpenMetrics test-suite, would accept.

The parse results both formats produce (:data:`ScannedSample`, :class:`ParsedSample`,
:class:`MetricFamily`) are defined here too, the lowest module of the package, so the
formats and the scanner that chooses between them import them from below.

Helpers report a syntax error with :class:`Malformed`, which carries no line number; the
scanners translate it into :class:`agent.errors.ExpositionError` at the line they are on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = [
    "HISTOGRAMS",
    "NAME_AT",
    "Malformed",
    "MetricFamily",
    "ParsedSample",
    "ScannedSample",
    "go_float",
    "no_name",
    "parse_labelset",
    "parse_series",
    "skip_blanks",
    "unescape_lenient",
    "unescape_strict",
]

_INF = math.inf

#: What a scan yields: ``(series_text, value, timestamp_ms)``.
ScannedSample = tuple[str, float, int | None]


@dataclass(frozen=True, slots=True)
class ParsedSample:
    """One sample of a fully parsed payload."""

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None


@dataclass(frozen=True, slots=True)
class MetricFamily:
    """A family with its metadata; ``type`` is ``untyped`` (text) or ``unknown``
    (OpenMetrics) when no ``# TYPE`` line named it."""

    name: str
    type: str
    help: str
    unit: str
    samples: list[ParsedSample]


#: A metric name at the start of a string (legacy charset, as Prometheus 2.x).
NAME_AT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_AT = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: A double-quoted label value with backslash escapes, group 1 the raw inside.
_QUOTED_AT = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_BLANKS_AT = re.compile(r"[ \t]*")
#: Go's strconv.ParseFloat syntax minus hex floats (expfmt rejects p, P and _), which is
#: also OpenMetrics' ``number``; ASCII digits only.
_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
    r"|[nN][aA][nN]"
)
_STRICT_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)
_OM_ESCAPE = re.compile(r'\\[\\"n]')

#: The histogram family types, as both formats normalise them (``gauge_histogram`` is
#: ``gaugehistogram``).
HISTOGRAMS = frozenset({"histogram", "gaugehistogram"})


class Malformed(Exception):
    """A syntax error found by a helper that does not know the line number."""


def no_name(line: str) -> str:
    """The error message for a sample line that does not start with a metric name."""
    if line[0] == "{":
        return "sample without a metric name"
    if line[0] == '"':
        return "quoted (UTF-8) metric names are not supported"
    return f"invalid metric name at {line[:40]!r}"


def skip_blanks(text: str, at: int) -> int:
    """The index of the first non-blank (space/tab) at or after ``at``."""
    match = _BLANKS_AT.match(text, at)
    return match.end() if match else at


def go_float(token: str) -> float | None:
    """Go ``strconv.ParseFloat`` as expfmt uses it, or None where Go returns an error:
    no underscores, hex, surrounding blanks, non-ASCII digits or signed NaN (all of which
    Python's ``float`` accepts), and no overflow to infinity."""
    if not _FLOAT.fullmatch(token):
        return None
    value = float(token)
    if value in (_INF, -_INF) and "n" not in token and "N" not in token:
        return None  # "1e999": out of range, an error in Go
    return value


def unescape_strict(raw: str, what: str) -> str:
    """Text-format escapes: only backslash, double quote and n."""
    if "\\" not in raw:
        return raw

    def one(match: re.Match[str]) -> str:
        char = match.group(1)
        if char == "n":
            return "\n"
        if char in ("\\", '"'):
            return char
        raise Malformed(f"invalid escape sequence '\\{char}' in {what}")

    return _STRICT_ESCAPE.sub(one, raw)


def unescape_lenient(raw: str) -> str:
    """OpenMetrics escapes as its test-suite reads them: the three known ones decoded, any
    other backslash kept as written."""
    if "\\" not in raw:
        return raw
    return _OM_ESCAPE.sub(lambda m: "\n" if m.group() == "\\n" else m.group()[1], raw)


def parse_series(text: str, om: bool) -> tuple[str, list[tuple[str, str]]]:
    """``name`` or ``name{labels}`` (text format also ``name {labels}`` and blanks around
    label tokens, and a trailing comma), fully validated."""
    match = NAME_AT.match(text)
    if match is None:
        raise Malformed(no_name(text) if text else "empty series text")
    name = match.group()
    at = match.end()
    if at == len(text):
        return name, []
    if not om:
        at = skip_blanks(text, at)
    if at == len(text) or text[at] != "{":
        raise Malformed(f"invalid metric name or text after it: {text[:60]!r}")
    pairs, end = parse_labelset(text, at, om)
    if end != len(text):
        raise Malformed(f"unexpected text after the label set: {text[end : end + 40]!r}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise Malformed("label value is not valid UTF-8") from None
    return name, pairs


def parse_labelset(text: str, at: int, om: bool) -> tuple[list[tuple[str, str]], int]:
    """Parse the label set whose ``{`` is at ``text[at]``; return the pairs and the index
    after its ``}``."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    size = len(text)
    at += 1
    while True:
        if not om:
            at = skip_blanks(text, at)
        if at >= size:
            raise Malformed("label set is not closed with '}'")
        if text[at] == "}":
            if om and pairs:
                raise Malformed("trailing comma in label set (not allowed in OpenMetrics)")
            return pairs, at + 1
        match = _LABEL_NAME_AT.match(text, at)
        if match is None:
            raise Malformed(f"invalid label name at {text[at : at + 30]!r}")
        label = match.group()
        at = match.end()
        if not om:
            at = skip_blanks(text, at)
        if at >= size or text[at] != "=":
            raise Malformed(f"expected '=' after label name {label!r}")
        at += 1
        if not om:
            at = skip_blanks(text, at)
        if at >= size or text[at] != '"':
            raise Malformed(f"value of label {label!r} is not quoted")
        quoted = _QUOTED_AT.match(text, at)
        if quoted is None:
            raise Malformed(f"value of label {label!r} is not terminated")
        at = quoted.end()
        raw = quoted.group(1)
        if "\n" in raw:
            raise Malformed(f"value of label {label!r} contains a newline")
        value = unescape_lenient(raw) if om else unescape_strict(raw, f"value of label {label!r}")
        if label == "__name__":
            raise Malformed("label name '__name__' is reserved")
        if label in seen:
            raise Malformed(f"duplicate label name {label!r}")
        seen.add(label)
        pairs.append((label, value))
        if not om:
            at = skip_blanks(text, at)
        if at >= size:
            raise Malformed("label set is not closed with '}'")
        if text[at] == "}":
            return pairs, at + 1
        if text[at] != ",":
            raise Malformed(f"expected ',' or '}}' after the value of label {label!r}, got {text[at]!r}")
        at += 1
