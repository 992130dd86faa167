"""OpenMetrics 1.0 text, read as strictly as the OpenMetrics parser test-suite reads it.

Why a module apart from the Prometheus text format (:mod:`agent.collect.exposition.text`): OpenMetrics
shares the series syntax (:mod:`agent.collect.exposition.syntax`) but frames a payload differently
and adds rules of its own, and a target that says ``application/openmetrics-text`` must be
held to them, as Prometheus holds it:

* framing: a final ``# EOF`` line, single spaces between fields, no blank lines, no free
  comments, only ``# HELP``/``# TYPE``/``# UNIT`` metadata, before the family's samples;
* families are contiguous, and each type owns its sample-name suffixes (``_total``,
  ``_bucket``, ``_gcount``, ...), which no other family may reuse;
* per sample: timestamps are seconds (turned into milliseconds), values obey their type
  (counters not negative or NaN, info 1, stateset 0 or 1), exemplars only where allowed;
* across samples (:func:`check_family`, run by the full parse only): each metric's samples
  are contiguous, timestamps never go backwards, histogram buckets are ordered, end in
  ``+Inf`` and agree with ``_count``/``_sum``.

:class:`OpenMetricsScan` is the OpenMetrics half of :class:`agent.collect.exposition.Scanner`, which
creates one per payload; like the text-format scan, a line that repeats the previous sample
name costs one ``startswith`` and a skipped sample is only counted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterator
from operator import length_hint

from agent.collect.exposition.syntax import (
    HISTOGRAMS,
    NAME_AT,
    Malformed,
    MetricFamily,
    ParsedSample,
    ScannedSample,
    go_float,
    no_name,
    parse_labelset,
    unescape_lenient,
)
from agent.errors import ExpositionError

__all__ = ["OpenMetricsScan", "check_family"]

_INF = math.inf

#: A label set from its ``{`` to the first ``}`` outside quotes (OpenMetrics lines may
#: carry a second label set, the exemplar's, so the last ``}`` is not the end there).
_LABELSET_AT = re.compile(r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}', re.DOTALL)
#: OpenMetrics ``realnumber`` (timestamps, in seconds): no NaN, no infinities.
_REAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_UNIT = re.compile(r"[a-zA-Z0-9_:]*")

#: Sample-name suffixes per family type.
_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
# Per-sample value rules, by (family type, sample-name suffix).
_NOT_NAN, _NON_NEG, _EXEMPLAR, _ONE, _BOOL = 1, 2, 4, 8, 16
_RULES: dict[tuple[str, str], int] = {
    ("counter", "_total"): _NOT_NAN | _NON_NEG | _EXEMPLAR,
    ("histogram", "_bucket"): _NOT_NAN | _NON_NEG | _EXEMPLAR,
    ("histogram", "_count"): _NOT_NAN | _NON_NEG,
    ("histogram", "_sum"): _NOT_NAN | _NON_NEG,
    ("gaugehistogram", "_bucket"): _NOT_NAN | _NON_NEG | _EXEMPLAR,
    ("gaugehistogram", "_gcount"): _NOT_NAN | _NON_NEG,
    ("gaugehistogram", "_gsum"): _NOT_NAN,
    ("summary", ""): _NON_NEG,
    ("summary", "_count"): _NOT_NAN | _NON_NEG,
    ("summary", "_sum"): _NOT_NAN | _NON_NEG,
    ("info", "_info"): _ONE,
    ("stateset", ""): _BOOL,
}
#: OpenMetrics caps an exemplar's label names plus values at 128 code points.
_EXEMPLAR_MAX_CHARS = 128


class OpenMetricsScan:
    """One OpenMetrics payload's parse state, owned by a :class:`agent.collect.exposition.Scanner`.

    ``wants`` is the scanner's keep test (``None``: keep all). ``types``/``helps``/``units``
    fill in as metadata lines are read; ``lines``/``it`` are the payload's lines and the
    iterator over them, from which the scanner tells the current line number;
    ``samples_total`` is final once the scan has finished.
    """

    def __init__(self, wants: Callable[[str], bool] | None) -> None:
        self._wants = wants
        self.samples_total = 0
        self.types: dict[str, str] = {}
        self.helps: dict[str, str] = {}
        self.units: dict[str, str] = {}
        self.lines: list[str] = []
        self.it: Iterator[str] | None = None
        # The current family, whether it has samples yet, and which family owns each
        # sample name (a family claims its name and its type's suffixed names).
        self._cur: str | None = None
        self._cur_sampled = False
        self._claims: dict[str, str] = {}

    def scan(self, text: str) -> Iterator[ScannedSample]:
        """Frame ``text`` line by line; see :meth:`agent.collect.exposition.Scanner.scan`."""
        lines = _payload_body(text).split("\n")
        lines.pop()  # the body ends with a newline (or is empty)
        it = iter(lines)
        self.lines, self.it = lines, it
        prev = ""
        prefix = "\n"
        keep = False
        rules = 0
        other = 0
        try:
            for line in it:
                if line.startswith(prefix):
                    if not keep:
                        continue
                    series, rest = _split_series(line, len(prefix) - 1)
                else:
                    if not line:
                        raise Malformed("blank line: OpenMetrics allows none")
                    if line[0] == "#":
                        other += 1
                        self._comment(line)
                        continue
                    match = NAME_AT.match(line)
                    if match is None:
                        raise Malformed(no_name(line))
                    name = match.group()
                    if name != prev:
                        keep, rules = self._new_name(name)
                        prev = name
                        prefix = name + "{"
                    at = match.end()
                    if at == len(line):
                        raise Malformed(f"sample {name!r} has no value")
                    delimiter = line[at]
                    if delimiter not in ("{", " "):
                        raise Malformed(f"invalid metric name: {line.split()[0]!r}")
                    if not keep:
                        continue
                    if delimiter == "{":
                        series, rest = _split_series(line, at)
                    else:
                        series, rest = name, line[at:]
                value, timestamp = _value_timestamp(rest, rules, prev)
                yield series, value, timestamp
        except Malformed as exc:
            raise ExpositionError(exc.args[0], len(lines) - length_hint(it)) from None
        finally:
            self.samples_total = len(lines) - length_hint(it) - other

    def _new_name(self, name: str) -> tuple[bool, int]:
        """A sample name differing from the previous line's: continue the current family
        or start a new (unknown-type) one; families must be contiguous."""
        cur = self._cur
        if cur is not None and name.startswith(cur) and name[len(cur) :] in _SUFFIXES[self._type(cur)]:
            family = cur
        else:
            owner = self._claims.get(name)
            if owner is not None:
                if owner == cur:
                    kind = self._type(owner)
                    raise Malformed(f"sample name {name!r} is not valid in {kind} family {cur!r}")
                raise Malformed(
                    f"sample {name!r} of family {owner!r} appears after family {cur!r} started "
                    "(OpenMetrics families must be contiguous)"
                )
            self._start(name)
            family = name
        self._cur_sampled = True
        rules = _RULES.get((self._type(family), name[len(family) :]), 0)
        wants = self._wants
        return wants is None or wants(name), rules

    def _type(self, family: str) -> str:
        return self.types.get(family, "unknown")

    def _start(self, family: str) -> None:
        self._cur = family
        self._cur_sampled = False
        self._claims[family] = family

    def _comment(self, line: str) -> None:
        """``# HELP``/``# TYPE``/``# UNIT`` with single spaces; nothing else may start with #."""
        if not line.startswith("# "):
            raise Malformed("only '# HELP', '# TYPE', '# UNIT' and a final '# EOF' may start with '#'")
        keyword, space, rest = line[2:].partition(" ")
        if keyword == "EOF" and not space:
            raise Malformed("'# EOF' before the end of the payload")
        if keyword not in ("HELP", "TYPE", "UNIT"):
            raise Malformed(f"unknown keyword {keyword!r}: OpenMetrics has no free-form comments")
        if not space:
            raise Malformed(f"# {keyword} without a metric name")
        name, space, value = rest.partition(" ")
        if not NAME_AT.fullmatch(name):
            raise Malformed(f"invalid metric name {name!r} in # {keyword}")
        if not space:
            raise Malformed(f"# {keyword} {name} needs a space and a value after the name")
        self._metadata_family(name)
        if keyword == "HELP":
            if name in self.helps:
                raise Malformed(f"second HELP for family {name!r}")
            self.helps[name] = unescape_lenient(value)
        elif keyword == "TYPE":
            self._set_type(name, value)
        else:
            if name in self.units:
                raise Malformed(f"second UNIT for family {name!r}")
            if not _UNIT.fullmatch(value):
                raise Malformed(f"invalid unit {value!r}")
            if value and not name.endswith("_" + value):
                raise Malformed(f"family name {name!r} does not end with its unit {value!r}")
            if value and self.types.get(name) in ("info", "stateset"):
                raise Malformed(f"{self.types[name]} family {name!r} cannot have a unit")
            self.units[name] = value

    def _metadata_family(self, name: str) -> None:
        """Metadata must precede the family's samples and keep the family contiguous."""
        if name == self._cur:
            if self._cur_sampled:
                raise Malformed(f"metadata for family {name!r} after its samples")
            return
        owner = self._claims.get(name)
        if owner == name:
            raise Malformed(f"family {name!r} appears twice (OpenMetrics families must be contiguous)")
        if owner is not None:
            raise Malformed(f"family name {name!r} clashes with a sample name of family {owner!r}")
        self._start(name)

    def _set_type(self, name: str, kind: str) -> None:
        if name in self.types:
            raise Malformed(f"second TYPE for family {name!r}")
        if kind not in _SUFFIXES:
            hint = " ('untyped' is 'unknown' in OpenMetrics)" if kind == "untyped" else ""
            raise Malformed(f"unknown metric type {kind!r}{hint}")
        if kind in ("info", "stateset") and self.units.get(name):
            raise Malformed(f"{kind} family {name!r} cannot have a unit")
        for suffix in _SUFFIXES[kind]:
            owner = self._claims.get(name + suffix)
            if owner is not None and owner != name:
                raise Malformed(f"{kind} family {name!r} clashes with family {owner!r}")
        for suffix in _SUFFIXES[kind]:
            self._claims[name + suffix] = name
        self.types[name] = kind

    def family_of(self, name: str) -> str:
        """The family a sample name was filed under (or would be, if not seen)."""
        return self._claims.get(name, name)

    def check_type_labels(self, name: str, labels: dict[str, str]) -> None:
        """The labels whose values a family type gives meaning to: a bucket's ``le``, a
        quantile's ``quantile``, a stateset's state label."""
        family = self._claims.get(name, name)
        kind = self.types.get(family)
        suffix = name[len(family) :]
        if kind in HISTOGRAMS and suffix == "_bucket":
            le = labels.get("le")
            bound = None if le is None else go_float(le)
            if le is None or bound is None or math.isnan(bound) or (bound == _INF and le != "+Inf"):
                raise Malformed(f"histogram bucket needs a numeric 'le' label ('+Inf' on top), got {le!r}")
        elif kind == "summary" and suffix == "":
            q = labels.get("quantile")
            rank = None if q is None else go_float(q)
            if rank is None or not 0 <= rank <= 1:
                raise Malformed(f"summary quantile needs a 'quantile' label between 0 and 1, got {q!r}")
        elif kind == "stateset" and family not in labels:
            raise Malformed(f"stateset sample needs a label named {family!r}")


