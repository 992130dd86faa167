"""Selector evaluation: which series a selector matches, and their samples at a time.

A rule reads the same selectors every interval, and the set of series they match only
changes when a series is created or dropped, which the store counts in
:attr:`~agent.store.Store.generation`. So :class:`SelectionCache` keeps each selector's
matched series (a :class:`Selection`) across evaluations; in a steady fleet matching
costs nothing. When the generation has moved (a scrape or a rule created a series,
retention dropped one), the selection is rebuilt on its next use from the store's
series of the selector's metric names, in the store's order, and only series it has
not seen before are matched; the others keep their verdict and their data.

A :class:`Selection` also keeps what operators derive from the series' label sets and
would otherwise rebuild per series per evaluation: the label sets without
``__name__`` (what ``rate`` and most functions return) and whether they came from more
than one metric name (only then can dropping the name make two results collide).
Keeping those label tuples as the same objects every evaluation also makes the
:class:`~agent.promql.values.Memo` caches downstream hit by identity.

The per-series loops read the store's typed arrays with ``bisect``; stale markers are
looked for only when a window holds a NaN at all (``sum`` is NaN), which scraped data
almost never does.

:func:`extents` feeds ``rate``/``increase``/``delta`` over a range selector straight
from that loop, and avoids even the per-window scan for NaNs and counter resets: a
5-minute window holds the same samples as the last evaluation's but one, so the
selection remembers, per series, up to which timestamp it has checked the samples
(``checked``) and the latest place where a window must not start at or before
(``dirty``: a NaN, or the first point of a decrease). Each sample is then checked once,
when it arrives, instead of once per evaluation while it is in a window; a window
starting after ``dirty`` holds no NaN and no reset, so its change is last minus first.
The store only appends samples later than the last and drops old ones from the head,
so what was checked stays true for as long as the series exists.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence

from agent.promql.nodes import VectorSel
from agent.promql.rangefuncs import Extent, change
from agent.promql.values import Vec, drop_name
from agent.series import METRIC_NAME, Labels, is_stale, labels_get
from agent.store import Series, SeriesMatcher, Store

__all__ = ["Selection", "SelectionCache", "Window", "extents", "instant", "select", "windows"]

#: One series' points inside a range window: labels, timestamps (ms), values.
Window = tuple[Labels, Sequence[int], Sequence[float]]

#: Distinct selectors kept; ad-hoc queries beyond that start the cache over.
_CACHE_LIMIT = 4096

#: A timestamp before any sample: nothing checked, nothing dirty.
_NEVER = -(1 << 63)


class Selection:
    """The series one selector matched at one store generation, in store order, with
    per-series data kept in parallel lists: the labels less ``__name__`` and the
    ``checked``/``dirty`` timestamps of :func:`extents` (module doc)."""

    __slots__ = ("candidates", "checked", "dirty", "generation", "mixed", "names", "rejected", "series", "unnamed")

    def __init__(self, generation: int, candidates: list[Series]) -> None:
        self.generation = generation
        #: The store's series of the selector's metric names, matched or not, in order.
        self.candidates = candidates
        self.series: list[Series] = []
        self.unnamed: list[Labels] = []
        self.checked: array[int] = array("q")
        self.dirty: array[int] = array("q")
        #: The metric names seen; more than one (:attr:`mixed`) means dropping the name
        #: may make two results collide. Not pruned when series go: may only overstate.
        self.names: set[str] = set()
        self.mixed = False
        #: Series of the matched names that the other matchers turned down.
        self.rejected: set[Series] = set()

    def add(self, s: Series, unnamed: Labels, checked: int, dirty: int) -> None:
        self.series.append(s)
        self.unnamed.append(unnamed)
        self.checked.append(checked)
        self.dirty.append(dirty)


def _matches(labels: Labels, matchers: list[SeriesMatcher]) -> bool:
    """:meth:`Store.iter_series`'s test for the matchers on other labels than the name."""
    d = dict(labels)
    return all(m.matches(d.get(m.name, "")) for m in matchers)


def select(store: Store, sel: VectorSel, old: Selection | None = None) -> Selection:
    """What ``store.iter_series(sel.matchers)`` yields, in its order, as a Selection.

    With ``old`` (the same selector at an earlier generation), ``old`` itself comes back
    if the store still holds the same series of the selector's metric names (the new or
    dropped series were of other names: one list comparison by identity); otherwise a
    series ``old`` already matched or turned down keeps that verdict and its data: a
    series' labels never change, so only series created since are matched, and nothing
    is checked twice.
    """
    by_name = [m for m in sel.matchers if m.name == METRIC_NAME]
    candidates = list(store.iter_series(by_name))
    if old is not None and candidates == old.candidates:
        old.generation = store.generation
        return old
    others = [m for m in sel.matchers if m.name != METRIC_NAME]
    index = {s: k for k, s in enumerate(old.series)} if old is not None else {}
    rejected = old.rejected if old is not None else set()
    new = Selection(store.generation, candidates)
    if old is not None:
        new.names = set(old.names)
    for s in candidates:
        k = index.get(s)
        if k is not None:
            assert old is not None
            new.add(s, old.unnamed[k], old.checked[k], old.dirty[k])
        elif s in rejected or (others and not _matches(s.labels, others)):
            new.rejected.add(s)
        else:
            new.add(s, drop_name(s.labels), _NEVER, _NEVER)
            new.names.add(labels_get(s.labels, METRIC_NAME))
    new.mixed = len(new.names) > 1
    return new


