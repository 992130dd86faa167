"""Prometheus text exposition (0.0.4) and OpenMetrics 1.0 parsing, built for the scrape hot path.

Why the agent has its own parser: ingest is the one loop that runs for every sample of
every target, and the agent stores only the series its rules read (DESIGN.md decision 3).
``prometheus_client.parser`` walks label values character by character (over 10 µs a
sample) and is laxer than Prometheus (it accepts ``\\t`` escapes, CRLF values, blank
timestamps), so it is neither fast enough nor a faithful judge of what Prometheus would
reject. This module follows the Go text parser (prometheus/common ``expfmt.TextParser``)
rule for rule, and the OpenMetrics 1.0 specification as its parser test-suite reads it.

Three layers, cheapest first:

* :meth:`Scanner.scan` frames lines. A sample line whose name repeats the previous line's
  (histogram buckets, one family's series) costs one ``startswith``; a skipped sample is
  only counted. For a kept sample it cuts the name-and-labels text (the cache key) from
  the value and timestamp, and checks the value and timestamp strictly. It also checks
  every ``#`` line, family metadata order and metric names.
* :meth:`Scanner.labels_of` validates one name-and-labels text completely (label names,
  quoting, escapes, duplicates, ``__name__``, ``le``/``quantile``) and returns its labels.
  The scraper calls it once per *new* text: identical text parses identically, so a cached
  text needs no second look. Until ``labels_of`` has seen a kept sample's text, its label
  block is unchecked; a caller that does not cache must call it for every sample
  (:func:`parse` does).
* :func:`parse` is the full, validated parse into :class:`MetricFamily` objects; in
  OpenMetrics mode it adds the rules that span samples (metric grouping, timestamp order,
  histogram bucket consistency).

Skipped samples are deliberately not parsed beyond their name: a malformed label set or
value on a line nobody asked for does not fail the scrape. That is the price of skipping
cheaply, and what Prometheus itself would reject is still rejected for every kept line.

Deliberate differences from the Go parser: only legacy names are accepted (Prometheus 3's
quoted UTF-8 metric and label names are rejected); a duplicate ``le`` or ``quantile`` label
is an error (Go silently keeps the last); a missing final newline is reported before any
sample is yielded, so a truncated body never half-writes a scrape.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from operator import length_hint

from agent.errors import ExpositionError

__all__ = [
    "MetricFamily",
    "ParsedSample",
    "ScannedSample",
    "Scanner",
    "content_type_is_openmetrics",
    "parse",
]

#: What :meth:`Scanner.scan` yields: ``(series_text, value, timestamp_ms)``.
ScannedSample = tuple[str, float, int | None]

_INF = math.inf

#: A metric name at the start of a string (legacy charset, as Prometheus 2.x).
_NAME_AT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_AT = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: A double-quoted label value with backslash escapes, group 1 the raw inside.
_QUOTED_AT = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_BLANKS_AT = re.compile(r"[ \t]*")
_BLANK = re.compile(r"[ \t]")
#: The usual metadata line; anything else takes the slow, Go-faithful path.
_HELP_OR_TYPE = re.compile(r"# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]+([^ \t].*)", re.DOTALL)
#: A series text with neither blanks nor escapes (what exporters write), for a quick split;
#: text format allows a trailing comma, OpenMetrics does not.
_PLAIN_SERIES = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*",)*'
    r'(?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")?)\})?'
)
_PLAIN_SERIES_OM = re.compile(
    r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{((?:[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*"'
    r'(?:,[a-zA-Z_][a-zA-Z0-9_]*="[^"\\\n]*")*)?)\})?'
)
_LABEL_PAIR = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
#: A label set from its ``{`` to the first ``}`` outside quotes (OpenMetrics lines may
#: carry a second label set, the exemplar's, so the last ``}`` is not the end there).
_LABELSET_AT = re.compile(r'\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\}', re.DOTALL)
#: Go's strconv.ParseFloat syntax minus hex floats (expfmt rejects p, P and _), which is
#: also OpenMetrics' ``number``; ASCII digits only.
_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)"
    r"|[nN][aA][nN]"
)
#: OpenMetrics ``realnumber`` (timestamps, in seconds): no NaN, no infinities.
_REAL = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Go's strconv.ParseInt(s, 10, 64) syntax.
_INT = re.compile(r"[+-]?[0-9]+")
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: A token made only of these is a plain decimal number if ``float`` takes it, with none of
#: the forms Python accepts and Go does not (blanks, underscores, other digits, signed NaN).
_DECIMAL_CHARS = "0123456789.e+-"
_STRICT_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)
_OM_ESCAPE = re.compile(r'\\[\\"n]')
_UNIT = re.compile(r"[a-zA-Z0-9_:]*")

#: Text-format ``# TYPE`` values (any case, as Go's ``strings.ToUpper`` lookup), normalised.
_TEXT_TYPES = {
    "counter": "counter",
    "gauge": "gauge",
    "summary": "summary",
    "untyped": "untyped",
    "histogram": "histogram",
    "gauge_histogram": "gaugehistogram",
    "gaugehistogram": "gaugehistogram",
}
_HISTOGRAMS = frozenset({"histogram", "gaugehistogram"})
#: The sample-name suffixes by which the Go parser files a sample under a summary or
#: histogram family.
_GO_SUFFIXES = ("_count", "_sum", "_bucket")
_BLANK_OR_EMPTY = ("", " ", "\t")
#: Sample names a freshly typed text-format family uses, with whether Go rejects negative
#: values on them (histogram buckets and counts are unsigned integers there).
_EXPECTED: dict[str, tuple[tuple[str, bool], ...]] = {
    "counter": (("", False),),
    "gauge": (("", False),),
    "untyped": (("", False),),
    "summary": (("", False), ("_count", False), ("_sum", False)),
    "histogram": (("_bucket", True), ("_count", True), ("_sum", False)),
    "gaugehistogram": (("_bucket", True), ("_count", True), ("_sum", False)),
}

#: OpenMetrics sample-name suffixes per family type.
_OM_SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
# Per-sample value rules in OpenMetrics, by (family type, sample-name suffix).
_NOT_NAN, _NON_NEG, _EXEMPLAR, _ONE, _BOOL = 1, 2, 4, 8, 16
_OM_RULES: dict[tuple[str, str], int] = {
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

_TRUNCATED = "payload does not end with a newline: the body is truncated or its last line is incomplete"


class _Malformed(Exception):
    """A syntax error found by a helper that does not know the line number."""


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


def content_type_is_openmetrics(content_type: str) -> bool:
    """True when a response's Content-Type is OpenMetrics text (any version/charset)."""
    return content_type.split(";", 1)[0].strip().lower() == "application/openmetrics-text"


