"""Tests for agent.collect.exposition: scanning, skipping, strict validation, line numbers, OpenMetrics mode.

The conformance suites (tests/collect/test_expfmt_conformance.py, tests/collect/test_openmetrics_conformance.py)
check whole inputs from prometheus/common and the OpenMetrics project; these tests pin down
the individual rules, the fast path and the API the scraper relies on.
"""

from __future__ import annotations

import math
import random

import pytest

from agent.collect.exposition import (
    Scanner,
    _Malformed,
    _parse_series,
    _text_value_timestamp,
    content_type_is_openmetrics,
    parse,
)
from agent.errors import ExpositionError
from agent.series import labels_from
from agent.store import KeepList, Store
from tests.conftest import FIXTURES

VLLM = FIXTURES / "vllm"


def scan(text: str, wants: object = None, *, openmetrics: bool = False) -> list[tuple[str, float, int | None]]:
    return list(Scanner(wants, openmetrics=openmetrics).scan(text))  # type: ignore[arg-type]


def error_of(text: str, *, openmetrics: bool = False, full: bool = True) -> ExpositionError:
    """The error a full parse (or a bare scan) raises."""
    with pytest.raises(ExpositionError) as info:
        if full:
            parse(text, openmetrics=openmetrics)
        else:
            scan(text, openmetrics=openmetrics)
    return info.value


def samples(text: str, *, openmetrics: bool = False) -> list[tuple[str, dict[str, str], float, int | None]]:
    return [
        (s.name, s.labels, s.value, s.timestamp_ms) for f in parse(text, openmetrics=openmetrics) for s in f.samples
    ]


# -- scan: what it yields -----------------------------------------------------------------
def test_scan_yields_series_text_as_written_value_and_no_timestamp() -> None:
    """scan() yields the name-and-labels text exactly as written, the value, and None."""
    text = 'vllm:num_requests_running{model_name="x",engine="0"} 3.0\nup 1\n'
    assert scan(text) == [
        ('vllm:num_requests_running{model_name="x",engine="0"}', 3.0, None),
        ("up", 1.0, None),
    ]


def test_scan_keeps_only_wanted_sample_names() -> None:
    """Only samples whose sample name is in `wants` are yielded; the rest are only counted."""
    text = 'a{x="1"} 1\nb{x="1"} 2\na{x="2"} 3\nc 4\n'
    scanner = Scanner({"a", "c"})
    assert list(scanner.scan(text)) == [('a{x="1"}', 1.0, None), ('a{x="2"}', 3.0, None), ("c", 4.0, None)]
    assert scanner.samples_total == 4


def test_scan_asks_a_keep_list_by_sample_name_so_family_suffixes_are_kept() -> None:
    """A KeepList of families keeps a histogram's _bucket, _sum and _count samples."""
    text = '# TYPE h histogram\nh_bucket{le="1"} 1\nh_bucket{le="+Inf"} 2\nh_sum 3\nh_count 2\nother 5\n'
    got = [s[0] for s in Scanner(KeepList(["h"])).scan(text)]
    assert got == ['h_bucket{le="1"}', 'h_bucket{le="+Inf"}', "h_sum", "h_count"]


def test_series_text_with_blank_before_brace_is_kept_verbatim() -> None:
    """`name {..}` is accepted and its series text keeps the blank (a distinct cache key)."""
    assert scan('name {a="b"} 1\n') == [('name {a="b"}', 1.0, None)]
    scanner = Scanner()
    list(scanner.scan('name {a="b"} 1\n'))
    assert scanner.labels_of('name {a="b"}') == scanner.labels_of('name{a="b"}') == ("name", {"a": "b"})


def test_identical_series_text_parses_to_identical_labels() -> None:
    """The same series text always gives the same (name, labels), so it can key a cache."""
    text = 'm{a="1",b="2"} 1\nm{a="1",b="2"} 2\n'
    scanner = Scanner()
    keys = [k for k, _, _ in scanner.scan(text)]
    assert keys[0] == keys[1]
    assert scanner.labels_of(keys[0]) == scanner.labels_of(keys[1]) == ("m", {"a": "1", "b": "2"})


