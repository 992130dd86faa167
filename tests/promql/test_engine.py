"""Behaviour of the PromQL engine beyond Prometheus' own conformance files: the cases
our vLLM rules depend on, the errors a rule author sees, the parse-time subset check.

Expected values marked "promtool" were computed by Prometheus 2.42's ``promtool test
rules`` on the same input.
"""

from __future__ import annotations

import ast
import math

import pytest

from agent.errors import PromQLError, UnsupportedError
from agent.promql import Engine, MatrixSeries, Sample, Scalar, String, metric_names, parse
from agent.promql.notation import parse_series_line
from agent.series import STALE_NAN, labels_from
from agent.store import Store
from tests.conftest import REPO

S = 1000
M = 60 * S


def make_store(interval_ms: int, *lines: str) -> Store:
    """A store loaded from series-notation lines, sample n at ``n * interval_ms``."""
    store = Store(10**12)
    for line in lines:
        labels, values = parse_series_line(line)
        for n, v in enumerate(values):
            if v is not None:
                store.append(labels, n * interval_ms, v)
    return store


def values(result: object) -> dict[tuple[tuple[str, str], ...], float]:
    assert isinstance(result, list)
    return {s.labels: s.value for s in result}


def only(result: object) -> Sample:
    """The single sample of an instant-vector result."""
    assert isinstance(result, list) and len(result) == 1, result
    sample = result[0]
    assert isinstance(sample, Sample)
    return sample


def one(result: object) -> float:
    got = values(result)
    assert len(got) == 1, got
    return next(iter(got.values()))


def test_stale_marker_ends_a_series_at_once() -> None:
    """After a staleness marker an instant selector returns nothing, without waiting
    out the 5-minute lookback; a later sample brings the series back."""
    store = make_store(15 * S, "up{instance='a'} 1 1 stale _ 1")
    engine = Engine(store)
    assert one(engine.instant("up", 15 * S)) == 1
    assert engine.instant("up", 30 * S) == []
    assert engine.instant("up", 44 * S) == []
    assert one(engine.instant("up", 60 * S)) == 1


def test_range_selector_skips_stale_markers() -> None:
    """A range selector drops the marker itself but keeps the samples around it."""
    engine = Engine(make_store(15 * S, "x 1 2 stale 4"))
    assert one(engine.instant("count_over_time(x[1m])", 45 * S)) == 3
    assert one(engine.instant("last_over_time(x[20s])", 30 * S)) == 2


def test_lookback_window_is_inclusive_and_configurable() -> None:
    """A sample exactly ``lookback`` old is still returned, one ms older is not; the
    window follows ``lookback_ms``."""
    store = make_store(15 * S, "g 7")
    assert one(Engine(store).instant("g", 300 * S)) == 7
    assert Engine(store).instant("g", 300 * S + 1) == []
    short = Engine(store, lookback_ms=60 * S)
    assert one(short.instant("g", 60 * S)) == 7
    assert short.instant("g", 61 * S) == []


def test_counter_reset_in_rate_and_increase() -> None:
    """A counter that drops (a vLLM restart) counts as a reset, not as a negative rate
    (promtool: rate 1.9333, increase 580)."""
    store = make_store(
        15 * S,
        "vllm:request_success_total{instance='a'} 0 30 60 90 10 40 70 100 130 160 190 220 250 280 310 340 370 400 430"
        " 460 490",
    )
    engine = Engine(store)
    assert one(engine.instant("rate(vllm:request_success_total[5m])", 5 * M)) == pytest.approx(1.9333333333333333)
    assert one(engine.instant("increase(vllm:request_success_total[5m])", 5 * M)) == pytest.approx(580)
    assert one(engine.instant("rate(vllm:request_success_total[2m])", 2 * M)) == pytest.approx(1.8333333333333333)
    assert one(engine.instant("resets(vllm:request_success_total[5m])", 5 * M)) == 1


def test_rate_needs_two_samples_and_drops_the_name() -> None:
    """``rate`` of a single sample is no result; results lose ``__name__``."""
    engine = Engine(make_store(15 * S, "c{job='v'} 5 10"))
    assert engine.instant("rate(c[10s])", 15 * S) == []
    # extrapolated to the zero point 15 s before the first sample: 10 per minute
    assert values(engine.instant("rate(c[1m])", 15 * S)) == {(("job", "v"),): pytest.approx(10 / 60)}


