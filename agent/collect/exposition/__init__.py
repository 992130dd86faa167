"""Prometheus text exposition (0.0.4) and OpenMetrics 1.0 parsing, built for the scrape hot path.

Why the agent has its own parser: ingest is the one loop that runs for every sample of
every target, and the agent stores only the series its rules read (DESIGN.md decision 3).
``prometheus_client.parser`` walks label values character by character (over 10 µs a
sample) and is laxer than Prometheus (it accepts ``\\t`` escapes, CRLF values, blank
timestamps), so it is neither fast enough nor a faithful judge of what Prometheus would
reject. The parser follows the Go text parser (prometheus/common ``expfmt.TextParser``)
rule for rule, and the OpenMetrics 1.0 specification as its parser test-suite reads it.

This module is the API (what the scraper, the benchmark and the tests use); the formats
live beside it: :mod:`agent.collect.exposition.text` (the text format's framing and Go rules),
:mod:`agent.collect.exposition.openmetrics` (OpenMetrics framing, value rules and cross-sample checks) and
:mod:`agent.collect.exposition.syntax` (the series, label and number syntax the two share).

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
"""

from __future__ import annotations

import re
from collections.abc import Callable, Container, Iterator
from operator import length_hint

from agent.collect.exposition.openmetrics import OpenMetricsScan, check_family
from agent.collect.exposition.syntax import Malformed, MetricFamily, ParsedSample, ScannedSample, parse_series
from agent.collect.exposition.text import TextScan, text_value_timestamp
from agent.errors import ExpositionError

__all__ = [
    "OPENMETRICS_MEDIA_TYPE",
    "MetricFamily",
    "ParsedSample",
    "ScannedSample",
    "Scanner",
    "content_type_is_openmetrics",
    "parse",
]

#: The media type (Content-Type without parameters) of OpenMetrics text.
OPENMETRICS_MEDIA_TYPE = "application/openmetrics-text"

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

# Helpers the tests pin down directly, under the names they had before the formats moved
# into modules of their own.
_Malformed = Malformed
_parse_series = parse_series
_text_value_timestamp = text_value_timestamp


def content_type_is_openmetrics(content_type: str) -> bool:
    """True when a response's Content-Type is OpenMetrics text (any version/charset)."""
    return content_type.split(";", 1)[0].strip().lower() == OPENMETRICS_MEDIA_TYPE


class Scanner:
    """One payload's parse state. Create one per scrape.

    ``wants`` decides which samples :meth:`scan` yields, by sample name (``None``: all);
    it is asked once per run of lines with the same name. ``samples_total`` counts every
    sample line, kept or skipped (Prometheus' ``scrape_samples_scraped``) and is final once
    the scan has finished. ``types``/``helps``/``units`` map family names to their
    metadata as seen so far (types normalised to lower case, ``gauge_histogram`` as
    ``gaugehistogram``).

    The format's own state and rules live in a :class:`~agent.collect.exposition.text.TextScan` or an
    :class:`~agent.collect.exposition.openmetrics.OpenMetricsScan`, chosen here once; the scan loop runs in it.
    """

    def __init__(self, wants: Container[str] | None = None, *, openmetrics: bool = False) -> None:
        # A dict (such as the store's KeepList, which fills itself in __missing__) is asked
        # with a C-level __getitem__ instead of a Python-level __contains__: this runs per name.
        keep: Callable[[str], bool] | None = (
            None if wants is None else wants.__getitem__ if isinstance(wants, dict) else wants.__contains__
        )
        self._om = openmetrics
        self._scanned = False
        self._format: TextScan | OpenMetricsScan
        if openmetrics:
            self._format = scan_om = OpenMetricsScan(keep)
            self.units: dict[str, str] = scan_om.units
        else:
            self._format = TextScan(keep)
            self.units = {}  # the text format has no # UNIT line
        self.types: dict[str, str] = self._format.types
        self.helps: dict[str, str] = self._format.helps

    @property
    def samples_total(self) -> int:
        """Sample lines seen, kept or skipped; final once the scan has finished."""
        return self._format.samples_total

    # -- public ----------------------------------------------------------------------
    def scan(self, text: str) -> Iterator[ScannedSample]:
        """Yield ``(series_text, value, timestamp_ms)`` for every wanted sample.

        Raises :class:`ExpositionError` (with the 1-based line) on malformed input; a
        body that is cut short is reported before anything is yielded.
        """
        if self._scanned:
            raise RuntimeError("a Scanner holds one payload's state: create one per scrape")
        self._scanned = True
        return self._format.scan(text)

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
                    name, pairs = parse_series(series_text, self._om)  # finds what is wrong
                    labels = dict(pairs)
            else:
                name, pairs = parse_series(series_text, self._om)
                labels = dict(pairs)
            self._format.check_type_labels(name, labels)
        except Malformed as exc:
            raise ExpositionError(exc.args[0], self._line_of(series_text)) from None
        return name, labels

    # -- for parse() and the tests ---------------------------------------------------
    def _family_of(self, name: str) -> str:
        """The family a sample name was filed under (or would be, if not seen)."""
        return self._format.family_of(name)

    def _current_line(self) -> int:
        it = self._format.it
        return len(self._format.lines) - length_hint(it) if it is not None else 0

    def _line_of(self, series_text: str) -> int:
        """The line a series text came from: the current one if it is there, else the first
        line starting with it, else 0."""
        lines = self._format.lines
        current = self._current_line()
        if 0 < current <= len(lines) and series_text in lines[current - 1]:
            return current
        for number, line in enumerate(lines, 1):
            if line.lstrip(" \t").startswith(series_text):
                return number
        return 0


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
            check_family(built, lines[built.name])
    return families