def test_label_values_with_braces_blanks_hashes_and_escaped_quotes_are_cut_correctly() -> None:
    """The label set ends at its real closing brace even when values contain } , # or \\"."""
    text = 'm{a="x} y",b="#{}",c="q\\"}\\\\"} 7 123\n'
    [(key, value, ts)] = scan(text)
    assert (key, value, ts) == ('m{a="x} y",b="#{}",c="q\\"}\\\\"}', 7.0, 123)
    assert Scanner().labels_of(key) == ("m", {"a": "x} y", "b": "#{}", "c": 'q"}\\'})


def test_a_scanner_scans_one_payload_only() -> None:
    """A Scanner holds one payload's family state, so a second scan() is refused."""
    scanner = Scanner()
    list(scanner.scan("a 1\n"))
    with pytest.raises(RuntimeError, match="one per scrape"):
        scanner.scan("a 2\n")


# -- skipping -----------------------------------------------------------------------------
def test_skipped_lines_are_not_parsed_beyond_their_name() -> None:
    """Deliberate: a malformed label set or value on an unwanted line does not fail the scan.

    Skipping costs one prefix compare per line; what Prometheus would reject is still rejected
    on every kept line, and a full parse (or keeping everything) rejects this payload.
    """
    text = 'good{a="1"} 1\nnoise{a=unquoted} 2\nnoise{a="1"} not-a-number\ngood{a="2"} 3\n'
    scanner = Scanner({"good"})
    assert [v for _, v, _ in scanner.scan(text)] == [1.0, 3.0]
    assert scanner.samples_total == 4
    error_of(text)


def test_samples_total_counts_every_sample_line_but_not_comments_or_blanks() -> None:
    """samples_total is Prometheus' scrape_samples_scraped: kept plus skipped sample lines."""
    text = "# HELP a x\n# TYPE a gauge\n\n   \na 1\nb 2\n  c 3\n# trailing comment\n"
    scanner = Scanner(set())
    assert list(scanner.scan(text)) == []
    assert scanner.samples_total == 3


# -- accepted text-format forms -----------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("   lead 1\n", [("lead", {}, 1.0, None)]),
        ('sp{ a = "1" , b="2" , } 2\n', [("sp", {"a": "1", "b": "2"}, 2.0, None)]),
        ('tc{a="1",} 3\n', [("tc", {"a": "1"}, 3.0, None)]),
        ("empty{} 4\n", [("empty", {}, 4.0, None)]),
        ('nospace{a="1"}5\n', [("nospace", {"a": "1"}, 5.0, None)]),
        ("tabs\t6\t7\n", [("tabs", {}, 6.0, 7)]),
        ("many    8     9\n", [("many", {}, 8.0, 9)]),
        ("neg 1 -5\n", [("neg", {}, 1.0, -5)]),
    ],
)
def test_text_format_accepts_go_parser_forms(text: str, expected: list[object]) -> None:
    """Leading blanks, blanks around = and ,, a trailing comma, {}, tabs: all accepted like Go."""
    assert samples(text) == expected


def test_comments_and_metadata_forms_the_go_parser_tolerates() -> None:
    """Plain comments, bare `# HELP`, `# HELP name`, HELP after samples, `#TYPE` are accepted."""
    text = (
        "# some text\n#\n# HELP\n# HELP \n# HELP lonely\n"
        "a 1\n# HELP a late help is fine\n  #    TYPE    b gauge\nb 2\n#TYPE c counter\nc 3\n"
    )
    families = {f.name: f for f in parse(text)}
    assert families["a"].help == "late help is fine"
    assert families["b"].type == "gauge"
    assert families["c"].type == "counter"


def test_families_may_be_non_contiguous_in_the_text_format() -> None:
    """Samples of one family may be split by other families (the text format allows it)."""
    text = '# TYPE a gauge\na{x="1"} 1\nb 2\na{x="2"} 3\n'
    families = {f.name: f for f in parse(text)}
    assert [s.value for s in families["a"].samples] == [1.0, 3.0]


