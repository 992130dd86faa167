"""What a PromQL evaluation returns, and the label operations every operator shares.

The public value types (:class:`Sample`, :class:`Scalar`, :class:`String`,
:class:`MatrixSeries`) are what :class:`~agent.promql.engine.Engine` hands to callers.
Inside the engine an instant vector travels as a plain ``list[tuple[Labels, float]]``
(:data:`Vec`): a tuple costs a fraction of a dataclass to build, and a rule evaluation
builds one per series per operator. The engine converts at the boundary.

The label helpers encode two Prometheus rules that many operators need: which results
lose ``__name__``, and that no result vector may hold two elements with the same label
set ("vector cannot contain metrics with the same labelset"). What operators derive from
label sets (group keys, match signatures, bucket keys) is memoised in :class:`Memos`,
which each engine owns: no table here is global, so two engines never share an entry
and a long-running one stays within its bound however many label sets pass through.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agent.errors import PromQLError
from agent.series import METRIC_NAME, Labels, labels_get

__all__ = [
    "MEMO_LIMIT",
    "MEMO_TABLES_LIMIT",
    "Matrix",
    "MatrixSeries",
    "Memo",
    "Memos",
    "Sample",
    "Scalar",
    "String",
    "Value",
    "Vec",
    "Vector",
    "check_unique",
    "drop_name",
    "drop_names",
    "group_key_fn",
]


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector."""

    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class Scalar:
    """A plain number (a literal, ``time()``, ``scalar(...)``, arithmetic on those)."""

    value: float


@dataclass(frozen=True, slots=True)
class String:
    """A string literal evaluated at the top level."""

    value: str


@dataclass(frozen=True, slots=True)
class MatrixSeries:
    """One series of a range vector or of a range query's result, oldest point first."""

    labels: Labels
    ts: list[int]
    values: list[float]


Vector = list[Sample]
Matrix = list[MatrixSeries]
Value = Vector | Scalar | String | Matrix

#: The engine's internal instant vector: (labels, value) pairs.
Vec = list[tuple[Labels, float]]

DUPLICATE_LABELSET = "vector cannot contain metrics with the same labelset"

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

#: Entries one engine's memo tables hold together before they start over. The bundled
#: rules keep about 120 per target (a group key or a bucket key per series they
#: aggregate; measured on 100 simulated vLLM targets), so this is four times what a
#: 1,000-target fleet needs and a steady state never refills. An entry costs 130-210
#: bytes beyond the label tuples the store already holds, so a fleet that churns label
#: sets costs at most about 100 MiB here.
MEMO_LIMIT = 1 << 19

#: Tables (one per grouping, one per memoised function) one engine keeps. Distinct
#: groupings come from distinct queries, so this only matters for a stream of ad-hoc
#: queries.
MEMO_TABLES_LIMIT = 256


class Memo(dict[K, V], Generic[K, V]):
    """One table of a :class:`Memos`: a pure function of label sets (a group key, a
    label set less ``le``), memoised. Rules see the same label sets every interval, so
    the function runs once per series instead of once per series per evaluation;
    ``memo[labels]`` is one C-level dict lookup on a hit. The memoised values are the
    same objects every time, so a memo keyed by them downstream finds its keys by
    identity, without comparing them pair by pair. A miss counts against the budget of
    the :class:`Memos` it belongs to, which empties every table when it is spent."""

    __slots__ = ("_fn", "_memos")

    def __init__(self, fn: Callable[[K], V], memos: Memos) -> None:
        super().__init__()
        self._fn = fn
        self._memos = memos

    def __missing__(self, key: K) -> V:
        value = self._fn(key)
        memos = self._memos
        if memos.size >= memos.limit:
            memos.clear()
        memos.size += 1
        self[key] = value
        return value