class Scanner:
    """One payload's parse state. Create one per scrape.

    ``wants`` decides which samples :meth:`scan` yields, by sample name (``None``: all);
    it is asked once per run of lines with the same name. ``samples_total`` counts every
    sample line, kept or skipped (Prometheus' ``scrape_samples_scraped``) and is final once
    the scan has finished. ``types``/``helps``/``units`` map family names to their
    metadata as seen so far (types normalised to lower case, ``gauge_histogram`` as
    ``gaugehistogram``).
    """

    def __init__(self, wants: Container[str] | None = None, *, openmetrics: bool = False) -> None:
        # A dict (such as the store's KeepList, which fills itself in __missing__) is asked
        # with a C-level __getitem__ instead of a Python-level __contains__: this runs per name.
        self._wants: Callable[[str], bool] | None = (
            None if wants is None else wants.__getitem__ if isinstance(wants, dict) else wants.__contains__
        )
        self._om = openmetrics
        self.samples_total = 0
        self.types: dict[str, str] = {}
        self.helps: dict[str, str] = {}
        self.units: dict[str, str] = {}
        self._scanned = False
        self._lines: list[str] = []
        self._it: Iterator[str] | None = None
        # Text format: the Go parser's metric families (created by HELP, TYPE or a sample),
        # and each sample name seen -> (keep it, reject negative values).
        self._families: dict[str, None] = {}
        self._names: dict[str, tuple[bool, bool]] = {}
        # OpenMetrics: the current family, whether it has samples yet, and which family
        # owns each sample name (a family claims its name and its type's suffixed names).
        self._om_cur: str | None = None
        self._om_cur_sampled = False
        self._claims: dict[str, str] = {}

    # -- public ----------------------------------------------------------------------
    def scan(self, text: str) -> Iterator[ScannedSample]:
        """Yield ``(series_text, value, timestamp_ms)`` for every wanted sample.

        Raises :class:`ExpositionError` (with the 1-based line) on malformed input; a
        body that is cut short is reported before anything is yielded.
        """
        if self._scanned:
            raise RuntimeError("a Scanner holds one payload's state: create one per scrape")
        self._scanned = True
        return self._scan_om(text) if self._om else self._scan_text(text)

    def labels_of(self, series_text: str) -> tuple[str, dict[str, str]]:
        """Fully validate one name-and-labels text and return ``(name, labels)``.

        Called while a scan is suspended at that sample, an error carries its line number.
        """
        try:
            plain = (_PLAIN_SERIES_OM if self._om else _PLAIN_SERIES).fullmatch(series_text)
            if plain is not None:  # no blanks, no escapes: split with one findall
                name, body = plain.group(1, 2)
                pairs = _LABEL_PAIR.findall(body) if body else []
                labels = dict(pairs)
                if len(labels) != len(pairs) or "__name__" in labels or not series_text.isascii():
                    name, pairs = _parse_series(series_text, self._om)  # finds what is wrong
                    labels = dict(pairs)
            else:
                name, pairs = _parse_series(series_text, self._om)
                labels = dict(pairs)
            self._check_type_labels(name, labels)
        except _Malformed as exc:
            raise ExpositionError(exc.args[0], self._line_of(series_text)) from None
        return name, labels

    # -- text format -----------------------------------------------------------------
    def _scan_text(self, text: str) -> Iterator[ScannedSample]:
        lines = text.split("\n")
        if lines.pop().strip(" \t"):  # what follows the last newline
            raise ExpositionError(_TRUNCATED, len(lines) + 1)
        it = iter(lines)
        self._lines, self._it = lines, it
        names, families, types, helps = self._names, self._families, self.types, self.helps
        new_name, valid_name, text_types = self._text_new_name, _METRIC_NAME.fullmatch, _TEXT_TYPES
        prev = ""
        prefix = "\n"  # the current sample name and "{"; matches no line before the first sample
        keep = nonneg = False
        other = 0  # blank and comment lines
        try:
            for line in it:
                if not line.startswith(prefix):
                    if line.startswith("#"):
                        other += 1
                        # Inline fast paths for the usual metadata of a new family; anything
                        # else (and every error) goes through _text_comment.
                        tag = line[:7]
                        if tag == "# TYPE ":
                            name, _, meta = line[7:].partition(" ")
                            kind = text_types.get(meta)
                            if kind and name in families and name not in types and name not in names:
                                types[name] = kind
                                self._expect_samples(name, kind)
                                continue
                        elif tag == "# HELP ":
                            name, _, meta = line[7:].partition(" ")
                            if (
                                meta[:1] not in _BLANK_OR_EMPTY
                                and name not in families
                                and not name.endswith(_GO_SUFFIXES)
                                and "\\" not in meta
                                and valid_name(name)
                            ):
                                families[name] = None
                                helps[name] = meta
                                continue
                        self._text_comment(line)
                        continue
                    brace = line.find("{")
                    name = line[:brace] if brace > 0 else ""
                    info = names.get(name)
                    if info is None and not (brace > 0 and valid_name(name)):
                        # Not "name{": a blank line, leading blanks, no labels, a blank
                        # before the "{", or no valid name at all. Rare, so read carefully.
                        text_line = line.lstrip(" \t")
                        if not text_line:
                            other += 1
                            continue
                        if text_line[0] == "#":
                            other += 1
                            self._text_comment(text_line)
                            continue
                        match = _NAME_AT.match(text_line)
                        if match is None:
                            raise _Malformed(_no_name(text_line))
                        name = match.group()
                        if name != prev:
                            info = names.get(name)
                            if info is None:
                                info = names[name] = self._text_new_name(name)
                            keep, nonneg = info
                            prev = name
                            prefix = name + "{"
                        if not keep:
                            continue
                        series, rest = _text_split(text_line, match.end())
                        value, timestamp = _text_value_timestamp(rest)
                        if nonneg and value < 0:
                            raise _Malformed(f"negative histogram bucket or count {value!r} for {prev!r}")
                        yield series, value, timestamp
                        continue
                    # "name{" with another name: already seen in this payload, or new.
                    if info is None:
                        info = names[name] = new_name(name)
                    keep, nonneg = info
                    prev = name
                    prefix = name + "{"
                if not keep:
                    continue
                # "name{labels} value". Neither value nor timestamp contains "}", so the last
                # one closes the label set of a well-formed line (labels_of() rejects any
                # other split). Fast path: one space and a plain decimal number.
                end = line.rfind("}")
                if line.startswith(" ", end + 1) and not (token := line[end + 2 :]).strip(_DECIMAL_CHARS):
                    try:
                        value = float(token)
                    except ValueError:
                        value = _INF  # not a number after all: the slow path says why
                    if -_INF < value < _INF:
                        timestamp = None
                    else:
                        value, timestamp = _text_value_timestamp(line[end + 1 :])
                elif end < 0:
                    raise _Malformed("label set is not closed with '}'")
                else:
                    value, timestamp = _text_value_timestamp(line[end + 1 :])
                if nonneg and value < 0:
                    raise _Malformed(f"negative histogram bucket or count {value!r} for {prev!r}")
                yield line[: end + 1], value, timestamp
        except _Malformed as exc:
            raise ExpositionError(exc.args[0], len(lines) - length_hint(it)) from None
        finally:
            self.samples_total = len(lines) - length_hint(it) - other

    def _text_new_name(self, name: str) -> tuple[bool, bool]:
        """First sample of ``name`` in this payload: (keep it, reject negative values).

        Files it under its family as the Go parser does (see :meth:`_resolve_text`); a name
        that is its own family creates it, which later ``# HELP``/``# TYPE`` lines see.
        """
        nonneg = False
        families = self._families
        if name not in families:  # the Go rule of _resolve_text, inlined: this runs per name
            if name.endswith(_GO_SUFFIXES):
                kind = self.types.get(name[: name.rfind("_")])
                if kind in _HISTOGRAMS:
                    # The Go parser stores histogram buckets and counts as unsigned
                    # integers and rejects negative ones.
                    nonneg = not name.endswith("_sum")
                elif kind != "summary" or name.endswith("_bucket"):
                    families[name] = None
            else:
                families[name] = None
        wants = self._wants
        return wants is None or wants(name), nonneg

    def _expect_samples(self, family: str, kind: str) -> None:
        """Just typed: file the sample names the family will use now, as _text_new_name
        would at their first line (one call here instead of a slow first line each)."""
        names, families, wants = self._names, self._families, self._wants
        for suffix, nonneg in _EXPECTED[kind]:
            name = family + suffix
            if name not in names and (not suffix or name not in families):
                names[name] = (wants is None or wants(name), nonneg)

    def _resolve_text(self, name: str, create: bool) -> str:
        """The family a name belongs to, by the Go parser's rule: an existing family of
        that exact name, else a summary/histogram it is the ``_sum``/``_count``/``_bucket``
        of, else a new family of its own."""
        if name in self._families:
            return name
        if name.endswith(_GO_SUFFIXES):
            base = name[: name.rfind("_")]
            kind = self.types.get(base) if base else None
            if kind == "summary" and not name.endswith("_bucket"):
                return base
            if kind in _HISTOGRAMS:
                return base
        if create:
            self._families[name] = None
        return name

    def _text_comment(self, line: str) -> None:
        """A ``#`` line (leading blanks already removed): HELP, TYPE or a plain comment."""
        match = _HELP_OR_TYPE.fullmatch(line)
        if match is not None:  # the usual "# HELP name text" / "# TYPE name type"
            keyword, name, value = match.groups()
        else:  # anything else, read the way the Go parser reads it
            body = line[1:].lstrip(" \t")
            blank = _BLANK.search(body)
            if blank is None:  # "#", "# word": nothing to check
                return
            keyword, rest = body[: blank.start()], body[blank.start() :].lstrip(" \t")
            if keyword not in ("HELP", "TYPE") or not rest:  # a comment, or a bare "# HELP"
                return
            named = _NAME_AT.match(rest)
            after = rest[named.end() :] if named else rest
            if named is None or (after and after[0] not in " \t"):
                raise _Malformed(f"invalid metric name in # {keyword} line: {rest.split()[0]!r}")
            name, value = named.group(), after.lstrip(" \t")
            if not after:  # "# HELP name": tolerated, creates nothing
                return
        family = name if name in self._families else self._resolve_text(name, True)
        if not value:  # "# HELP name " creates the family, sets nothing
            return
        if keyword == "HELP":
            if family in self.helps:
                raise _Malformed(f"second HELP line for metric name {family!r}")
            self.helps[family] = _unescape_strict(value, "HELP text") if "\\" in value else value
            return
        # A family still without a type can only have had samples of its exact name (a
        # _sum/_count/_bucket goes to its base family only once that is typed; the names
        # _expect_samples files ahead belong to typed families).
        if family in self.types or family in self._names:
            raise _Malformed(f"second TYPE line for metric name {family!r}, or TYPE reported after samples")
        kind = _TEXT_TYPES.get(value) or _TEXT_TYPES.get(value.lower())
        if kind is None:
            raise _Malformed(f"unknown metric type {value!r}")
        self.types[family] = kind

    # -- OpenMetrics -----------------------------------------------------------------
    def _scan_om(self, text: str) -> Iterator[ScannedSample]:
        lines = _om_body(text).split("\n")
        lines.pop()  # the body ends with a newline (or is empty)
        it = iter(lines)
        self._lines, self._it = lines, it
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
                    series, rest = _om_split(line, len(prefix) - 1)
                else:
                    if not line:
                        raise _Malformed("blank line: OpenMetrics allows none")
                    if line[0] == "#":
                        other += 1
                        self._om_comment(line)
                        continue
                    match = _NAME_AT.match(line)
                    if match is None:
                        raise _Malformed(_no_name(line))
                    name = match.group()
                    if name != prev:
                        keep, rules = self._om_new_name(name)
                        prev = name
                        prefix = name + "{"
                    at = match.end()
                    if at == len(line):
                        raise _Malformed(f"sample {name!r} has no value")
                    delimiter = line[at]
                    if delimiter not in ("{", " "):
                        raise _Malformed(f"invalid metric name: {line.split()[0]!r}")
                    if not keep:
                        continue
                    if delimiter == "{":
                        series, rest = _om_split(line, at)
                    else:
                        series, rest = name, line[at:]
                value, timestamp = _om_value_timestamp(rest, rules, prev)
                yield series, value, timestamp
        except _Malformed as exc:
            raise ExpositionError(exc.args[0], len(lines) - length_hint(it)) from None
        finally:
            self.samples_total = len(lines) - length_hint(it) - other

    def _om_new_name(self, name: str) -> tuple[bool, int]:
        """A sample name differing from the previous line's: continue the current family
        or start a new (unknown-type) one; families must be contiguous."""
        cur = self._om_cur
        if cur is not None and name.startswith(cur) and name[len(cur) :] in _OM_SUFFIXES[self._om_type(cur)]:
            family = cur
        else:
            owner = self._claims.get(name)
            if owner is not None:
                if owner == cur:
                    kind = self._om_type(owner)
                    raise _Malformed(f"sample name {name!r} is not valid in {kind} family {cur!r}")
                raise _Malformed(
                    f"sample {name!r} of family {owner!r} appears after family {cur!r} started "
                    "(OpenMetrics families must be contiguous)"
                )
            self._om_start(name)
            family = name
        self._om_cur_sampled = True
        rules = _OM_RULES.get((self._om_type(family), name[len(family) :]), 0)
        wants = self._wants
        return wants is None or wants(name), rules

    def _om_type(self, family: str) -> str:
        return self.types.get(family, "unknown")

    def _om_start(self, family: str) -> None:
        self._om_cur = family
        self._om_cur_sampled = False
        self._claims[family] = family

    def _om_comment(self, line: str) -> None:
        """``# HELP``/``# TYPE``/``# UNIT`` with single spaces; nothing else may start with #."""
        if not line.startswith("# "):
            raise _Malformed("only '# HELP', '# TYPE', '# UNIT' and a final '# EOF' may start with '#'")
        keyword, space, rest = line[2:].partition(" ")
        if keyword == "EOF" and not space:
            raise _Malformed("'# EOF' before the end of the payload")
        if keyword not in ("HELP", "TYPE", "UNIT"):
            raise _Malformed(f"unknown keyword {keyword!r}: OpenMetrics has no free-form comments")
        if not space:
            raise _Malformed(f"# {keyword} without a metric name")
        name, space, value = rest.partition(" ")
        if not _METRIC_NAME.fullmatch(name):
            raise _Malformed(f"invalid metric name {name!r} in # {keyword}")
        if not space:
            raise _Malformed(f"# {keyword} {name} needs a space and a value after the name")
        self._om_metadata_family(name)
        if keyword == "HELP":
            if name in self.helps:
                raise _Malformed(f"second HELP for family {name!r}")
            self.helps[name] = _unescape_lenient(value)
        elif keyword == "TYPE":
            self._om_set_type(name, value)
        else:
            if name in self.units:
                raise _Malformed(f"second UNIT for family {name!r}")
            if not _UNIT.fullmatch(value):
                raise _Malformed(f"invalid unit {value!r}")
            if value and not name.endswith("_" + value):
                raise _Malformed(f"family name {name!r} does not end with its unit {value!r}")
            if value and self.types.get(name) in ("info", "stateset"):
                raise _Malformed(f"{self.types[name]} family {name!r} cannot have a unit")
            self.units[name] = value

    def _om_metadata_family(self, name: str) -> None:
        """Metadata must precede the family's samples and keep the family contiguous."""
        if name == self._om_cur:
            if self._om_cur_sampled:
                raise _Malformed(f"metadata for family {name!r} after its samples")
            return
        owner = self._claims.get(name)
        if owner == name:
            raise _Malformed(f"family {name!r} appears twice (OpenMetrics families must be contiguous)")
        if owner is not None:
            raise _Malformed(f"family name {name!r} clashes with a sample name of family {owner!r}")
        self._om_start(name)

    def _om_set_type(self, name: str, kind: str) -> None:
        if name in self.types:
            raise _Malformed(f"second TYPE for family {name!r}")
        if kind not in _OM_SUFFIXES:
            hint = " ('untyped' is 'unknown' in OpenMetrics)" if kind == "untyped" else ""
            raise _Malformed(f"unknown metric type {kind!r}{hint}")
        if kind in ("info", "stateset") and self.units.get(name):
            raise _Malformed(f"{kind} family {name!r} cannot have a unit")
        for suffix in _OM_SUFFIXES[kind]:
            owner = self._claims.get(name + suffix)
            if owner is not None and owner != name:
                raise _Malformed(f"{kind} family {name!r} clashes with family {owner!r}")
        for suffix in _OM_SUFFIXES[kind]:
            self._claims[name + suffix] = name
        self.types[name] = kind

    # -- shared ----------------------------------------------------------------------
    def _family_of(self, name: str) -> str:
        """The family a sample name was filed under (or would be, if not seen)."""
        if self._om:
            return self._claims.get(name, name)
        # Not created again: a sample name filed under its base family never becomes a
        # family of its own later, so this repeats the filing the scan made.
        return self._resolve_text(name, False)

    def _check_type_labels(self, name: str, labels: dict[str, str]) -> None:
        """The labels whose values a family type gives meaning to."""
        family = self._family_of(name)
        kind = self.types.get(family)
        if not self._om:
            if kind == "summary" and "quantile" in labels and _go_float(labels["quantile"]) is None:
                raise _Malformed(f"expected float as value for 'quantile' label, got {labels['quantile']!r}")
            if kind in _HISTOGRAMS and "le" in labels and _go_float(labels["le"]) is None:
                raise _Malformed(f"expected float as value for 'le' label, got {labels['le']!r}")
            return
        suffix = name[len(family) :]
        if kind in _HISTOGRAMS and suffix == "_bucket":
            le = labels.get("le")
            bound = None if le is None else _go_float(le)
            if le is None or bound is None or math.isnan(bound) or (bound == _INF and le != "+Inf"):
                raise _Malformed(f"histogram bucket needs a numeric 'le' label ('+Inf' on top), got {le!r}")
        elif kind == "summary" and suffix == "":
            q = labels.get("quantile")
            rank = None if q is None else _go_float(q)
            if rank is None or not 0 <= rank <= 1:
                raise _Malformed(f"summary quantile needs a 'quantile' label between 0 and 1, got {q!r}")
        elif kind == "stateset" and family not in labels:
            raise _Malformed(f"stateset sample needs a label named {family!r}")

    def _current_line(self) -> int:
        return len(self._lines) - length_hint(self._it) if self._it is not None else 0

    def _line_of(self, series_text: str) -> int:
        """The line a series text came from: the current one if it is there, else the first
        line starting with it, else 0."""
        current = self._current_line()
        if 0 < current <= len(self._lines) and series_text in self._lines[current - 1]:
            return current
        for number, line in enumerate(self._lines, 1):
            if line.lstrip(" \t").startswith(series_text):
                return number
        return 0