def _payload_body(text: str) -> str:
    """The payload without its final ``# EOF`` line, which must be there and be last."""
    core = text[:-1] if text.endswith("\n") else text
    cut = core.rfind("\n") + 1
    if core[cut:] == "# EOF":
        return core[:cut]
    lines = text.split("\n")
    if "# EOF" in lines:
        raise ExpositionError("text after '# EOF'", lines.index("# EOF") + 2)
    raise ExpositionError("missing '# EOF' at the end: an OpenMetrics body must end with it (truncated?)", len(lines))


def _split_series(line: str, brace: int) -> tuple[str, str]:
    match = _LABELSET_AT.match(line, brace)
    if match is None:
        raise Malformed("label set is not closed with '}' (or has an unterminated value)")
    return line[: match.end()], line[match.end() :]


def _value_timestamp(rest: str, rules: int, name: str) -> tuple[float, int | None]:
    """`` value [timestamp] [# {labels} value [timestamp]]``, single spaces only."""
    if rest[:1] != " ":
        raise Malformed("expected one space before the value")
    rest = rest[1:]
    hash_at = rest.find(" # ")
    head = rest if hash_at < 0 else rest[:hash_at]
    tokens = head.split(" ")
    if len(tokens) > 2 or "" in tokens:
        raise Malformed(f"malformed value/timestamp {head!r} (fields are separated by exactly one space)")
    value = go_float(tokens[0])
    if value is None:
        raise Malformed(f"invalid value {tokens[0]!r}")
    timestamp = _timestamp(tokens[1]) if len(tokens) == 2 else None
    if hash_at >= 0:
        if not rules & _EXEMPLAR:
            raise Malformed(f"exemplar on {name!r}: only counter _total and histogram _bucket may have one")
        _exemplar(rest[hash_at + 3 :])
    if rules:
        if rules & _NOT_NAN and math.isnan(value):
            raise Malformed(f"{name!r} cannot be NaN")
        if rules & _NON_NEG and value < 0:
            raise Malformed(f"{name!r} cannot be negative, got {value!r}")
        if rules & _ONE and value != 1:
            raise Malformed(f"info sample {name!r} must be 1, got {value!r}")
        if rules & _BOOL and value not in (0, 1):
            raise Malformed(f"stateset sample {name!r} must be 0 or 1, got {value!r}")
    return value, timestamp