class SelectionCache:
    """Each selector's :class:`Selection`, brought up to date when the store's
    generation has moved since it was made."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._by_key: dict[tuple[tuple[str, str, str], ...], Selection] = {}

    def get(self, sel: VectorSel) -> Selection:
        found = self._by_key.get(sel.key)
        generation = self._store.generation
        if found is None or found.generation != generation:
            if found is None and len(self._by_key) >= _CACHE_LIMIT:
                self._by_key.clear()
            found = self._by_key[sel.key] = select(self._store, sel, found)
        return found


def instant(sel: Selection, ref: int, lookback: int, sample_times: bool) -> Vec:
    """The newest sample at or before ``ref`` and at most ``lookback`` old, per series
    (its timestamp in seconds when ``sample_times``); none if that one is stale."""
    oldest = ref - lookback
    out: Vec = []
    append = out.append
    for s in sel.series:
        times = s.ts
        j = bisect_right(times, ref)
        if j == 0 or times[j - 1] < oldest:
            continue
        v = s.vals[j - 1]
        if v != v and is_stale(v):  # noqa: PLR0124 - a NaN test without a call, per series
            continue
        append((s.labels, times[j - 1] / 1000 if sample_times else v))
    return out


def windows(sel: Selection, mint: int, maxt: int, labels: Sequence[Labels] | None = None) -> list[Window]:
    """Each series' points in ``[mint, maxt]`` less stale markers; series left empty
    are omitted. ``labels`` (parallel to the series) replaces the series' own."""
    out: list[Window] = []
    append = out.append
    for k, s in enumerate(sel.series):
        times = s.ts
        i = bisect_left(times, mint)
        j = bisect_right(times, maxt)
        if i == j:
            continue
        ls = s.labels if labels is None else labels[k]
        vs = s.vals[i:j]
        total = sum(vs)
        if total != total:  # noqa: PLR0124 - a NaN somewhere: maybe stale markers to drop
            keep = [n for n, v in enumerate(vs) if not is_stale(v)]
            if not keep:
                continue
            if len(keep) < len(vs):
                append((ls, [times[i + n] for n in keep], [vs[n] for n in keep]))
                continue
        append((ls, times[i:j], vs))
    return out


def extents(sel: Selection, mint: int, maxt: int, counter: bool) -> Iterator[Extent]:
    """What :func:`~agent.promql.rangefuncs.extrapolated` needs of each series with at
    least two points in ``[mint, maxt]`` (stale markers removed), in store order, with
    the name-less labels: ``rate(sel[r])`` without a window per series, and without a
    scan of the window where the selection's checks show it clean (module doc)."""
    checked = sel.checked
    dirty = sel.dirty
    for k, (s, ls) in enumerate(zip(sel.series, sel.unnamed, strict=True)):
        times = s.ts
        i = bisect_left(times, mint)
        j = bisect_right(times, maxt)
        if j - i < 2:
            continue  # fewer than two points even before stale markers are dropped
        vals = s.vals
        first_t = times[i]
        last_t = times[j - 1]
        if last_t > checked[k]:  # check the samples that arrived since, up to this window's end
            n = bisect_right(times, checked[k])
            prev = vals[n - 1] if n else None
            while n < j:
                v = vals[n]
                if v != v:  # noqa: PLR0124 - a NaN (a stale marker, or a NaN value)
                    dirty[k] = times[n]
                elif prev is not None and v < prev:
                    dirty[k] = times[n - 1]
                prev = v
                n += 1
            checked[k] = last_t
        if first_t > dirty[k]:  # no NaN and no decrease inside the window
            first = vals[i]
            yield ls, first, vals[j - 1] - first, j - i, first_t, last_t
            continue
        vs: Sequence[float] = vals[i:j]
        total = sum(vs)
        if total != total:  # noqa: PLR0124 - a NaN somewhere: maybe stale markers to drop
            keep = [n for n, v in enumerate(vs) if not is_stale(v)]
            if len(keep) < 2:
                continue
            if len(keep) < len(vs):
                vs = [vs[n] for n in keep]
                yield ls, vs[0], change(vs, counter), len(vs), times[i + keep[0]], times[i + keep[-1]]
                continue
        yield ls, vs[0], change(vs, counter), len(vs), first_t, last_t