def test_help_text_escapes_and_type_case() -> None:
    """HELP decodes \\\\, \\n and \\"; TYPE is case-insensitive; gauge_histogram is normalised."""
    text = (
        '# HELP a two\\nlines \\\\ and \\"q\\"\n# TYPE a GAUGE\na 1\n# TYPE g gauge_histogram\ng_bucket{le="+Inf"} 1\n'
    )
    scanner = Scanner()
    list(scanner.scan(text))
    assert scanner.helps["a"] == 'two\nlines \\ and "q"'
    assert scanner.types == {"a": "gauge", "g": "gaugehistogram"}


# -- values and timestamps ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("+Inf", math.inf),
        ("-Inf", -math.inf),
        ("inf", math.inf),
        ("Infinity", math.inf),
        ("08", 8.0),
        ("1.7560473e+06", 1756047.3),
        ("-0", -0.0),
        (".5", 0.5),
        ("5.", 5.0),
        ("1E3", 1000.0),
        ("9223372036854775808", 9.223372036854776e18),
    ],
)
def test_values_go_accepts(token: str, expected: float) -> None:
    """Values parse as Go's strconv.ParseFloat does (infinities in any case, leading zeros)."""
    assert scan(f"m {token}\n") == [("m", expected, None)]


@pytest.mark.parametrize("token", ["NaN", "nan", "NAN"])
def test_nan_values(token: str) -> None:
    """NaN in any case is a value (compared as NaN)."""
    [(_, value, _)] = scan(f"m {token}\n")
    assert math.isnan(value)


@pytest.mark.parametrize("token", ["1_000", "+nan", "-NaN", "0x10", "0x1p-3", "1e999", "١٢", "1\r", "", "1,5", "--1"])
def test_values_go_rejects_even_where_python_float_accepts(token: str) -> None:
    """Underscores, signed NaN, hex, overflow, non-ASCII digits and CR are errors, as in Go."""
    assert "expected float as value" in str(error_of(f"m {token}\n", full=False))


@pytest.mark.parametrize("rest", ["1 2.5", "1 1e3", "1 ts", "1 9223372036854775808", "1 2 3", "1 ", "1 2 "])
def test_timestamps_are_int64_milliseconds_with_nothing_after(rest: str) -> None:
    """Float, non-numeric or out-of-range timestamps, extra tokens and trailing blanks are errors."""
    err = error_of(f"m {rest}\n", full=False)
    assert "timestamp" in str(err)
    assert err.line == 1


def test_fast_and_careful_value_paths_agree() -> None:
    """The fast path for " <number>" decides exactly as the careful Go-faithful reader does."""
    rnd = random.Random(42)
    alphabet = "0123456789.e+-_ EInfNa\t\rx"
    for _ in range(5000):
        rest = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 7)))
        try:
            expected: object = _text_value_timestamp(rest)
        except _Malformed:
            expected = ExpositionError
        try:
            [(_, value, ts)] = scan(f'm{{a="b"}}{rest}\n')
            got: object = (value, ts)
        except ExpositionError:
            got = ExpositionError
        if isinstance(got, tuple) and isinstance(expected, tuple) and math.isnan(got[0]):
            assert math.isnan(expected[0]) and got[1] == expected[1], rest
        else:
            assert got == expected, repr(rest)


