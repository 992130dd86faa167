"""Tests for agent.store: compact series, TSDB write rules, selection, retention, keep-list."""

from __future__ import annotations

import math

import pytest

from agent.errors import StoreError
from agent.series import STALE_NAN, is_stale, labels_from
from agent.store import AppendResult, KeepList, RoundWriter, SeriesMatcher, Store


def _store() -> Store:
    return Store(retention_ms=3_600_000)


def test_samples_are_stored_in_typed_arrays() -> None:
    """A series keeps timestamps and values in arrays, not per-sample objects."""
    st = _store()
    s = st.series(labels_from("up", {"job": "vllm"}))
    for i in range(100):
        s.append(i * 1000, float(i))
    assert s.ts.typecode == "q" and s.vals.typecode == "d"
    assert len(s) == 100 and st.stats()["bytes"] == 1600


def test_out_of_order_and_duplicates_rejected_like_tsdb() -> None:
    """Older samples are rejected, same-timestamp different values are duplicates, same value is fine."""
    st = _store()
    lab = labels_from("m")
    assert st.append(lab, 2000, 1.0) is AppendResult.OK
    assert st.append(lab, 1000, 1.0) is AppendResult.OUT_OF_ORDER
    assert st.append(lab, 2000, 1.0) is AppendResult.OK
    assert st.append(lab, 2000, 2.0) is AppendResult.DUPLICATE
    assert st.get(lab) is not None and list(st.get(lab).vals) == [1.0]  # type: ignore[union-attr]
    assert st.rejected[AppendResult.OUT_OF_ORDER] == 1 and st.rejected[AppendResult.DUPLICATE] == 1


def test_stale_marker_survives_storage() -> None:
    """The staleness NaN keeps its payload in the array; an ordinary NaN is not stale."""
    st = _store()
    lab = labels_from("m")
    st.append(lab, 1000, float("nan"))
    st.append(lab, 2000, STALE_NAN)
    s = st.get(lab)
    assert s is not None
    assert math.isnan(s.vals[0]) and not is_stale(s.vals[0])
    assert is_stale(s.vals[1])


def test_select_by_matchers_and_time_range() -> None:
    """select() applies =, !=, =~, !~ (anchored) and an inclusive time range."""
    st = _store()
    for inst in ("a:1", "b:1", "ab:1"):
        s = st.series(labels_from("vllm:num_requests_waiting", {"instance": inst}))
        for t in range(0, 10_000, 1000):
            s.append(t, float(t))
    views = st.select([SeriesMatcher("__name__", "=", "vllm:num_requests_waiting"),
                       SeriesMatcher("instance", "=~", "a.*")], 2000, 4000)
    assert sorted(dict(v.labels)["instance"] for v in views) == ["a:1", "ab:1"]
    assert all(list(v.ts) == [2000, 3000, 4000] for v in views)
    assert len(st.select([SeriesMatcher("instance", "!~", "a.*")], 0, 10_000)) == 1
    assert len(st.select([SeriesMatcher("instance", "=~", "b")], 0, 10_000)) == 0  # anchored: 'b' != 'b:1'
    assert len(st.select([SeriesMatcher("__name__", "=~", "vllm:num_.*")], 0, 10_000)) == 3
    assert len(st.select([SeriesMatcher("missing", "=", "")], 0, 10_000)) == 3  # absent label == empty


def test_bad_matchers_are_store_errors() -> None:
    """An invalid regex (RE2's refusals included) or operator is a StoreError naming the matcher, not a crash."""
    with pytest.raises(StoreError, match=r"^matcher a=~: not a regular expression"):
        SeriesMatcher("a", "=~", "(")
    with pytest.raises(StoreError, match=r"^matcher a!~: not a regular expression in RE2 syntax: '\(x\)\\\\1'"):
        SeriesMatcher("a", "!~", "(x)\\1")  # a back-reference: Python's re has them, RE2 does not
    with pytest.raises(StoreError, match="operator"):
        SeriesMatcher("a", "<", "1")


def test_regex_matchers_are_go_re2() -> None:
    """=~ reads Go's RE2: ``.`` stops at a newline, ``$`` is the end of the text, ``\\pL`` is a class."""
    assert not SeriesMatcher("a", "=~", "x.y").matches("x\ny")
    assert not SeriesMatcher("a", "=~", "x$").matches("x\n")
    assert SeriesMatcher("a", "=~", "\\pL+").matches("\u00e9t\u00e9")
    assert SeriesMatcher("a", "!~", "[[:digit:]]+").matches("12a")


def test_gc_applies_retention_and_drops_empty_series() -> None:
    """Retention trims old samples and removes series left empty."""
    st = Store(retention_ms=10_000)
    old = st.series(labels_from("old"))
    old.append(0, 1.0)
    live = st.series(labels_from("live"))
    for t in range(0, 30_000, 1000):
        live.append(t, 1.0)
    assert st.gc(now_ms=30_000) == 1 + 20
    assert st.get(labels_from("old")) is None
    assert live.ts[0] == 20_000 and st.names() == ["live"]


def test_keep_list_matches_family_suffixes() -> None:
    """Keeping a family keeps its _bucket/_sum/_count/_total samples and nothing else."""
    keep = KeepList(["vllm:e2e_request_latency_seconds", "vllm:prompt_tokens"])
    assert "vllm:e2e_request_latency_seconds_bucket" in keep
    assert "vllm:e2e_request_latency_seconds_count" in keep
    assert "vllm:prompt_tokens_total" in keep
    assert "vllm:prompt_tokens_total_total" not in keep
    assert "python_gc_objects_collected_total" not in keep
    assert "anything" in KeepList(None)
    assert "x" in keep.extended(["x"]) and "x" not in keep


def test_round_writer_marks_vanished_series_stale() -> None:
    """A series missing from the next round gets a staleness marker once."""
    st = _store()
    w = RoundWriter(st)
    a, b = labels_from("m", {"gpu": "0"}), labels_from("m", {"gpu": "1"})
    w.write([(a, 1.0, 1000), (b, 2.0, 1000)], 1000)
    w.write([(a, 1.0, 2000)], 2000)
    w.write([(a, 1.0, 3000)], 3000)
    sb = st.get(b)
    assert sb is not None and len(sb) == 2 and is_stale(sb.vals[-1])
    w.stale_all(4000)
    sa = st.get(a)
    assert sa is not None and is_stale(sa.vals[-1])


def test_store_requires_metric_name_and_positive_retention() -> None:
    """Series without __name__ and a non-positive retention are refused."""
    with pytest.raises(StoreError):
        _store().series((("job", "x"),))
    with pytest.raises(StoreError):
        Store(retention_ms=0)


def test_max_series_refuses_new_scraped_series_only() -> None:
    """At max_series, try_series refuses and counts new series, still returns existing ones, and
    series() (the agent's own series) is never refused; gc frees room again."""
    store = Store(60_000, max_series=2)
    a, b, c = (labels_from("m", {"i": str(i)}) for i in range(3))
    sa = store.try_series(a)
    assert sa is not None and store.try_series(b) is not None
    assert store.try_series(c) is None and store.refused_series == 1
    assert store.try_series(a) is sa and store.series_count == 2
    store.series(labels_from("up"))  # the agent's own: not refused
    assert store.series_count == 3 and store.has("up", labels_from("up")) and not store.has("m", c)
    sa.append(0, 1.0)
    store.gc(120_000)  # every series is empty or older than retention: all dropped
    assert store.series_count == 0 and store.try_series(c) is not None and store.refused_series == 1