VLLM_BUCKETS = (
    "vllm:e2e_request_latency_seconds_bucket{model_name='qwen',le='0.3'} 0+1x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='qwen',le='0.5'} 0+3x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='qwen',le='1.0'} 0+6x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='qwen',le='2.5'} 0+9x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='qwen',le='5.0'} 0+10x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='qwen',le='+Inf'} 0+10x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='slow',le='0.3'} 0x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='slow',le='5.0'} 0x40",
    "vllm:e2e_request_latency_seconds_bucket{model_name='slow',le='+Inf'} 0+2x40",
)


def test_histogram_quantile_on_vllm_buckets() -> None:
    """Quantiles interpolate inside the bucket holding the rank; observations only in
    ``le="+Inf"`` give the highest finite bound (promtool: 0.8333, 4.75, 5)."""
    engine = Engine(make_store(15 * S, *VLLM_BUCKETS))
    p50 = values(engine.instant("histogram_quantile(0.5, rate(vllm:e2e_request_latency_seconds_bucket[5m]))", 10 * M))
    assert p50 == {
        (("model_name", "qwen"),): pytest.approx(0.8333333333333334),
        (("model_name", "slow"),): 5.0,
    }
    p99 = engine.instant(
        "histogram_quantile(0.99, sum by (le, model_name) (rate(vllm:e2e_request_latency_seconds_bucket[5m])))", 10 * M
    )
    assert values(p99)[(("model_name", "qwen"),)] == pytest.approx(4.75)


def test_histogram_quantile_edge_cases() -> None:
    """No ``+Inf`` bucket or no observations gives NaN; q outside [0, 1] gives ±Inf."""
    engine = Engine(make_store(15 * S, "h_bucket{le='1'} 5", "z_bucket{le='1'} 0", "z_bucket{le='+Inf'} 0"))
    assert math.isnan(one(engine.instant("histogram_quantile(0.5, h_bucket)", 0)))
    assert math.isnan(one(engine.instant("histogram_quantile(0.5, z_bucket)", 0)))
    assert one(engine.instant("histogram_quantile(2, z_bucket)", 0)) == math.inf
    assert one(engine.instant("histogram_quantile(-1, z_bucket)", 0)) == -math.inf


def test_on_group_left_carries_labels_from_the_one_side() -> None:
    """``group_left(model_name)`` copies the info metric's label onto every per-GPU
    series; the ``on`` labels pick the match."""
    engine = Engine(
        make_store(
            15 * S,
            "gpu_mem_used{instance='n1',gpu='0'} 70",
            "gpu_mem_used{instance='n1',gpu='1'} 80",
            "gpu_mem_used{instance='n2',gpu='0'} 10",
            "model_info{instance='n1',model_name='llama'} 1",
            "model_info{instance='n2',model_name='qwen'} 1",
        )
    )
    got = values(engine.instant("gpu_mem_used * on(instance) group_left(model_name) model_info", 0))
    assert got == {
        labels_from(None, {"instance": "n1", "gpu": "0", "model_name": "llama"}): 70,
        labels_from(None, {"instance": "n1", "gpu": "1", "model_name": "llama"}): 80,
        labels_from(None, {"instance": "n2", "gpu": "0", "model_name": "qwen"}): 10,
    }
    kept = values(engine.instant("gpu_mem_used > on(instance) group_left(model_name) (model_info * 50)", 0))
    assert set(kept) == {
        labels_from("gpu_mem_used", {"instance": "n1", "gpu": "0", "model_name": "llama"}),
        labels_from("gpu_mem_used", {"instance": "n1", "gpu": "1", "model_name": "llama"}),
    }


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("b * on() group_left a", "many-to-many matching not allowed"),
        ("b * on() group_left a", "found duplicate series for the match group {}"),
        ("a + on() b", "many-to-one matching must be explicit (group_left/group_right)"),
        ("{__name__=~'a|b'} * on() group_left c", "grouping labels must ensure unique matches"),
        ("-{__name__=~'a|b'}", "vector cannot contain metrics with the same labelset"),
        ("label_replace(a, 'i', '', 'i', '.*')", "vector cannot contain metrics with the same labelset"),
        ("label_replace(a, 'x-y', '', 'i', '.*')", "invalid destination label name in label_replace(): x-y"),
        ("label_replace(a, 'x', '', 'i', '(.*')", "invalid regular expression in label_replace(): (.*"),
        ("topk(1e300, a)", "Scalar value 1e+300 overflows int64"),
        ("count_values('1x', a)", 'invalid label name "1x"'),
    ],
)
def test_evaluation_errors_use_prometheus_messages(expr: str, message: str) -> None:
    """Evaluation errors raise PromQLError with Prometheus' wording."""
    engine = Engine(make_store(15 * S, "a{i='1'} 1", "a{i='2'} 2", "b{i='1'} 3", "c{j='x'} 4"))
    with pytest.raises(PromQLError) as info:
        engine.instant(expr, 0)
    assert message in str(info.value)