class Memos:
    """The memo tables of one :class:`~agent.promql.engine.Engine`, made with it and
    kept across its evaluations like its :class:`~agent.promql.selectors.SelectionCache`:
    two engines never share an entry, and an engine's tables go with it.

    Bounded twice: at most ``limit`` entries over all tables together, and at most
    ``tables`` tables. When either is spent everything is emptied at once rather than
    evicted least-recently-used: a hit stays one C-level ``dict`` lookup (an LRU would
    have to move the entry on every hit, a Python call per series per operator), a
    steady fleet never gets there, and a fleet that churns label sets pays the
    functions again, nothing more. A table emptied while an operator holds it goes on
    working (it refills). Single-threaded use, like the engine."""

    def __init__(self, limit: int = MEMO_LIMIT, tables: int = MEMO_TABLES_LIMIT) -> None:
        if limit < 1 or tables < 1:
            raise PromQLError("memo limits must be positive")
        self.limit = limit
        self.max_tables = tables
        #: Entries added since the last :meth:`clear`: at least ``len(self)``.
        self.size = 0
        self._tables: dict[Hashable, Memo[Any, Any]] = {}

    def __len__(self) -> int:
        """The entries held, over all tables."""
        return sum(len(memo) for memo in self._tables.values())

    @property
    def tables(self) -> int:
        """The tables kept (groupings and memoised functions)."""
        return len(self._tables)

    def group_keys(self, without: bool, names: tuple[str, ...]) -> Memo[Labels, Labels]:
        """The memo of :func:`group_key_fn`: ``keys[labels]`` is the group key of ``labels``.
        One per grouping, shared by aggregations, vector matching and ``histogram_quantile``."""
        memo = self._tables.get((without, names))
        if memo is None:
            memo = self._add((without, names), group_key_fn(without, names))
        return memo

    def of(self, fn: Callable[[K], V]) -> Memo[K, V]:
        """The memo of ``fn``, a module-level function: its table is found by identity."""
        memo = self._tables.get(fn)
        if memo is None:
            memo = self._add(fn, fn)
        return memo

    def _add(self, key: Hashable, fn: Callable[[Any], Any]) -> Memo[Any, Any]:
        if len(self._tables) >= self.max_tables:
            self.clear()
            self._tables.clear()
        memo: Memo[Any, Any] = Memo(fn, self)
        self._tables[key] = memo
        return memo

    def clear(self) -> None:
        """Empty every table; the tables stay, so an operator holding one goes on."""
        for memo in self._tables.values():
            memo.clear()
        self.size = 0


def drop_name(labels: Labels) -> Labels:
    """``labels`` without ``__name__``. Label tuples are sorted and ``__name__`` sorts
    before every lower-case name, so it is usually first: that case costs one slice."""
    if labels and labels[0][0] == METRIC_NAME:
        return labels[1:]
    for i, (k, _) in enumerate(labels):
        if k == METRIC_NAME:
            return labels[:i] + labels[i + 1 :]
    return labels


def group_key_fn(without: bool, names: tuple[str, ...]) -> Callable[[Labels], Labels]:
    """The label set that groups (or matches) ``labels``: only ``names`` (``by``/``on``),
    or all but ``names`` and ``__name__`` (``without``/``ignoring``). Built straight from
    the sorted label tuple, so the result is sorted too; ``without ()`` is plain
    :func:`drop_name`, the common case of binary operators."""
    if without:
        if not names:
            return drop_name
        skip = frozenset(names) | {METRIC_NAME}
        return lambda ls: tuple(p for p in ls if p[0] not in skip)
    if not names:
        return lambda ls: ()
    if len(names) == 1:
        only = names[0]

        def one(ls: Labels) -> Labels:
            for p in ls:
                if p[0] == only:
                    return (p,)
            return ()

        return one
    keep = frozenset(names)
    return lambda ls: tuple(p for p in ls if p[0] in keep)


def drop_names(pairs: Iterable[tuple[Labels, float]]) -> Vec:
    """Drop ``__name__`` from every element, and fail as Prometheus does if that made
    two elements identical. The duplicate check only runs when the input held more
    than one metric name, the only way dropping it can make two label sets collide."""
    out: Vec = []
    first: str | None = None
    mixed = False
    for labels, v in pairs:
        if labels and labels[0][0] == METRIC_NAME:
            name = labels[0][1]
            stripped = labels[1:]
        else:
            stripped = drop_name(labels)
            name = "" if stripped is labels else METRIC_NAME + labels_get(labels, METRIC_NAME)
        if first is None:
            first = name
        elif name != first:
            mixed = True
        out.append((stripped, v))
    if mixed:
        check_unique(out)
    return out


def check_unique(vec: Vec) -> Vec:
    """Raise Prometheus' error if two elements share a label set; returns ``vec``."""
    if len({labels for labels, _ in vec}) != len(vec):
        raise PromQLError(DUPLICATE_LABELSET)
    return vec