def _timestamp(token: str) -> int:
    """Seconds (a real number, no NaN or infinity) to integer milliseconds."""
    if not _REAL.fullmatch(token):
        raise Malformed(f"invalid timestamp {token!r}")
    seconds = float(token)
    if seconds in (_INF, -_INF):
        raise Malformed(f"timestamp out of range: {token!r}")
    return round(seconds * 1000)


def _exemplar(text: str) -> None:
    """``{labels} value [timestamp]``: validated, not kept."""
    if text[:1] != "{":
        raise Malformed("exemplar must start with a label set")
    pairs, end = parse_labelset(text, 0, True)
    if sum(len(k) + len(v) for k, v in pairs) > _EXEMPLAR_MAX_CHARS:
        raise Malformed(f"exemplar labels exceed {_EXEMPLAR_MAX_CHARS} characters")
    rest = text[end:]
    if rest[:1] != " ":
        raise Malformed("expected one space after the exemplar's label set")
    tokens = rest[1:].split(" ")
    if len(tokens) > 2 or "" in tokens:
        raise Malformed(f"malformed exemplar value/timestamp {rest[1:]!r}")
    if go_float(tokens[0]) is None:
        raise Malformed(f"invalid exemplar value {tokens[0]!r}")
    if len(tokens) == 2:
        _timestamp(tokens[1])


