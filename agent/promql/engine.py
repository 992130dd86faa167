"""The evaluator: walks a parsed :class:`Expr` over the :class:`~agent.store.Store`.

Evaluation is instant-at-a-time: every node is evaluated at one timestamp. A range
query is a loop of instant evaluations, a subquery evaluates its inner expression at
each of its step-aligned timestamps. That is how Prometheus defines the results, it
keeps ``@``, ``offset`` and subqueries simple, and the hot path (a rule evaluated
once per interval) is exactly one pass.

What keeps it fast enough for rule evaluation over a large fleet:

* each selector's series set is matched once and kept, with its label sets less
  ``__name__``; when the store creates or drops series only the new ones are matched
  (:mod:`.selectors`);
* samples are read from the store's typed arrays with ``bisect``; a range function
  gets the window as array slices (C copies, no per-sample Python object), and stale
  markers are filtered only when a window holds a NaN at all; ``rate``/``increase``/
  ``delta`` over a selector read only each window's ends where the selection has
  already checked its samples for NaNs and counter resets;
* operators memoise what they derive from label sets (group keys, match signatures,
  histogram bucket keys) across evaluations, in tables the engine owns and bounds
  (:class:`~agent.promql.values.Memos`);
* instant vectors are lists of ``(labels, value)`` tuples; public :class:`Sample`
  objects are built once, at the end.

Prometheus 2.42 semantics: an instant selector returns the newest sample at most
``lookback`` (5 m) old, nothing if that sample is a staleness marker; a range selector
``[r]`` takes samples in ``[t - r, t]`` (both ends inclusive in 2.42), dropping stale
markers; ``offset`` shifts both back, ``@`` pins the time; a subquery
``expr[r:s]`` evaluates ``expr`` at every multiple of ``s`` in ``[t - r, t]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from agent.errors import PromQLError
from agent.promql import selectors
from agent.promql.aggregations import aggregate
from agent.promql.functions import FUNCTIONS, absent_labels
from agent.promql.matching import scalar_binop, vector_binop, vector_scalar_binop
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
from agent.promql.rangefuncs import RANGE_FUNCTIONS, Frame, RangeFunction, extrapolated
from agent.promql.selectors import SelectionCache, Window
from agent.promql.syntax import parse
from agent.promql.values import (
    MEMO_LIMIT,
    Matrix,
    MatrixSeries,
    Memos,
    Sample,
    Scalar,
    String,
    Value,
    Vec,
    check_unique,
    drop_names,
)
from agent.series import Labels
from agent.store import Store

__all__ = ["Engine"]

_PARSE_CACHE_SIZE = 1024


class Engine:
    """Evaluates PromQL over a :class:`Store`.

    ``lookback_ms`` is Prometheus' ``--query.lookback-delta``; ``subquery_step_ms`` is
    the step of a subquery written without one (``x[1h:]``), which Prometheus takes
    from the global evaluation interval (1 m by default). ``memo_limit`` bounds the
    entries of the engine's memo tables together (:class:`~agent.promql.values.Memos`).
    """

    def __init__(
        self, store: Store, *, lookback_ms: int = 300_000, subquery_step_ms: int = 60_000, memo_limit: int = MEMO_LIMIT
    ) -> None:
        if lookback_ms <= 0 or subquery_step_ms <= 0:
            raise PromQLError("lookback and subquery step must be positive")
        self.store = store
        self.lookback_ms = lookback_ms
        self.subquery_step_ms = subquery_step_ms
        #: Each selector's matched series and per-series state, kept across evaluations.
        self.selections = SelectionCache(store)
        #: What operators derive from label sets, kept across evaluations, bounded.
        self.memos = Memos(memo_limit)
        self._parsed: dict[str, Expr] = {}

    def _expr(self, expr: Expr | str) -> Expr:
        if isinstance(expr, Expr):
            return expr
        parsed = self._parsed.get(expr)
        if parsed is None:
            parsed = parse(expr)
            if len(self._parsed) >= _PARSE_CACHE_SIZE:
                self._parsed.clear()
            self._parsed[expr] = parsed
        return parsed

    def instant(self, expr: Expr | str, at_ms: int) -> Value:
        """Evaluate at one time: a Vector, a Scalar, a String, or (for a range
        selector or subquery at the top) a Matrix."""
        e = self._expr(expr)
        raw = _Evaluation(self, at_ms, at_ms).eval(e.root, at_ms)
        kind = e.root.type
        if kind == "vector":
            return [Sample(labels, v) for labels, v in raw]
        if kind == "scalar":
            return Scalar(raw)
        if kind == "string":
            return String(raw)
        windows: list[Window] = raw[0]
        return [MatrixSeries(labels, list(ts), list(vs)) for labels, ts, vs in windows]

    def range(self, expr: Expr | str, start_ms: int, end_ms: int, step_ms: int) -> Matrix:
        """Evaluate at ``start_ms``, ``start_ms + step_ms``, ... up to ``end_ms``; one
        series per label set, sorted by labels (scalars give one unlabelled series)."""
        e = self._expr(expr)
        if e.type not in ("vector", "scalar"):
            kind = "range vector" if e.type == "matrix" else e.type
            raise PromQLError(f'invalid expression type "{kind}" for range query, must be Scalar or instant Vector')
        if step_ms <= 0:
            raise PromQLError("zero or negative query resolution step widths are not accepted")
        if end_ms < start_ms:
            raise PromQLError("end timestamp must not be before start time")
        series = _Evaluation(self, start_ms, end_ms).series(e.root, range(start_ms, end_ms + 1, step_ms))
        return [MatrixSeries(labels, ts, vs) for labels, (ts, vs) in sorted(series.items())]


class _Evaluation:
    """State of one query: the query's start/end (for ``@ start()``/``end()``), and the
    engine's selections and memos, which the operators are handed."""

    def __init__(self, engine: Engine, start_ms: int, end_ms: int) -> None:
        self.lookback = engine.lookback_ms
        self.sub_step = engine.subquery_step_ms
        self.start = start_ms
        self.end = end_ms
        self._selections = engine.selections
        self._memos = engine.memos
        self._dispatch: dict[type[Node], Callable[[Any, int], Any]] = {
            NumberLit: lambda n, t: n.value,
            StringLit: lambda n, t: n.value,
            VectorSel: self._vector,
            MatrixSel: self._windows,
            Subquery: self._subquery,
            Unary: self._unary,
            Binary: self._binary,
            Aggregate: self._aggregate,
            Call: self._call,
        }

    def eval(self, node: Node, ts: int) -> Any:
        return self._dispatch[type(node)](node, ts)

    def series(self, node: Node, times: Iterable[int]) -> dict[Labels, tuple[list[int], list[float]]]:
        """``node`` (a vector or scalar) evaluated at each of ``times``: each label set's
        timestamps and values, label sets in order of first appearance (a scalar is the
        one unlabelled series)."""
        acc: dict[Labels, tuple[list[int], list[float]]] = {}
        scalar = node.type == "scalar"
        for t in times:
            raw = self.eval(node, t)
            for labels, v in [((), raw)] if scalar else raw:
                points = acc.get(labels)
                if points is None:
                    points = acc[labels] = ([], [])
                points[0].append(t)
                points[1].append(v)
        return acc

    # -- selectors --------------------------------------------------------------
    def _ref(self, at: At | None, ts: int) -> int:
        if at is None:
            return ts
        if at.kind == "at":
            return at.ms
        return self.start if at.kind == "start" else self.end

    def _vector(self, sel: VectorSel, ts: int, *, sample_times: bool = False) -> Vec:
        ref = self._ref(sel.at, ts) - sel.offset_ms
        return selectors.instant(self._selections.get(sel), ref, self.lookback, sample_times)

    def _bounds(self, node: MatrixSel, ts: int) -> tuple[int, int]:
        maxt = self._ref(node.sel.at, ts) - node.sel.offset_ms
        return maxt - node.range_ms, maxt

    def _windows(self, node: MatrixSel, ts: int) -> tuple[list[Window], int, int]:
        mint, maxt = self._bounds(node, ts)
        return selectors.windows(self._selections.get(node.sel), mint, maxt), mint, maxt

    def _subquery(self, node: Subquery, ts: int) -> tuple[list[Window], int, int]:
        end = self._ref(node.at, ts) - node.offset_ms
        step = node.step_ms or self.sub_step
        mint = end - node.range_ms
        first = -(-mint // step) * step  # the first multiple of the step >= mint
        series = self.series(node.expr, range(first, end + 1, step))
        return [(labels, ts, vs) for labels, (ts, vs) in series.items()], mint, end

    def _range_input(self, node: Node, ts: int) -> tuple[list[Window], int, int]:
        if isinstance(node, MatrixSel):
            return self._windows(node, ts)
        if isinstance(node, Subquery):
            return self._subquery(node, ts)
        raise PromQLError(f"expected a range vector, got {node.type}")

    # -- operators ----------------------------------------------------------------
    def _unary(self, node: Unary, ts: int) -> Any:
        value = self.eval(node.expr, ts)
        if node.type == "scalar":
            return -value
        return drop_names((labels, -v) for labels, v in value)

    def _binary(self, node: Binary, ts: int) -> Any:
        lhs = self.eval(node.lhs, ts)
        rhs = self.eval(node.rhs, ts)
        left_scalar = node.lhs.type == "scalar"
        right_scalar = node.rhs.type == "scalar"
        if left_scalar and right_scalar:
            return scalar_binop(node.op, lhs, rhs)
        if left_scalar:
            return vector_scalar_binop(node.op, rhs, lhs, True, node.return_bool)
        if right_scalar:
            return vector_scalar_binop(node.op, lhs, rhs, False, node.return_bool)
        return vector_binop(node, lhs, rhs, self._memos)

    def _aggregate(self, node: Aggregate, ts: int) -> Vec:
        param = self.eval(node.param, ts) if node.param is not None else None
        return aggregate(node, self.eval(node.expr, ts), param, self._memos)

    def _call(self, node: Call, ts: int) -> Any:
        name = node.func
        spec = RANGE_FUNCTIONS.get(name)
        if spec is not None:
            return self._call_range(node, spec, ts)
        if name == "timestamp":
            arg = node.args[0]
            if isinstance(arg, VectorSel):
                return drop_names(self._vector(arg, ts, sample_times=True))
            return drop_names((labels, ts / 1000) for labels, _ in self.eval(arg, ts))
        if name == "absent":
            arg = node.args[0]
            if self.eval(arg, ts):
                return []
            return [(absent_labels(arg if isinstance(arg, VectorSel) else None), 1.0)]
        if name == "absent_over_time":
            arg = node.args[0]
            if self._range_input(arg, ts)[0]:
                return []
            return [(absent_labels(arg.sel if isinstance(arg, MatrixSel) else None), 1.0)]
        return FUNCTIONS[name]([self.eval(a, ts) for a in node.args], ts, self._memos)

    def _call_range(self, node: Call, spec: RangeFunction, ts: int) -> Vec:
        param = math.nan
        for i, arg in enumerate(node.args):
            if i != spec.matrix_arg:
                param = self.eval(arg, ts)
        arg = node.args[spec.matrix_arg]
        if isinstance(arg, MatrixSel) and not spec.keep_name:
            # Over a selector the cached name-less label sets replace drop_names().
            sel = self._selections.get(arg.sel)
            mint, maxt = self._bounds(arg, ts)
            if spec.extrapolation is not None:
                counter, per_second = spec.extrapolation
                out = extrapolated(selectors.extents(sel, mint, maxt, counter), mint, maxt, counter, per_second)
            else:
                out = self._apply(spec, selectors.windows(sel, mint, maxt, sel.unnamed), Frame(mint, maxt, ts, param))
            return check_unique(out) if sel.mixed and len(out) > 1 else out
        windows, mint, maxt = self._range_input(arg, ts)
        out = self._apply(spec, windows, Frame(mint, maxt, ts, param))
        return out if spec.keep_name else drop_names(out)

    @staticmethod
    def _apply(spec: RangeFunction, windows: list[Window], frame: Frame) -> Vec:
        fn = spec.fn
        out: Vec = []
        for labels, times, vs in windows:
            v = fn(times, vs, frame)
            if v is not None:
                out.append((labels, v))
        return out