# -- helpers: text format -------------------------------------------------------------
def _no_name(line: str) -> str:
    if line[0] == "{":
        return "sample without a metric name"
    if line[0] == '"':
        return "quoted (UTF-8) metric names are not supported"
    return f"invalid metric name at {line[:40]!r}"


def _skip_blanks(text: str, at: int) -> int:
    """The index of the first non-blank (space/tab) at or after ``at``."""
    match = _BLANKS_AT.match(text, at)
    return match.end() if match else at


def _text_split(line: str, at: int) -> tuple[str, str]:
    """Cut a sample line after its name-and-labels (``name``, ``name{..}``, ``name {..}``)."""
    brace = at
    if brace < len(line) and line[brace] in " \t":
        brace = _skip_blanks(line, brace)
    if brace < len(line) and line[brace] == "{":
        end = line.rfind("}")
        if end < brace:
            raise _Malformed("label set is not closed with '}'")
        return line[: end + 1], line[end + 1 :]
    return line[:at], line[at:]


def _text_value_timestamp(rest: str) -> tuple[float, int | None]:
    """The Go parser's reading of what follows the labels: blanks, a value token, and
    optionally blanks and an integer timestamp; nothing after that, not even a blank."""
    rest = rest.lstrip(" \t")
    blank = _BLANK.search(rest)
    token = rest if blank is None else rest[: blank.start()]
    value = _go_float(token)
    if value is None:
        raise _Malformed(f"expected float as value, got {token!r}")
    if blank is None:
        return value, None
    stamp = rest[blank.start() :].lstrip(" \t")
    blank = _BLANK.search(stamp)
    if blank is not None:
        if stamp[: blank.start()] and _INT.fullmatch(stamp[: blank.start()]):
            raise _Malformed(f"spurious string after timestamp: {stamp[blank.start() :]!r}")
        stamp = stamp[: blank.start()]
    if not _INT.fullmatch(stamp) or not _INT64_MIN <= int(stamp) <= _INT64_MAX:
        raise _Malformed(f"expected integer as timestamp, got {stamp!r}")
    return value, int(stamp)