def test_syntax_error_carries_the_parsers_message() -> None:
    """A syntax or type error is a PromQLError (not UnsupportedError) quoting the parser."""
    for text, fragment in [("rate(x)", "expected type matrix"), ("sum(", "syntax error"), ("1 > 2", "BOOL")]:
        with pytest.raises(PromQLError) as info:
            parse(text)
        assert not isinstance(info.value, UnsupportedError)
        assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "construct"),
    [
        ("holt_winters(x[5m], 0.5, 0.5)", "function holt_winters"),
        ("histogram_count(x)", "function histogram_count"),
        ("sort_by_label(x, 'a')", "function sort_by_label"),
        ("limitk(2, x)", "aggregation limitk"),
        ('x{a="1" or b="2"}', "'or' between label matchers"),
        ("sum(rate(x[5m])) / histogram_sum(y)", "function histogram_sum"),
        ("x @ -5", "@ modifier with a negative timestamp"),
        ("rate(x[5m]) * 1h", "duration used as a number"),
        ("x offset 5", "duration without a time unit"),
        ("x[5m:1]", "duration without a time unit"),
        ('{"my.label"="v"}', "quoted label name"),
        ("vector(step())", "function step"),
    ],
)
def test_unsupported_error_names_the_construct(text: str, construct: str) -> None:
    """Valid PromQL outside the subset is rejected at parse time, naming the construct."""
    with pytest.raises(UnsupportedError) as info:
        parse(text)
    assert info.value.construct == construct
    assert construct in str(info.value)


def test_newer_syntax_check_ignores_strings_and_keywords() -> None:
    """Durations, ``@`` and braces inside strings, OFFSET in any case, colons in names
    and subquery steps are 2.42 syntax and parse fine."""
    for text in ['x{a="5m", b="@ -1"} OFFSET 5m', "vllm:num_requests_waiting:avg5m[10m:30s] @ 100", "x offset -1h30m"]:
        parse(text)


def test_metric_names_lists_fixed_names_and_flags_open_selectors() -> None:
    """Every fixed metric name is listed; a selector without one sets the flag."""
    names, open_ = metric_names(parse("sum(rate(a_total[5m])) / on(x) group_left b + c offset 5m"))
    assert names == {"a_total", "b", "c"} and not open_
    names, open_ = metric_names(parse('absent({__name__="d"}) or max_over_time(e[10m:1m]) or {job="x"}'))
    assert names == {"d", "e"} and open_
    assert metric_names(parse('{__name__=~"vllm:.*"}')) == (frozenset(), True)
    assert metric_names(parse("time() + 1")) == (frozenset(), False)


def test_result_types() -> None:
    """instant() returns Scalar, String, Vector (list of Sample) or Matrix by expression type."""
    engine = Engine(make_store(15 * S, "x{a='1'} 1 2 3"))
    assert engine.instant("1 + 2 * 3", 0) == Scalar(7.0)
    assert engine.instant('"hi"', 0) == String("hi")
    assert engine.instant("x", 30 * S) == [Sample(labels_from("x", {"a": "1"}), 3.0)]
    assert engine.instant("x[30s]", 30 * S) == [
        MatrixSeries(labels_from("x", {"a": "1"}), [0, 15 * S, 30 * S], [1, 2, 3])
    ]
    assert parse("x[5m]").type == "matrix" and parse("sum(x)").type == "vector"


def test_range_query_steps_and_rejects_range_vectors() -> None:
    """range() evaluates at each step; a range-vector expression is an error."""
    engine = Engine(make_store(15 * S, "x 1 2 3 4 5"))
    (series,) = engine.range("x * 2", 0, 60 * S, 30 * S)
    assert series.labels == () and series.ts == [0, 30 * S, 60 * S] and series.values == [2, 6, 10]
    (scalar,) = engine.range("time()", 0, 20 * S, 10 * S)
    assert scalar.values == [0, 10, 20]
    with pytest.raises(PromQLError, match="for range query"):
        engine.range("x[1m]", 0, 60 * S, 30 * S)