# -- errors and their line numbers --------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("a 1\n# HELP b one\n# HELP b two\n", 3, "second HELP"),
        ("# TYPE b counter\n# TYPE b gauge\n", 2, "second TYPE"),
        ("b 1\n# TYPE b counter\n", 2, "TYPE reported after samples"),
        ("\n# TYPE b bla\n", 2, "unknown metric type"),
        ("# TYPE b gauge \n", 1, "unknown metric type"),
        ("# TYPE met-ric gauge\n", 1, "invalid metric name"),
        ("a 1\nm{label=bla} 1\n", 2, "not quoted"),
        ('m{label="bla} 1\n', 1, "not terminated"),
        ('m{label="bla" 1\n', 1, "not closed"),
        ('m{__name__="x"} 1\n', 1, "reserved"),
        ('m{a="1",a="2"} 1\n', 1, "duplicate label name"),
        ('m{a="\\t"} 1\n', 1, "invalid escape sequence"),
        ('m{1a="x"} 1\n', 1, "invalid label name"),
        ('m{a="x"b="y"} 1\n', 1, "expected ','"),
        ('m{a="x"}{b="y"} 1\n', 1, "unexpected text after the label set"),
        ('{a="x"} 1\n', 1, "without a metric name"),
        ("@m 1\n", 1, "invalid metric name"),
        ('"m" 1\n', 1, "quoted (UTF-8) metric names are not supported"),
        ("m-x 1\n", 1, "expected float"),
        ("m\n", 1, "expected float"),
        ("a 1\nb 2\nm blubb\n", 3, "expected float"),
        ("m 1 2 3\n", 1, "spurious string after timestamp"),
        ("m 1 2.72\n", 1, "expected integer as timestamp"),
        ("# HELP m bad \\t escape\n", 1, "invalid escape sequence"),
        ('# TYPE h histogram\nh_bucket{le="1"} -1\n', 2, "negative histogram bucket"),
        ('# TYPE h histogram\nh_bucket{le="bla"} 1\n', 2, "'le' label"),
        ('# TYPE s summary\ns{quantile="x"} 1\n', 2, "'quantile' label"),
    ],
)
def test_malformed_input_errors_name_the_line(text: str, line: int, words: str) -> None:
    """Each Go parser error is raised as ExpositionError with the 1-based line number."""
    err = error_of(text)
    assert err.line == line
    assert words in err.message


def test_missing_final_newline_is_reported_as_truncation_before_anything_is_yielded() -> None:
    """A body not ending in a newline is an error (a truncated body looks like this), up front."""
    gen = Scanner().scan('a 1\nb{x="1"} 2\nc{x="trunc')
    with pytest.raises(ExpositionError) as info:
        next(gen)
    assert info.value.line == 3
    assert "truncated" in info.value.message


def test_empty_payload_and_trailing_blanks_after_the_last_newline_are_fine() -> None:
    """An empty body has no samples; blanks after the final newline are accepted, as in Go."""
    assert scan("") == []
    assert scan("a 1\n  \t") == [("a", 1.0, None)]


def test_crlf_line_endings_are_rejected_like_the_go_parser() -> None:
    """A CR before the newline makes the value (or type) invalid, as in Go."""
    error_of("a 1\r\n")
    error_of("# TYPE a gauge\r\na 1\n")


# -- labels_of -----------------------------------------------------------------------------
def test_labels_of_decodes_escapes_and_utf8_values() -> None:
    """labels_of decodes \\\\, \\" and \\n and keeps UTF-8 label values as text."""
    key = 'm{path="C:\\\\x",quote="say \\"hi\\"",nl="a\\nb",model="Qwen/通义千问-7B ☃"}'
    assert Scanner().labels_of(key) == (
        "m",
        {"path": "C:\\x", "quote": 'say "hi"', "nl": "a\nb", "model": "Qwen/通义千问-7B ☃"},
    )


def test_labels_of_rejects_lone_surrogates() -> None:
    """A label value that is not valid UTF-8 (a lone surrogate from a lax decoder) is rejected."""
    with pytest.raises(ExpositionError, match="UTF-8"):
        Scanner().labels_of('m{a="\udcff"}')


@pytest.mark.parametrize(
    "key",
    [
        "m{a=1}",
        'm{a="1"',
        'm{a="1",,b="2"}',
        "m{,}",
        'm{a="\\x"}',
        'm{__name__="m"}',
        'm{a="1",a="1"}',
        "1m",
        "m x",
    ],
)
def test_labels_of_rejects_malformed_series_text(key: str) -> None:
    """labels_of validates the whole series text, not just the fast-path shape."""
    with pytest.raises(ExpositionError):
        Scanner().labels_of(key)


