"""What a PromQL evaluation returns, and the label operations every operator shares.

The public value types (:class:`Sample`, :class:`Scalar`, :class:`String`,
:class:`MatrixSeries`) are what :class:`~agent.promql.engine.Engine` hands to callers.
Inside the engine an instant vector travels as a plain ``list[tuple[Labels, float]]``
(:data:`Vec`): a tuple costs a fraction of a dataclass to build, and a rule evaluation
builds one per series per operator. The engine converts at the boundary.

The label helpers encode two Prometheus rules that many operators need: which results
lose ``__name__``, and that no result vector may hold two elements with the same label
set ("vector cannot contain metrics with the same labelset").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from agent.errors import PromQLError
from agent.series import METRIC_NAME, Labels, labels_get

__all__ = [
    "Matrix",
    "MatrixSeries",
    "Memo",
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
    "group_keys",
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

#: Entries a :class:`Memo` holds before it starts over: several times the series of the
#: largest histogram family of a 1,000-target fleet, so a steady state never refills.
MEMO_LIMIT = 1 << 18


class Memo(dict[K, V], Generic[K, V]):
    """A bounded cache of a pure function of label sets (a group key, a label set less
    ``le``). Rules see the same label sets every interval, so the function runs once per
    series instead of once per series per evaluation; ``memo[labels]`` is one C-level
    dict lookup on a hit. The memoised values are the same objects every time, so a
    memo keyed by them downstream finds its keys by identity, without comparing them
    pair by pair. When full it empties itself: a fleet that churns label sets pays the
    function again, nothing more. Single-threaded use, like the engine."""

    def __init__(self, fn: Callable[[K], V], limit: int = MEMO_LIMIT) -> None:
        super().__init__()
        self._fn = fn
        self._limit = limit

    def __missing__(self, key: K) -> V:
        value = self._fn(key)
        if len(self) >= self._limit:
            self.clear()
        self[key] = value
        return value


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


#: One memo per grouping (``without``, names), shared by aggregations, vector matching and
#: ``histogram_quantile``; distinct groupings come from distinct queries, so the limit
#: only matters for a stream of ad-hoc queries.
_GROUP_KEYS: dict[tuple[bool, tuple[str, ...]], Memo[Labels, Labels]] = {}
_GROUP_KEYS_LIMIT = 256


def group_keys(without: bool, names: tuple[str, ...]) -> Memo[Labels, Labels]:
    """The memo of :func:`group_key_fn`: ``keys[labels]`` is the group key of ``labels``."""
    memo = _GROUP_KEYS.get((without, names))
    if memo is None:
        if len(_GROUP_KEYS) >= _GROUP_KEYS_LIMIT:
            _GROUP_KEYS.clear()
        memo = _GROUP_KEYS[(without, names)] = Memo(group_key_fn(without, names))
    return memo


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