def test_subquery_default_step_is_configurable() -> None:
    """``[r:]`` uses the engine's subquery step (Prometheus: the evaluation interval)."""
    store = make_store(15 * S, "x 0+1x40")
    assert one(Engine(store).instant("count_over_time(x[5m:])", 10 * M)) == 6  # 1 m steps, both ends
    assert one(Engine(store, subquery_step_ms=30 * S).instant("count_over_time(x[5m:])", 10 * M)) == 11


def test_offset_and_at_modifiers() -> None:
    """``offset`` shifts back (negative: forward), ``@`` pins the time, start()/end()
    are the query's bounds."""
    engine = Engine(make_store(M, "x 0+1x10"))
    assert one(engine.instant("x offset 2m", 5 * M)) == 3
    assert one(engine.instant("x offset -2m", 5 * M)) == 7
    assert one(engine.instant("x @ 120", 9 * M)) == 2
    (series,) = engine.range("x @ end()", 0, 2 * M, M)
    assert series.values == [2, 2, 2]


def test_regex_matchers_follow_go_syntax() -> None:
    """Go's mid-pattern ``(?i)`` flag, POSIX classes, and ``.`` not matching a newline
    (Prometheus 2.42) behave as in Prometheus."""
    engine = Engine(make_store(M, "m{n='Prod-EU'} 1", "m{n='dev'} 2", 'm{n="a\\nb"} 3'))
    assert sorted(values(engine.instant("m{n=~'p(?i)rod.*|DEV'}", 0)).values()) == [2]
    assert sorted(values(engine.instant("m{n=~'[[:upper:]].*'}", 0)).values()) == [1]
    assert engine.instant("m{n=~'a.b'}", 0) == []
    assert sorted(values(engine.instant("m{n=~'a\\\\nb'}", 0)).values()) == [3]


def test_label_replace_expands_like_go() -> None:
    """``$1x`` names group "1x" (empty), ``${1}x`` is group 1 then x, ``$$`` a dollar."""
    engine = Engine(make_store(M, "m{src='abc-12'} 1"))

    def dst(repl: str) -> str:
        sample = only(engine.instant(f"label_replace(m, 'dst', '{repl}', 'src', '([a-z]+)-(?P<num>\\\\d+)')", 0))
        return dict(sample.labels).get("dst", "")

    assert dst("$1x") == ""
    assert dst("${1}x-$2") == "abcx-12"
    assert dst("$$1 $num") == "$1 12"


def test_count_values_formats_like_go() -> None:
    """count_values writes values as Go's FormatFloat(v, 'f', -1): no exponent."""
    engine = Engine(make_store(M))
    for expr, label in [("vector(1e21)", "1000000000000000000000"), ("vector(0.1)", "0.1"), ("vector(-0.0)", "-0")]:
        assert only(engine.instant(f'count_values("v", {expr})', 0)).labels == (("v", label),)


def test_float_edge_cases_follow_go() -> None:
    """Division by zero, modulo, powers and logs give Go's special values, never a
    Python exception."""
    engine = Engine(make_store(M))
    cases = {
        "1 / 0": math.inf,
        "-1 / 0": -math.inf,
        "5 % -3": 2.0,
        "5 % 0": math.nan,
        "0 ^ -1": math.inf,
        "(-8) ^ (1/3)": math.nan,
        "10 ^ 400": math.inf,
        "scalar(ln(vector(0)))": -math.inf,
        "scalar(exp(vector(1000)))": math.inf,
        "scalar(sqrt(vector(-1)))": math.nan,
    }
    for expr, want in cases.items():
        got = engine.instant(expr, 0)
        assert isinstance(got, Scalar), expr
        assert (math.isnan(got.value) and math.isnan(want)) or got.value == want, expr


def test_date_functions_cover_gos_range() -> None:
    """Dates beyond datetime's year 9999 work; NaN gives what Prometheus on amd64 gives."""
    engine = Engine(make_store(M))
    assert one(engine.instant("year(vector(1e15))", 0)) == 31690708  # promtool
    assert one(engine.instant("hour(vector(-1e15))", 0)) == 22  # promtool
    assert one(engine.instant("year(vector(NaN))", 0)) == 292277026596  # promtool
    assert one(engine.instant("day_of_week()", 0)) == 4  # 1970-01-01 was a Thursday


def test_selectors_read_the_store_once_per_evaluation() -> None:
    """Each distinct selector queries the store once per evaluation, even when it
    appears twice or inside a subquery evaluated at many steps."""
    store = make_store(15 * S, "x{a='1'} 0+1x100")
    calls = 0
    real = store.iter_series

    def counting(matchers):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return real(matchers)

    store.iter_series = counting  # type: ignore[method-assign,assignment]
    Engine(store).instant("x / x + max_over_time(rate(x[1m])[10m:15s])", 20 * M)
    assert calls == 1