def test_labels_of_checks_le_and_quantile_by_family_type() -> None:
    """`le` must be a float on histogram samples, `quantile` on summary samples; elsewhere free."""
    text = "# TYPE h histogram\n# TYPE s summary\nh_sum 1\n"
    scanner = Scanner()
    list(scanner.scan(text))
    assert scanner.labels_of('h_bucket{le="+Inf"}')[1] == {"le": "+Inf"}
    assert scanner.labels_of('s{quantile="0.99"}')[1] == {"quantile": "0.99"}
    assert scanner.labels_of('other{le="any",quantile="thing"}')[1] == {"le": "any", "quantile": "thing"}
    for bad in ('h_bucket{le="x"}', 'h_count{le="1_0"}', 's{quantile="high"}', 's_sum{quantile="nan?"}'):
        with pytest.raises(ExpositionError):
            scanner.labels_of(bad)


def test_labels_of_called_during_a_scan_reports_that_sample_line() -> None:
    """The scraper calls labels_of on a cache miss mid-scan; the error carries that line."""
    text = 'ok{a="1"} 1\n# c\nbad{a="1",a="2"} 2\n'
    scanner = Scanner()
    with pytest.raises(ExpositionError) as info:
        for key, _, _ in scanner.scan(text):
            scanner.labels_of(key)
    assert info.value.line == 3


def test_labels_fast_path_agrees_with_the_careful_parser() -> None:
    """The one-regex split of plain series texts gives what the careful parser gives."""

    def careful(key: str, om: bool) -> object:
        try:
            name, pairs = _parse_series(key, om)
        except _Malformed:
            return "error"
        return name, dict(pairs)

    def fast(scanner: Scanner, key: str) -> object:
        try:
            return scanner.labels_of(key)
        except ExpositionError:
            return "error"

    rnd = random.Random(7)
    parts = ['a="1"', 'b=""', 'a="x"', '__name__="n"', 'c="}{,="', 'd="\\n"', "e=1", ",", " ", 'f="#"']
    for om in (False, True):
        scanner = Scanner(openmetrics=om)
        for _ in range(2000):
            body = "".join(rnd.choice(parts) for _ in range(rnd.randint(0, 4)))
            key = f"m{{{body}}}" if rnd.random() < 0.9 else "m"
            assert fast(scanner, key) == careful(key, om), (om, key)


# -- families (parse) -----------------------------------------------------------------------
def test_histogram_with_sum_before_buckets_forms_one_family() -> None:
    """A real vLLM capture lists _sum before the buckets; all land in the histogram family."""
    text = (VLLM / "v0_0.7_aibrix_qwen15b_metrics.txt").read_text()
    families = {f.name: f for f in parse(text)}
    hist = families["vllm:iteration_tokens_total"]
    assert hist.type == "histogram"
    assert hist.samples[0].name == "vllm:iteration_tokens_total_sum"
    assert {s.name for s in hist.samples} == {
        "vllm:iteration_tokens_total_sum",
        "vllm:iteration_tokens_total_bucket",
    }


def test_suffix_samples_join_a_family_only_once_it_is_typed() -> None:
    """As in Go, `x_sum` before `# TYPE x summary` is its own untyped family; after it, part of x."""
    text = "x_sum 1\n# TYPE x summary\nx_count 2\nx_sum 3\n"
    families = {f.name: [s.name for s in f.samples] for f in parse(text)}
    assert families == {"x_sum": ["x_sum", "x_sum"], "x": ["x_count"]}
    # A HELP line creates its family too: h_bucket stays its own (untyped, so no sign rule).
    text = '# HELP h_bucket own family\n# HELP h hist\n# TYPE h histogram\nh_bucket{le="1"} -1\nh_count -1\n'
    with pytest.raises(ExpositionError) as info:
        parse(text)
    assert info.value.line == 5


