"""Binary operators: arithmetic, comparisons, set operators and vector matching.

Prometheus 2.42's rules, which alert expressions lean on heavily:

* Arithmetic (``+ - * / % ^``) drops ``__name__``; ``atan2`` and comparisons keep it,
  except that a comparison with ``bool`` returns 0/1 and drops it. A comparison
  without ``bool`` filters and keeps the vector element's own value, whichever side
  the scalar is on.
* Vector/vector operations match elements on their label sets less ``__name__``, or on
  the ``on(...)`` labels, or on all but the ``ignoring(...)`` labels. One-to-one
  matching fails when either side has two elements in one match group;
  ``group_left``/``group_right`` allow "many" on one side and copy the listed labels
  from the "one" side, which still must be unique ("many-to-many matching not
  allowed").
* ``and``/``or``/``unless`` match the same way but never fail on duplicates.
"""

from __future__ import annotations

import json
import math
import operator
from collections.abc import Callable

from agent.errors import PromQLError
from agent.gocompat.math import div, mod, pow_
from agent.promql.nodes import Binary
from agent.promql.values import Memos, Vec, drop_name, drop_names
from agent.series import METRIC_NAME, Labels

__all__ = ["ARITHMETIC", "COMPARISON", "scalar_binop", "vector_binop", "vector_scalar_binop"]

ARITHMETIC: dict[str, Callable[[float, float], float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": div,
    "%": mod,
    "^": pow_,
    "atan2": math.atan2,
}
COMPARISON: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    "<": operator.lt,
    ">=": operator.ge,
    "<=": operator.le,
}
#: Operators whose result loses the metric name (not atan2, in 2.42).
_DROPS_NAME = frozenset({"+", "-", "*", "/", "%", "^"})


def scalar_binop(op: str, a: float, b: float) -> float:
    cmp = COMPARISON.get(op)
    if cmp is not None:  # the parser only allows scalar comparisons with bool
        return 1.0 if cmp(a, b) else 0.0
    return ARITHMETIC[op](a, b)


def vector_scalar_binop(op: str, vec: Vec, scalar: float, scalar_left: bool, return_bool: bool) -> Vec:
    cmp = COMPARISON.get(op)
    if cmp is not None:
        if return_bool:
            return drop_names(
                (ls, 1.0 if (cmp(scalar, v) if scalar_left else cmp(v, scalar)) else 0.0) for ls, v in vec
            )
        if scalar_left:
            return [s for s in vec if cmp(scalar, s[1])]
        return [s for s in vec if cmp(s[1], scalar)]
    fn = ARITHMETIC[op]
    pairs = [(ls, fn(scalar, v)) for ls, v in vec] if scalar_left else [(ls, fn(v, scalar)) for ls, v in vec]
    return drop_names(pairs) if op in _DROPS_NAME else pairs


def _signature(node: Binary, memos: Memos) -> Callable[[Labels], Labels]:
    """The match signature of an operand's label set, memoised in the engine's
    ``memos``: ``on(...)`` keeps the listed labels, ``ignoring(...)`` (or neither) drops
    them and ``__name__``."""
    return memos.group_keys(not node.on, node.labels).__getitem__


def _fmt(labels: Labels) -> str:
    return "{" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in labels) + "}"


def vector_binop(node: Binary, lhs: Vec, rhs: Vec, memos: Memos) -> Vec:
    sig = _signature(node, memos)
    op = node.op
    if op == "and":
        if not lhs or not rhs:
            return []
        right = {sig(ls) for ls, _ in rhs}
        return [s for s in lhs if sig(s[0]) in right]
    if op == "or":
        if not lhs or not rhs:
            return lhs + rhs
        left = {sig(ls) for ls, _ in lhs}
        return lhs + [s for s in rhs if sig(s[0]) not in left]
    if op == "unless":
        if not lhs or not rhs:
            return lhs
        right = {sig(ls) for ls, _ in rhs}
        return [s for s in lhs if sig(s[0]) not in right]
    return _match(node, sig, lhs, rhs)


def _match(node: Binary, sig: Callable[[Labels], Labels], lhs: Vec, rhs: Vec) -> Vec:
    """One-to-one and many-to-one matching (``VectorBinop``)."""
    swapped = node.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    ones: dict[Labels, tuple[Labels, float]] = {}
    for s in one:
        key = sig(s[0])
        dup = ones.get(key)
        if dup is not None:
            side = "left" if swapped else "right"
            raise PromQLError(
                f"found duplicate series for the match group {_fmt(key)} on the {side} hand-side of the operation: "
                f"[{_fmt(s[0])}, {_fmt(dup[0])}];many-to-many matching not allowed: "
                "matching labels must be unique on one side"
            )
        ones[key] = s
    cmp = COMPARISON.get(node.op)
    fn = ARITHMETIC.get(node.op)
    one_to_one = node.card == "one-to-one"
    drops = node.op in _DROPS_NAME or node.return_bool
    plain = one_to_one and not node.on and not node.labels  # the common case: a / b
    matched: dict[Labels, set[Labels] | None] = {}
    out: Vec = []
    for ls, lv in many:
        key = sig(ls)
        r = ones.get(key)
        if r is None:
            continue
        rl, rv = r
        vl, vr = (rv, lv) if swapped else (lv, rv)
        if cmp is not None:
            keep = cmp(vl, vr)
            if node.return_bool:
                value = 1.0 if keep else 0.0
            elif not keep:
                continue
            else:
                value = vl
        else:
            assert fn is not None
            value = fn(vl, vr)
        labels = (drop_name(ls) if drops else ls) if plain else _result_labels(node, ls, rl, drops)
        if one_to_one:
            if key in matched:
                raise PromQLError(
                    "multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                )
            matched[key] = None
        else:
            seen = matched.get(key)
            if seen is None:
                seen = matched[key] = set()
            elif labels in seen:
                raise PromQLError("multiple matches for labels: grouping labels must ensure unique matches")
            seen.add(labels)
        out.append((labels, value))
    return out


def _result_labels(node: Binary, many: Labels, one: Labels, drops: bool) -> Labels:
    d = dict(many)
    if drops:
        d.pop(METRIC_NAME, None)
    if node.card == "one-to-one":
        if node.on:
            d = {k: v for k, v in d.items() if k in node.labels}
        else:
            for name in node.labels:
                d.pop(name, None)
    if node.include:
        od = dict(one)
        for name in node.include:
            value = od.get(name, "")
            if value:
                d[name] = value
            else:
                d.pop(name, None)
    return tuple(sorted(d.items()))