def test_string_expressions_are_parsed_once() -> None:
    """Engine.instant accepts text and caches the parsed expression."""
    engine = Engine(make_store(M, "x 1"))
    assert engine.instant("x + 1", 0) == [Sample((), 2.0)]
    assert engine._expr("x + 1") is engine._expr("x + 1")


def test_appended_stale_marker_from_the_store() -> None:
    """A marker written by Series.mark_stale (a target that vanished) hides the series."""
    store = Store(10**12)
    labels = labels_from("up", {"instance": "a"})
    store.append(labels, 0, 1.0)
    store.series(labels).mark_stale(10 * S)
    engine = Engine(store)
    assert one(engine.instant("up", 5 * S)) == 1
    assert engine.instant("up", 10 * S) == []
    assert math.isnan(STALE_NAN)


#: Queries that memoise label work: grouping, matching, histogram buckets, label_replace.
MEMO_QUERIES = (
    "sum by (job) (x)",
    "max without (i) (x)",
    "x / on(i) y",
    "x * ignoring(job) group_left y",
    "x and on(i) y",
    "histogram_quantile(0.9, sum by (le, job) (h_bucket))",
    "histogram_quantile(0.5, h_bucket)",
    "label_replace(x, 'k', '$1', 'i', '(.)')",
)


def _memo_store(n: int) -> Store:
    """``n`` series each of x and y, and ``n`` histograms of three buckets, at t=0."""
    store = Store(10**12)
    for i in range(n):
        store.append(labels_from("x", {"i": str(i), "job": f"j{i % 4}"}), 0, float(i))
        store.append(labels_from("y", {"i": str(i)}), 0, 2.0)
        for le, count in (("0.5", 1.0), ("1", 3.0), ("+Inf", 4.0 + i)):
            store.append(labels_from("h_bucket", {"i": str(i), "job": f"j{i % 4}", "le": le}), 0, count)
    return store


def _sorted(result: object) -> list[tuple[tuple[tuple[str, str], ...], float]]:
    assert isinstance(result, list)
    return sorted((s.labels, s.value) for s in result)


def test_engines_do_not_share_memo_entries() -> None:
    """Each engine memoises in its own tables: one engine's evaluation leaves another's empty."""
    store = _memo_store(20)
    first, second = Engine(store), Engine(store)
    for q in MEMO_QUERIES:
        first.instant(q, 0)
    assert len(first.memos) > 0
    assert len(second.memos) == 0
    assert first.memos is not second.memos
    assert second.memos.group_keys(False, ("job",)) is not first.memos.group_keys(False, ("job",))


def test_memo_stays_within_its_bound_over_churning_label_sets() -> None:
    """However many distinct label sets an engine sees over time, its memo holds at most ``memo_limit`` entries."""
    store = Store(10**12)
    engine = Engine(store, lookback_ms=S // 2, memo_limit=100)  # each instance seen once
    for t in range(0, 60 * S, S):  # a new instance every second: 60 × 20 distinct label sets
        for k in range(20):
            store.append(labels_from("x", {"i": f"{t}-{k}", "job": str(k % 3)}), t, 1.0)
        assert one(engine.instant("count(sum by (i) (x))", t)) == 20
        assert sum(values(engine.instant("sum by (job) (x)", t)).values()) == 20
        assert len(engine.memos) <= engine.memos.size <= 100


def test_results_do_not_change_when_the_memo_is_evicted_mid_way() -> None:
    """An engine whose memo empties many times inside one operator returns what a fresh, roomy engine returns."""
    store = _memo_store(50)
    tiny = Engine(store, memo_limit=7)
    for q in MEMO_QUERIES:
        want = _sorted(Engine(store).instant(q, 0))
        assert want, q
        assert _sorted(tiny.instant(q, 0)) == want, q
        assert _sorted(tiny.instant(q, 0)) == want, q  # and again, on the refilled memo
        assert len(tiny.memos) <= 7


def test_promql_has_no_process_wide_cache() -> None:
    """No function in agent/promql is wrapped in a functools cache: memo tables belong to an engine."""
    for path in sorted((REPO / "agent" / "promql").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                names = {ast.unparse(d).split("(")[0] for d in node.decorator_list}
                assert not names & {"cache", "lru_cache", "functools.cache", "functools.lru_cache"}, (path, node.name)
