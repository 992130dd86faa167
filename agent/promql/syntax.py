"""Parsing: promql-parser's AST in, the engine's validated :class:`Expr` out.

A construct the engine does not evaluate is rejected here, when a rule file loads,
with :class:`~agent.errors.UnsupportedError` naming it (DESIGN.md decision 2), never
halfway through an evaluation. A syntax or type error (the parser type-checks function
arguments, operands and ``bool``) becomes :class:`~agent.errors.PromQLError` carrying
the parser's message.

The parser (promql-parser 0.12) follows Prometheus 2.45+, newer than the 2.42 the
rules target. What it accepts beyond 2.42 (``or`` between label matchers, ``fill``
modifiers, functions and aggregations added later) is rejected here as unsupported;
``holt_winters``, which it no longer knows, is reported as unsupported rather than as a
syntax error, since the rule is valid in 2.42.

Operators are read with ``str(node.op)``: the parser's token objects compare by
identity only (DESIGN.md decision 2).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import promql_parser as pp

from agent.errors import PromQLError, StoreError, UnsupportedError
from agent.promql.compat import newer_syntax
from agent.promql.functions import FUNCTIONS
from agent.promql.nodes import (
    Aggregate,
    At,
    Binary,
    Call,
    Expr,
    MatrixSel,
    Node,
    NumberLit,
    StringLit,
    Subquery,
    Unary,
    VectorSel,
)
from agent.promql.rangefuncs import RANGE_FUNCTIONS
from agent.series import METRIC_NAME
from agent.store import SeriesMatcher

__all__ = ["ENGINE_FUNCTIONS", "metric_names", "parse"]

#: Functions evaluated by the engine itself (they need the unevaluated argument).
_SPECIAL_FUNCTIONS = frozenset({"absent", "absent_over_time", "timestamp"})
ENGINE_FUNCTIONS = frozenset(FUNCTIONS) | frozenset(RANGE_FUNCTIONS) | _SPECIAL_FUNCTIONS
_AGGREGATIONS = frozenset(
    {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values"}
)
#: Valid in Prometheus 2.42 but unknown to the parser, which follows 3.x naming.
_REMOVED_FUNCTIONS = frozenset({"holt_winters"})
_NATIVE_HISTOGRAM_FUNCTIONS = frozenset(
    {"histogram_count", "histogram_sum", "histogram_fraction", "histogram_stddev", "histogram_stdvar", "histogram_avg"}
)
_MATCH_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}
_CARDS = {
    "VectorMatchCardinality.OneToOne": "one-to-one",
    "VectorMatchCardinality.ManyToOne": "many-to-one",
    "VectorMatchCardinality.OneToMany": "one-to-many",
    "VectorMatchCardinality.ManyToMany": "many-to-many",
}
_VALUE_TYPES = {
    "ValueType.Vector": "vector",
    "ValueType.Scalar": "scalar",
    "ValueType.Matrix": "matrix",
    "ValueType.String": "string",
}
_SET_OPS = frozenset({"and", "or", "unless"})
_UNKNOWN_FUNCTION = re.compile(r"unknown function with name '(\w+)'")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def parse(text: str) -> Expr:
    """Parse and validate ``text``; see the module docstring for the errors raised."""
    try:
        tree = pp.parse(text)
    except ValueError as exc:
        msg = str(exc)
        m = _UNKNOWN_FUNCTION.search(msg)
        if m and m.group(1) in _REMOVED_FUNCTIONS:
            raise UnsupportedError(f"function {m.group(1)}", "not implemented by the agent's engine") from exc
        raise PromQLError(f"syntax error: {msg}") from exc
    newer = newer_syntax(text)
    if newer is not None:
        raise UnsupportedError(*newer)
    return Expr(text, _compile(tree))


def metric_names(expr: Expr) -> tuple[frozenset[str], bool]:
    """The metric names ``expr`` selects, and whether some selector has no fixed name
    (``{job="a"}``, ``{__name__=~"x.*"}``), which means any name may be needed."""
    names: set[str] = set()
    unnamed = False
    stack: list[Node] = [expr.root]
    while stack:
        node = stack.pop()
        if isinstance(node, MatrixSel):
            node = node.sel
        if isinstance(node, VectorSel):
            fixed = [m.value for m in node.matchers if m.name == METRIC_NAME and m.op == "="]
            if fixed:
                names.update(fixed)
            else:
                unnamed = True
        elif isinstance(node, Subquery | Unary):
            stack.append(node.expr)
        elif isinstance(node, Binary):
            stack += [node.lhs, node.rhs]
        elif isinstance(node, Aggregate):
            stack.append(node.expr)
            if node.param is not None:
                stack.append(node.param)
        elif isinstance(node, Call):
            stack.extend(node.args)
    return frozenset(names), unnamed


def _ms(delta: timedelta | None) -> int:
    return 0 if delta is None else delta // _MS


def _at(node: Any) -> At | None:
    at = node.at
    if at is None:
        return None
    kind = str(at.type)
    if kind.endswith("Start"):
        return At("start")
    if kind.endswith("End"):
        return At("end")
    try:
        when = at.at
    except BaseException as exc:  # pyo3 raises PanicException (a BaseException) here
        if type(exc).__name__ != "PanicException":
            raise
        raise UnsupportedError("@ modifier with a negative timestamp", "the parser cannot represent it") from None
    return At("at", (when - _EPOCH) // _MS)


def _selector(node: Any) -> VectorSel:
    if node.matchers.or_matchers:
        raise UnsupportedError("'or' between label matchers", "Prometheus 3.x syntax")
    raw: list[tuple[str, str, str]] = []
    if node.name is not None:
        raw.append((METRIC_NAME, "=", node.name))
    raw += [(m.name, _MATCH_OPS[str(m.op)], m.value) for m in node.matchers.matchers]
    try:
        matchers = tuple(SeriesMatcher(n, op, v) for n, op, v in raw)
    except StoreError as exc:
        raise PromQLError(str(exc)) from exc
    return VectorSel(node.name, matchers, _ms(node.offset), _at(node), tuple(raw))


def _compile(node: Any) -> Node:
    if isinstance(node, pp.ParenExpr):
        return _compile(node.expr)
    if isinstance(node, pp.NumberLiteral):
        return NumberLit(float(node.val))
    if isinstance(node, pp.StringLiteral):
        return StringLit(str(node.val))
    if isinstance(node, pp.VectorSelector):
        return _selector(node)
    if isinstance(node, pp.MatrixSelector):
        return MatrixSel(_selector(node.vector_selector), _ms(node.range))
    if isinstance(node, pp.SubqueryExpr):
        step = _ms(node.step) if node.step is not None else None
        return Subquery(_compile(node.expr), _ms(node.range), step or None, _ms(node.offset), _at(node))
    if isinstance(node, pp.UnaryExpr):
        inner = _compile(node.expr)
        return NumberLit(-inner.value) if isinstance(inner, NumberLit) else Unary(inner)
    if isinstance(node, pp.BinaryExpr):
        return _binary(node)
    if isinstance(node, pp.AggregateExpr):
        op = str(node.op)
        if op not in _AGGREGATIONS:
            raise UnsupportedError(f"aggregation {op}", "not in Prometheus 2.42")
        mod = node.modifier
        without = mod is not None and str(mod.type).endswith("Without")
        grouping = tuple(mod.labels) if mod is not None else ()
        param = _compile(node.param) if node.param is not None else None
        return Aggregate(op, _compile(node.expr), param, without, grouping)
    if isinstance(node, pp.Call):
        name = node.func.name
        if name in _NATIVE_HISTOGRAM_FUNCTIONS:
            raise UnsupportedError(f"function {name}", "native histograms are outside the subset")
        if name not in ENGINE_FUNCTIONS:
            raise UnsupportedError(f"function {name}", "not implemented by the agent's engine")
        args = tuple(_compile(a) for a in node.args)
        return Call(name, args, _VALUE_TYPES[str(node.func.return_type)])
    raise UnsupportedError(type(node).__name__)


def _binary(node: Any) -> Binary:
    op = str(node.op)
    lhs, rhs = _compile(node.lhs), _compile(node.rhs)
    mod = node.modifier
    card, on, labels, include, return_bool = "one-to-one", False, (), (), False
    if mod is not None:
        fill = mod.fill_values
        if fill is not None and (fill.lhs is not None or fill.rhs is not None):
            raise UnsupportedError("fill modifier", "Prometheus 3.x syntax")
        card = _CARDS[str(mod.card)]
        if mod.matching is not None:
            on = str(mod.matching.type).endswith("Include")
            labels = tuple(mod.matching.labels)
        include = tuple(mod.group_labels or ())
        return_bool = bool(mod.return_bool)
    if op in _SET_OPS:
        card = "many-to-many"
    return Binary(op, lhs, rhs, card, on, labels, include, return_bool)