def _go_reference(lines: list[str]) -> tuple[int, dict[str, list[str]], dict[str, str], dict[str, str]]:
    """A direct model of the Go parser's family bookkeeping (setOrCreateCurrentMF, the HELP and
    TYPE checks) for simple well-formed lines: (error line or 0, samples by family, types, helps)."""
    kinds: dict[str, str | None] = {}  # family -> type; "implicit" once a sample came first
    helps: dict[str, str] = {}
    members: dict[str, list[str]] = {}

    def resolve(name: str) -> str:
        if name in kinds:
            return name
        for suffix in ("_count", "_sum"):
            if name.endswith(suffix) and len(name) > len(suffix) and kinds.get(name[: -len(suffix)]) == "summary":
                return name[: -len(suffix)]
        for suffix in ("_count", "_sum", "_bucket"):
            base = name[: -len(suffix)]
            if name.endswith(suffix) and len(name) > len(suffix) and kinds.get(base) in ("histogram", "gaugehistogram"):
                return base
        kinds[name] = None
        return name

    for number, line in enumerate(lines, 1):
        if line.startswith("# HELP "):
            name, _, text = line[7:].partition(" ")
            family = resolve(name)
            if family in helps:
                return number, members, {}, {}
            helps[family] = text
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            family = resolve(name)
            if kinds[family] is not None:
                return number, members, {}, {}
            kinds[family] = kind
        else:
            name = line.split("{")[0].split(" ")[0]
            family = resolve(name)
            if kinds[family] is None:
                kinds[family] = "implicit"
            members.setdefault(family, []).append(name)
            # Histogram buckets (with an le label) and counts are unsigned in Go.
            counted = name == family + "_count" or (name == family + "_bucket" and "le=" in line)
            if kinds[family] in ("histogram", "gaugehistogram") and counted and line.endswith(" -1"):
                return number, members, {}, {}
    types = {f: k for f, k in kinds.items() if k is not None and k != "implicit"}
    return 0, members, types, helps


def test_family_bookkeeping_matches_a_model_of_the_go_parser() -> None:
    """On random payloads of HELP/TYPE lines and _sum/_count/_bucket samples, the families,
    types, helps and the first error line (duplicate metadata, TYPE after samples, negative
    histogram counts) are exactly what the Go parser's rules give."""
    rnd = random.Random(3)
    names = ["x", "x_sum", "x_count", "x_bucket", "x_sum_count", "y"]
    kinds = ["histogram", "summary", "gauge", "untyped"]
    for _ in range(6000):
        lines = []
        for _ in range(rnd.randint(1, 8)):
            name = rnd.choice(names)
            roll = rnd.random()
            if roll < 0.25:
                lines.append(f"# HELP {name} help for {name}")
            elif roll < 0.5:
                lines.append(f"# TYPE {name} {rnd.choice(kinds)}")
            elif roll < 0.75:
                lines.append(f"{name} 1")
            else:
                lines.append(f'{name}{{le="1",quantile="0.5"}} {rnd.choice(["2", "-1"])}')
        error_line, members, types, helps = _go_reference(lines)
        text = "\n".join(lines) + "\n"
        if error_line:
            assert error_of(text).line == error_line, text
            continue
        scanner = Scanner()
        got: dict[str, list[str]] = {}
        for key, _, _ in scanner.scan(text):
            name, _ = scanner.labels_of(key)
            got.setdefault(scanner._family_of(name), []).append(name)
        assert got == members, text
        assert scanner.types == types, text
        assert scanner.helps == helps, text


def test_vllm_capture_scans_into_a_store_through_a_series_cache() -> None:
    """The scraper's path (scan, labels_of on a miss, store) works on a real vLLM capture."""
    text = (VLLM / "v1_0.8_prodstack_qwen32b_metrics.txt").read_text()
    store = Store(3_600_000, KeepList(["vllm:num_requests_running", "vllm:time_per_output_token_seconds"]))
    cache: dict[str, object] = {}
    for scrape in range(3):
        scanner = Scanner(store.keep)
        for key, value, ts in scanner.scan(text):
            series = cache.get(key)
            if series is None:
                name, labels = scanner.labels_of(key)
                series = cache[key] = store.series(labels_from(name, labels))
            series.append(1_000 * (scrape + 1) if ts is None else ts, value)  # type: ignore[attr-defined]
        assert scanner.samples_total == 32
    assert store.names() == ["vllm:num_requests_running", "vllm:time_per_output_token_seconds_bucket"]
    assert store.stats()["samples"] == 3 * len(cache)