def _go_float(token: str) -> float | None:
    """Go ``strconv.ParseFloat`` as expfmt uses it, or None where Go returns an error:
    no underscores, hex, surrounding blanks, non-ASCII digits or signed NaN (all of which
    Python's ``float`` accepts), and no overflow to infinity."""
    if not _FLOAT.fullmatch(token):
        return None
    value = float(token)
    if value in (_INF, -_INF) and "n" not in token and "N" not in token:
        return None  # "1e999": out of range, an error in Go
    return value


def _unescape_strict(raw: str, what: str) -> str:
    """Text-format escapes: only backslash, double quote and n."""
    if "\\" not in raw:
        return raw

    def one(match: re.Match[str]) -> str:
        char = match.group(1)
        if char == "n":
            return "\n"
        if char in ("\\", '"'):
            return char
        raise _Malformed(f"invalid escape sequence '\\{char}' in {what}")

    return _STRICT_ESCAPE.sub(one, raw)


def _unescape_lenient(raw: str) -> str:
    """OpenMetrics escapes as its test-suite reads them: the three known ones decoded, any
    other backslash kept as written."""
    if "\\" not in raw:
        return raw
    return _OM_ESCAPE.sub(lambda m: "\n" if m.group() == "\\n" else m.group()[1], raw)