def check_family(family: MetricFamily, lines: list[int]) -> None:
    """The OpenMetrics rules that span samples: each metric's samples are contiguous,
    its timestamps all present or all absent and never decreasing, and each histogram
    point has ordered buckets ending in +Inf that agree with _count/_sum/_gsum."""
    name, kind = family.name, family.type
    histogram = kind in HISTOGRAMS
    seen: set[frozenset[tuple[str, str]]] = set()
    group: frozenset[tuple[str, str]] | None = None
    last_ts: int | None = None
    point: _HistogramPoint | None = None
    for sample, line in zip(family.samples, lines, strict=True):
        suffix = sample.name[len(name) :]
        drop = None
        if histogram and suffix == "_bucket":
            drop = "le"
        elif kind == "summary" and suffix == "":
            drop = "quantile"
        elif kind == "stateset":
            drop = name
        key = frozenset((k, v) for k, v in sample.labels.items() if k != drop)
        if key != group:
            if key in seen:
                raise ExpositionError(f"samples of one metric of family {name!r} are not contiguous", line)
            seen.add(key)
            group = key
        elif (sample.timestamp_ms is None) != (last_ts is None):
            raise ExpositionError(f"timestamps present on some samples of one metric of {name!r} only", line)
        elif sample.timestamp_ms is not None and last_ts is not None and sample.timestamp_ms < last_ts:
            raise ExpositionError(f"timestamps go backwards within one metric of {name!r}", line)
        last_ts = sample.timestamp_ms
        if histogram and suffix != "_created":
            if point is None or point.key != (key, last_ts):
                if point is not None:
                    point.check(name, line)
                point = _HistogramPoint((key, last_ts))
            point.add(suffix, sample, line, name)
    if point is not None:
        point.check(name, lines[-1])


class _HistogramPoint:
    """One histogram (or gauge histogram) point being checked."""

    __slots__ = ("count", "gsum", "key", "le", "negative_bucket", "sum", "top")

    def __init__(self, key: tuple[frozenset[tuple[str, str]], int | None]) -> None:
        self.key = key
        self.le = -_INF  # the last bucket bound seen
        self.top = 0.0  # the last bucket value seen
        self.count: float | None = None
        self.sum = False
        self.gsum: float | None = None
        self.negative_bucket = False

    def add(self, suffix: str, sample: ParsedSample, line: int, name: str) -> None:
        if suffix == "_bucket":
            bound = float(sample.labels["le"])
            if bound <= self.le:
                raise ExpositionError(f"buckets of histogram {name!r} are not in increasing 'le' order", line)
            if sample.value < self.top:
                raise ExpositionError(f"bucket values of histogram {name!r} decrease", line)
            self.le, self.top = bound, sample.value
            self.negative_bucket = self.negative_bucket or bound < 0
        elif suffix in ("_count", "_gcount"):
            self.count = sample.value
        elif suffix == "_sum":
            self.sum = True
        elif suffix == "_gsum":
            self.gsum = sample.value

    def check(self, name: str, line: int) -> None:
        problem = None
        if self.le != _INF:
            problem = "has no +Inf bucket"
        elif self.count is not None and self.count != self.top:
            problem = "has a count that differs from its +Inf bucket"
        elif (self.sum or self.gsum is not None) and self.count is None:
            problem = "has a sum but no count"
        elif self.count is not None and not self.sum and self.gsum is None:
            problem = "has a count but no sum"
        elif self.negative_bucket and self.sum:
            problem = "has negative buckets and a _sum"
        elif self.gsum is not None and self.gsum < 0 and not self.negative_bucket:
            problem = "has a negative _gsum but no negative bucket"
        if problem:
            raise ExpositionError(f"histogram {name!r} {problem}", line)