def test_huge_payload_of_100k_series_parses() -> None:
    """A 100,000-series payload scans and fully parses."""
    lines = ["# HELP big A big gauge.", "# TYPE big gauge"]
    lines += [f'big{{pod="p{i}",model_name="m{i % 10}",engine="{i % 4}"}} {i}.5' for i in range(100_000)]
    text = "\n".join(lines) + "\n"
    scanner = Scanner(KeepList(["big"]))
    assert sum(1 for _ in scanner.scan(text)) == 100_000
    assert scanner.samples_total == 100_000
    [family] = parse(text)
    assert len(family.samples) == 100_000
    assert family.samples[-1].labels == {"pod": "p99999", "model_name": "m9", "engine": "3"}


# -- OpenMetrics mode ------------------------------------------------------------------------
def test_openmetrics_timestamps_are_seconds_converted_to_milliseconds() -> None:
    """OpenMetrics timestamps are float seconds; scan yields integer milliseconds."""
    text = "# TYPE a gauge\na 1 1.5\na 2 1700000000.123\n# EOF\n"
    assert scan(text, openmetrics=True) == [("a", 1.0, 1500), ("a", 2.0, 1_700_000_000_123)]


def test_openmetrics_exemplars_are_validated_and_not_part_of_the_series_text() -> None:
    """An exemplar after ' # ' is checked but not part of the key; a bad one is an error."""
    text = '# TYPE c counter\nc_total{a="x # y"} 3 # {trace_id="abc"} 1 1.5\n# EOF\n'
    assert scan(text, openmetrics=True) == [('c_total{a="x # y"}', 3.0, None)]
    err = error_of(text.replace("1 1.5", "1 NaN"), openmetrics=True)
    assert err.line == 2


def test_openmetrics_requires_eof_last() -> None:
    """A missing # EOF (a truncated body) and text after # EOF are errors."""
    assert "missing '# EOF'" in error_of("a 1\n", openmetrics=True, full=False).message
    assert error_of("a 1\n# EOF\nb 2\n", openmetrics=True, full=False).line == 3
    assert scan("# EOF", openmetrics=True) == []


def test_openmetrics_is_strict_where_the_text_format_is_lenient() -> None:
    """Blank lines, leading blanks, free comments and trailing commas fail in OpenMetrics only."""
    for body in ["a 1\n\n", " a 1\n", "# just a comment\n", 'a{x="1",} 1\n', "a  1\n"]:
        parse(body)
        error_of(body + "# EOF\n", openmetrics=True)


def test_openmetrics_samples_total_and_units() -> None:
    """samples_total counts OpenMetrics samples; # UNIT lands in units and the family."""
    text = "# TYPE a_seconds gauge\n# UNIT a_seconds seconds\na_seconds 1\nb 2\n# EOF\n"
    scanner = Scanner({"b"}, openmetrics=True)
    assert list(scanner.scan(text)) == [("b", 2.0, None)]
    assert scanner.samples_total == 2
    assert scanner.units == {"a_seconds": "seconds"}
    assert parse(text, openmetrics=True)[0].unit == "seconds"


# -- content type ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("ctype", "expected"),
    [
        ("application/openmetrics-text; version=1.0.0; charset=utf-8", True),
        ("Application/OpenMetrics-Text", True),
        ("text/plain; version=0.0.4; charset=utf-8", False),
        ("", False),
    ],
)
def test_content_type_is_openmetrics(ctype: str, expected: bool) -> None:
    """Only application/openmetrics-text (any parameters, any case) selects OpenMetrics."""
    assert content_type_is_openmetrics(ctype) is expected
