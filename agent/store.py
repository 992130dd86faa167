"""In-memory series store: what the PromQL engine reads and every source writes.

Each series keeps its samples in two typed arrays (``array('q')`` timestamps in
milliseconds, ``array('d')`` values): 16 bytes a sample and no Python object per
sample. Appends go to the end; :meth:`Store.gc` drops the head older than the
retention window in one slice, so the arrays behave like ring buffers whose
capacity is a time span rather than a count.

Only metric names on the :class:`KeepList` are stored (DESIGN.md decision 3): the
scraper asks :meth:`Store.wants` per sample name, answered from a dict cache, and
skips the rest before parsing their labels.

**Cardinality cap**: ``max_series`` bounds the series that scraped targets create
(:meth:`Store.try_series`); beyond it a *new* scraped series is refused and counted in
``refused_series`` (the agent exports the count and alerts on it), while existing series keep
being written. The agent's own series (``up``, ``scrape_*``, rule results, NVML) go through
:meth:`Store.series` and are never refused: they are bounded by the configuration, and
``up`` must stay truthful exactly when the store is full.

Write rules follow Prometheus' TSDB: a sample older than the series' last one is
rejected ("out of order"), a second sample at the same timestamp with a different
value is rejected ("duplicate"), the same value again is accepted silently.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum

from agent.errors import RegexError, StoreError
from agent.gocompat.regex import match_anchored
from agent.series import METRIC_NAME, STALE_NAN, Labels, is_stale

__all__ = [
    "AppendResult",
    "KeepList",
    "RoundWriter",
    "Series",
    "SeriesMatcher",
    "SeriesView",
    "Store",
]

#: Suffixes a sample name may carry beyond its family name (histogram, summary,
#: counter and OpenMetrics ``_created``/``_info``); keeping a family keeps them all.
_FAMILY_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created", "_info", "_gsum", "_gcount")


class AppendResult(Enum):
    OK = "ok"
    OUT_OF_ORDER = "out_of_order"
    DUPLICATE = "duplicate"


class Series:
    """One series: its labels and its samples, oldest first."""

    __slots__ = ("labels", "ts", "vals")

    def __init__(self, labels: Labels) -> None:
        self.labels = labels
        self.ts: array[int] = array("q")
        self.vals: array[float] = array("d")

    def append(self, ts_ms: int, value: float) -> AppendResult:
        ts = self.ts
        if ts:
            last = ts[-1]
            if ts_ms < last:
                return AppendResult.OUT_OF_ORDER
            if ts_ms == last:
                prev = self.vals[-1]
                same = prev == value or (math.isnan(prev) and math.isnan(value) and is_stale(prev) == is_stale(value))
                return AppendResult.OK if same else AppendResult.DUPLICATE
        ts.append(ts_ms)
        self.vals.append(value)
        return AppendResult.OK

    def mark_stale(self, now_ms: int) -> bool:
        """End the series with a staleness marker, just after its last sample if that is
        at ``now_ms`` already (a target removed in the same millisecond it was scraped).
        False when it ended so already."""
        if self.vals and is_stale(self.vals[-1]):
            return False
        return self.append(max(now_ms, self.ts[-1] + 1) if self.ts else now_ms, STALE_NAN) is AppendResult.OK

    def window(self, start_ms: int, end_ms: int) -> tuple[int, int]:
        """Index range ``[i, j)`` of samples with ``start_ms <= t <= end_ms``."""
        return bisect_left(self.ts, start_ms), bisect_right(self.ts, end_ms)

    def trim_before(self, min_ts_ms: int) -> int:
        """Drop samples older than ``min_ts_ms``; returns how many were dropped."""
        cut = bisect_left(self.ts, min_ts_ms)
        if cut:
            del self.ts[:cut]
            del self.vals[:cut]
        return cut

    def __len__(self) -> int:
        return len(self.ts)

    def __repr__(self) -> str:
        return f"Series({self.labels!r}, {len(self)} samples)"


@dataclass(frozen=True, slots=True)
class SeriesView:
    """A read-only slice of one series for a time range (copies, safe to keep)."""

    labels: Labels
    ts: array[int]
    vals: array[float]


@dataclass(frozen=True, slots=True)
class SeriesMatcher:
    """A PromQL label matcher that selects series from the store (``{job=~"vllm.*"}``). A regex is Go's
    RE2, anchored as Prometheus anchors it (``^(?:re)$``), and matches in linear time whatever the label
    value. Alert routing and silences use :class:`agent.matchers.AlertMatcher`."""

    name: str
    op: str
    value: str
    _regex: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in ("=", "!=", "=~", "!~"):
            raise StoreError(f"unknown matcher operator {self.op!r}")
        if self.op in ("=~", "!~"):
            try:
                compiled = match_anchored(self.value, what=f"matcher {self.name}{self.op}")
            except RegexError as exc:
                raise StoreError(str(exc)) from exc
            object.__setattr__(self, "_regex", compiled)

    def matches(self, value: str) -> bool:
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        assert self._regex is not None
        hit = self._regex(value)
        return hit if self.op == "=~" else not hit


class KeepList(dict[str, bool]):
    """Which sample names to store. ``None`` families means keep everything.

    A dict of decisions that fills itself (``__missing__``), so the parser asks it with
    the C-level ``keep[name]`` once per name per scrape; ``name in keep`` also works.
    """

    def __init__(self, families: Iterable[str] | None) -> None:
        super().__init__()
        self._families = None if families is None else frozenset(families)

    @property
    def keeps_all(self) -> bool:
        return self._families is None

    def __missing__(self, sample_name: str) -> bool:
        hit = self._decide(sample_name)
        if len(self) < 100_000:  # bound the cache against name-exploding targets
            self[sample_name] = hit
        return hit

    def __contains__(self, sample_name: object) -> bool:
        return isinstance(sample_name, str) and self[sample_name]

    def _decide(self, name: str) -> bool:
        fams = self._families
        if fams is None or name in fams:
            return True
        return any(name.endswith(s) and name[: -len(s)] in fams for s in _FAMILY_SUFFIXES)

    def extended(self, more: Iterable[str]) -> KeepList:
        """A new keep-list with ``more`` families added (no-op if keeping all)."""
        if self._families is None:
            return self
        return KeepList(self._families | frozenset(more))

    def __repr__(self) -> str:
        return f"KeepList({'all' if self._families is None else sorted(self._families)})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, KeepList) and other._families == self._families

    __hash__ = None


class Store:
    """All series, indexed by metric name, then by the full label tuple."""

    def __init__(self, retention_ms: int, keep: KeepList | None = None, *, max_series: int = 0) -> None:
        if retention_ms <= 0:
            raise StoreError("retention must be positive")
        if max_series < 0:
            raise StoreError("max_series must be 0 (unlimited) or positive")
        self.retention_ms = retention_ms
        #: Cap on series for :meth:`try_series` (scraped series); 0 = unlimited. See the module docstring.
        self.max_series = max_series
        self.series_count = 0
        #: New series :meth:`try_series` refused because the store held ``max_series`` already.
        self.refused_series = 0
        self.keep = keep if keep is not None else KeepList(None)
        self._by_name: dict[str, dict[Labels, Series]] = {}
        #: Bumped whenever a series is created or dropped, so readers can cache selections.
        self.generation = 0
        self.rejected: dict[AppendResult, int] = {AppendResult.OUT_OF_ORDER: 0, AppendResult.DUPLICATE: 0}

    # -- writing ---------------------------------------------------------------
    def wants(self, sample_name: str) -> bool:
        return sample_name in self.keep

    def series(self, labels: Labels) -> Series:
        """The series with exactly these labels, created if new."""
        return self._series(_name_of(labels), labels)

    def _series(self, name: str, labels: Labels) -> Series:
        """:meth:`series` for a caller that has found the metric name already."""
        bucket = self._by_name.get(name)
        if bucket is None:
            bucket = self._by_name[name] = {}
        s = bucket.get(labels)
        if s is None:
            s = bucket[labels] = Series(labels)
            self.generation += 1
            self.series_count += 1
        return s

    def try_series(self, labels: Labels) -> Series | None:
        """:meth:`series` for a source whose new series count against ``max_series`` (what targets
        send): ``None``, counted in ``refused_series``, when the store is full and the series is new."""
        name = _name_of(labels)
        bucket = self._by_name.get(name)
        s = bucket.get(labels) if bucket is not None else None
        if s is not None:
            return s
        if self.max_series and self.series_count >= self.max_series:
            self.refused_series += 1
            return None
        return self._series(name, labels)

    def has(self, name: str, labels: Labels) -> bool:
        """Whether the series exists already (``name`` is its metric name, found by the caller)."""
        bucket = self._by_name.get(name)
        return bucket is not None and labels in bucket

    def append(self, labels: Labels, ts_ms: int, value: float) -> AppendResult:
        result = self.series(labels).append(ts_ms, value)
        self.note_rejected(result)
        return result

    def note_rejected(self, result: AppendResult) -> None:
        """Count a rejected append done directly on a :class:`Series`."""
        if result is not AppendResult.OK:
            self.rejected[result] += 1

    # -- reading ---------------------------------------------------------------
    def get(self, labels: Labels) -> Series | None:
        return self._by_name.get(_name_of(labels), {}).get(labels)

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def iter_series(self, matchers: Iterable[SeriesMatcher] = ()) -> Iterator[Series]:
        """Series whose labels satisfy every matcher (missing label = empty string)."""
        ms = list(matchers)
        name_eq = next((m.value for m in ms if m.name == METRIC_NAME and m.op == "="), None)
        if name_eq is not None:
            buckets: Iterable[dict[Labels, Series]] = [self._by_name.get(name_eq, {})]
        else:
            name_ms = [m for m in ms if m.name == METRIC_NAME]
            buckets = [b for n, b in self._by_name.items() if all(m.matches(n) for m in name_ms)]
        rest = [m for m in ms if m.name != METRIC_NAME]
        for bucket in buckets:
            for labels, s in bucket.items():
                if rest:
                    d = dict(labels)
                    if not all(m.matches(d.get(m.name, "")) for m in rest):
                        continue
                yield s

    def select(self, matchers: Iterable[SeriesMatcher], start_ms: int, end_ms: int) -> list[SeriesView]:
        """Samples of every matching series within ``[start_ms, end_ms]``; series with
        no sample in the range are left out."""
        out = []
        for s in self.iter_series(matchers):
            i, j = s.window(start_ms, end_ms)
            if i < j:
                out.append(SeriesView(s.labels, s.ts[i:j], s.vals[i:j]))
        return out

    # -- housekeeping ----------------------------------------------------------
    def gc(self, now_ms: int) -> int:
        """Apply retention; drop series left empty. Returns samples dropped."""
        cutoff = now_ms - self.retention_ms
        dropped = 0
        for name in list(self._by_name):
            bucket = self._by_name[name]
            for labels in list(bucket):
                s = bucket[labels]
                dropped += s.trim_before(cutoff)
                if not s.ts:
                    del bucket[labels]
                    self.generation += 1
                    self.series_count -= 1
            if not bucket:
                del self._by_name[name]
        return dropped

    def stats(self) -> dict[str, int]:
        series = sum(len(b) for b in self._by_name.values())
        samples = sum(len(s) for b in self._by_name.values() for s in b.values())
        return {"series": series, "samples": samples, "bytes": samples * 16, "names": len(self._by_name)}


def _name_of(labels: Labels) -> str:
    for k, v in labels:
        if k == METRIC_NAME:
            return v
    raise StoreError(f"series without a metric name: {labels!r}")


class RoundWriter:
    """Writes a source's samples in rounds (one NVML poll = one round) and appends
    staleness markers for series that were in the previous round but not this one,
    the way a scrape does for a target.

    ``observer``, when set, is given each round's samples that were appended, staleness markers
    included, once the round is written (remote write's feed); without one nothing is collected.
    """

    def __init__(self, store: Store, *, keep_filter: bool = True,
                 observer: Callable[[list[tuple[Labels, float, int]]], None] | None = None) -> None:
        self._store = store
        self._filter = keep_filter  # False for the agent's own series (rule results)
        self._last: set[Labels] = set()
        self.observer = observer

    def write(self, samples: Iterable[tuple[Labels, float, int]], now_ms: int) -> int:
        store = self._store
        wants = store.wants if self._filter else None
        seen: set[Labels] = set()
        written: list[tuple[Labels, float, int]] | None = None if self.observer is None else []
        for labels, value, ts in samples:
            name = _name_of(labels)
            if wants is None or wants(name):
                result = store._series(name, labels).append(ts, value)
                store.note_rejected(result)
                seen.add(labels)
                if written is not None and result is AppendResult.OK:
                    written.append((labels, value, ts))
        for labels in self._last - seen:
            series = store.series(labels)
            if series.mark_stale(now_ms) and written is not None:
                written.append((labels, STALE_NAN, series.ts[-1]))
        self._last = seen
        if written and self.observer is not None:
            self.observer(written)
        return len(seen)

    def stale_all(self, now_ms: int) -> None:
        self.write((), now_ms)
