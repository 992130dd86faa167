"""Aggregation operators: ``sum``, ``avg``, ``count``, ``min``, ``max``, ``group``,
``stddev``, ``stdvar``, ``quantile``, ``topk``, ``bottomk``, ``count_values``.

A rule like ``sum by (model_name) (rate(...))`` runs this over every series each
interval, so the grouping key (which is also the output label set) is built straight
from the sorted label tuple, memoised per label set across evaluations in the engine's
:class:`~agent.promql.values.Memos` (a rule sees the same label sets every interval),
and each operator has its own tight loop.
Semantics are Prometheus 2.42's: ``by`` keeps only the listed labels, ``without``
removes them and ``__name__``; groups appear in order of first element; ``avg`` is an
incremental mean (no overflow near the float64 limit); ``min``/``max`` skip NaN unless
every value is NaN; ``topk``/``bottomk`` keep the elements' own labels, sort NaN last
and return nothing for ``k < 1``; ``count_values`` writes each value, formatted as Go
does, into the named label.
"""

from __future__ import annotations

import math

from agent.errors import PromQLError
from agent.gocompat.fmt import format_float
from agent.gocompat.math import int64_ok
from agent.promql.nodes import Aggregate
from agent.promql.rangefuncs import quantile
from agent.promql.values import Memo, Memos, Vec, group_key_fn
from agent.series import Labels, is_label_name

__all__ = ["aggregate"]


def aggregate(node: Aggregate, vec: Vec, param: float | str | None, memos: Memos) -> Vec:
    op = node.op
    if op == "count_values":
        assert isinstance(param, str)
        return _count_values(node, vec, param)
    keys = memos.group_keys(node.without, node.grouping)
    if op == "sum":
        sums: dict[Labels, float] = {}
        get = sums.get
        for ls, v in vec:
            k = keys[ls]
            prev = get(k)
            sums[k] = v if prev is None else prev + v
        return list(sums.items())
    if op in ("count", "group"):
        counts: dict[Labels, float] = {}
        for ls, _ in vec:
            k = keys[ls]
            counts[k] = counts.get(k, 0.0) + 1.0
        return [(k, 1.0 if op == "group" else c) for k, c in counts.items()]
    if op in ("min", "max"):
        return _min_max(op == "max", keys, vec)
    if op == "avg":
        return _avg(keys, vec)
    if op in ("stddev", "stdvar"):
        return _variance(op == "stddev", keys, vec)
    if op in ("topk", "bottomk", "quantile"):
        assert isinstance(param, float)
        members: dict[Labels, Vec] = {}
        for s in vec:
            k = keys[s[0]]
            group = members.get(k)
            if group is None:
                members[k] = [s]
            else:
                group.append(s)
        if op == "quantile":
            return [(k, quantile(param, [v for _, v in g])) for k, g in members.items()]
        return _top(op == "topk", param, members)
    raise PromQLError(f"unknown aggregation {op}")  # syntax.parse admits only the above


def _min_max(is_max: bool, keys: Memo[Labels, Labels], vec: Vec) -> Vec:
    acc: dict[Labels, float] = {}
    for ls, v in vec:
        k = keys[ls]
        cur = acc.get(k)
        if cur is None or math.isnan(cur) or (v > cur if is_max else v < cur):
            acc[k] = v
    return list(acc.items())


def _avg(keys: Memo[Labels, Labels], vec: Vec) -> Vec:
    acc: dict[Labels, list[float]] = {}  # [mean, count]
    for ls, v in vec:
        k = keys[ls]
        state = acc.get(k)
        if state is None:
            acc[k] = [v, 1.0]
            continue
        state[1] += 1
        mean, count = state
        if math.isinf(mean):
            if math.isinf(v) and (mean > 0) == (v > 0):
                continue
            if not math.isinf(v) and not math.isnan(v):
                continue
        state[0] = mean + (v / count - mean / count)
    return [(k, s[0]) for k, s in acc.items()]


def _variance(sqrt: bool, keys: Memo[Labels, Labels], vec: Vec) -> Vec:
    acc: dict[Labels, list[float]] = {}  # [count, mean, sum of squared deviations]
    for ls, v in vec:
        k = keys[ls]
        state = acc.get(k)
        if state is None:
            acc[k] = [1.0, v, 0.0]
            continue
        state[0] += 1
        delta = v - state[1]
        state[1] += delta / state[0]
        state[2] += delta * (v - state[1])
    out: Vec = []
    for k, (count, _, m2) in acc.items():
        var = m2 / count
        out.append((k, (math.sqrt(var) if var >= 0 else math.nan) if sqrt else var))
    return out


def _top(largest: bool, param: float, members: dict[Labels, Vec]) -> Vec:
    if not int64_ok(param):
        raise PromQLError(f"Scalar value {format_float(param)} overflows int64")
    k = int(param)
    if k < 1:
        return []
    out: Vec = []
    for group in members.values():
        if largest:
            ranked = sorted(group, key=lambda s: (math.isnan(s[1]), -s[1]))
        else:
            ranked = sorted(group, key=lambda s: (math.isnan(s[1]), s[1]))
        out.extend(ranked[:k])
    return out


def _count_values(node: Aggregate, vec: Vec, label: str) -> Vec:
    if not is_label_name(label):
        raise PromQLError(f'invalid label name "{label}"')
    grouping = node.grouping if node.without else (*node.grouping, label)
    key = group_key_fn(node.without, grouping)
    counts: dict[Labels, float] = {}
    for ls, v in vec:
        labelled = tuple(sorted([*(p for p in ls if p[0] != label), (label, format_float(v, "f"))]))
        k = key(labelled)
        counts[k] = counts.get(k, 0.0) + 1.0
    return list(counts.items())