def _parse_series(text: str, om: bool) -> tuple[str, list[tuple[str, str]]]:
    """``name`` or ``name{labels}`` (text format also ``name {labels}`` and blanks around
    label tokens, and a trailing comma), fully validated."""
    match = _NAME_AT.match(text)
    if match is None:
        raise _Malformed(_no_name(text) if text else "empty series text")
    name = match.group()
    at = match.end()
    if at == len(text):
        return name, []
    if not om:
        at = _skip_blanks(text, at)
    if at == len(text) or text[at] != "{":
        raise _Malformed(f"invalid metric name or text after it: {text[:60]!r}")
    pairs, end = _parse_labelset(text, at, om)
    if end != len(text):
        raise _Malformed(f"unexpected text after the label set: {text[end : end + 40]!r}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _Malformed("label value is not valid UTF-8") from None
    return name, pairs


def _parse_labelset(text: str, at: int, om: bool) -> tuple[list[tuple[str, str]], int]:
    """Parse the label set whose ``{`` is at ``text[at]``; return the pairs and the index
    after its ``}``."""
    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    size = len(text)
    at += 1
    while True:
        if not om:
            at = _skip_blanks(text, at)
        if at >= size:
            raise _Malformed("label set is not closed with '}'")
        if text[at] == "}":
            if om and pairs:
                raise _Malformed("trailing comma in label set (not allowed in OpenMetrics)")
            return pairs, at + 1
        match = _LABEL_NAME_AT.match(text, at)
        if match is None:
            raise _Malformed(f"invalid label name at {text[at : at + 30]!r}")
        label = match.group()
        at = match.end()
        if not om:
            at = _skip_blanks(text, at)
        if at >= size or text[at] != "=":
            raise _Malformed(f"expected '=' after label name {label!r}")
        at += 1
        if not om:
            at = _skip_blanks(text, at)
        if at >= size or text[at] != '"':
            raise _Malformed(f"value of label {label!r} is not quoted")
        quoted = _QUOTED_AT.match(text, at)
        if quoted is None:
            raise _Malformed(f"value of label {label!r} is not terminated")
        at = quoted.end()
        raw = quoted.group(1)
        if "\n" in raw:
            raise _Malformed(f"value of label {label!r} contains a newline")
        value = _unescape_lenient(raw) if om else _unescape_strict(raw, f"value of label {label!r}")
        if label == "__name__":
            raise _Malformed("label name '__name__' is reserved")
        if label in seen:
            raise _Malformed(f"duplicate label name {label!r}")
        seen.add(label)
        pairs.append((label, value))
        if not om:
            at = _skip_blanks(text, at)
        if at >= size:
            raise _Malformed("label set is not closed with '}'")
        if text[at] == "}":
            return pairs, at + 1
        if text[at] != ",":
            raise _Malformed(f"expected ',' or '}}' after the value of label {label!r}, got {text[at]!r}")
        at += 1


# -- helpers: OpenMetrics -------------------------------------------------------------
def _om_body(text: str) -> str:
    """The payload without its final ``# EOF`` line, which must be there and be last."""
    core = text[:-1] if text.endswith("\n") else text
    cut = core.rfind("\n") + 1
    if core[cut:] == "# EOF":
        return core[:cut]
    lines = text.split("\n")
    if "# EOF" in lines:
        raise ExpositionError("text after '# EOF'", lines.index("# EOF") + 2)
    raise ExpositionError("missing '# EOF' at the end: an OpenMetrics body must end with it (truncated?)", len(lines))


def _om_split(line: str, brace: int) -> tuple[str, str]:
    match = _LABELSET_AT.match(line, brace)
    if match is None:
        raise _Malformed("label set is not closed with '}' (or has an unterminated value)")
    return line[: match.end()], line[match.end() :]


def _om_value_timestamp(rest: str, rules: int, name: str) -> tuple[float, int | None]:
    """`` value [timestamp] [# {labels} value [timestamp]]``, single spaces only."""
    if rest[:1] != " ":
        raise _Malformed("expected one space before the value")
    rest = rest[1:]
    hash_at = rest.find(" # ")
    head = rest if hash_at < 0 else rest[:hash_at]
    tokens = head.split(" ")
    if len(tokens) > 2 or "" in tokens:
        raise _Malformed(f"malformed value/timestamp {head!r} (fields are separated by exactly one space)")
    value = _go_float(tokens[0])
    if value is None:
        raise _Malformed(f"invalid value {tokens[0]!r}")
    timestamp = _om_timestamp(tokens[1]) if len(tokens) == 2 else None
    if hash_at >= 0:
        if not rules & _EXEMPLAR:
            raise _Malformed(f"exemplar on {name!r}: only counter _total and histogram _bucket may have one")
        _om_exemplar(rest[hash_at + 3 :])
    if rules:
        if rules & _NOT_NAN and math.isnan(value):
            raise _Malformed(f"{name!r} cannot be NaN")
        if rules & _NON_NEG and value < 0:
            raise _Malformed(f"{name!r} cannot be negative, got {value!r}")
        if rules & _ONE and value != 1:
            raise _Malformed(f"info sample {name!r} must be 1, got {value!r}")
        if rules & _BOOL and value not in (0, 1):
            raise _Malformed(f"stateset sample {name!r} must be 0 or 1, got {value!r}")
    return value, timestamp


def _om_timestamp(token: str) -> int:
    """Seconds (a real number, no NaN or infinity) to integer milliseconds."""
    if not _REAL.fullmatch(token):
        raise _Malformed(f"invalid timestamp {token!r}")
    seconds = float(token)
    if seconds in (_INF, -_INF):
        raise _Malformed(f"timestamp out of range: {token!r}")
    return round(seconds * 1000)


def _om_exemplar(text: str) -> None:
    """``{labels} value [timestamp]``: validated, not kept."""
    if text[:1] != "{":
        raise _Malformed("exemplar must start with a label set")
    pairs, end = _parse_labelset(text, 0, True)
    if sum(len(k) + len(v) for k, v in pairs) > _EXEMPLAR_MAX_CHARS:
        raise _Malformed(f"exemplar labels exceed {_EXEMPLAR_MAX_CHARS} characters")
    rest = text[end:]
    if rest[:1] != " ":
        raise _Malformed("expected one space after the exemplar's label set")
    tokens = rest[1:].split(" ")
    if len(tokens) > 2 or "" in tokens:
        raise _Malformed(f"malformed exemplar value/timestamp {rest[1:]!r}")
    if _go_float(tokens[0]) is None:
        raise _Malformed(f"invalid exemplar value {tokens[0]!r}")
    if len(tokens) == 2:
        _om_timestamp(tokens[1])


def _om_check_family(family: MetricFamily, lines: list[int]) -> None:
    """The OpenMetrics rules that span samples: each metric's samples are contiguous,
    its timestamps all present or all absent and never decreasing, and each histogram
    point has ordered buckets ending in +Inf that agree with _count/_sum/_gsum."""
    name, kind = family.name, family.type
    histogram = kind in _HISTOGRAMS
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


# -- the full parse -------------------------------------------------------------------
def parse(text: str, *, openmetrics: bool = False) -> list[MetricFamily]:
    """Parse and validate a whole payload into families (in order of first sample).

    Families with metadata but no samples are left out, as the Go parser does.
    """
    scanner = Scanner(None, openmetrics=openmetrics)
    samples: dict[str, list[ParsedSample]] = {}
    lines: dict[str, list[int]] = {}
    for series, value, timestamp in scanner.scan(text):
        name, labels = scanner.labels_of(series)
        family = scanner._family_of(name)
        bucket = samples.get(family)
        if bucket is None:
            bucket = samples[family] = []
            lines[family] = []
        bucket.append(ParsedSample(name, labels, value, timestamp))
        lines[family].append(scanner._current_line())
    default = "unknown" if openmetrics else "untyped"
    families = [
        MetricFamily(
            family_name,
            scanner.types.get(family_name, default),
            scanner.helps.get(family_name, ""),
            scanner.units.get(family_name, ""),
            family_samples,
        )
        for family_name, family_samples in samples.items()
    ]
    if openmetrics:
        for built in families:
            _om_check_family(built, lines[built.name])
    return families
