"""Rewrite a PromQL expression for a multi-cluster setup, the monitoring-mixin way.

Mixins (kubernetes-mixin, node-mixin) take two parameters so one set of rules serves many
clusters in one TSDB: a selector added to every series selector (``cluster="a"``) and labels
added to every aggregation and every ``on(...)`` (``cluster``, ``namespace``), so series of
different clusters are never summed or matched together. :func:`rewrite` applies both to one
expression and prints it back as PromQL; ``sre-agent rules export`` and the agent's
``rules.selector`` / ``rules.by`` use it, so the agent and the server run the same text.

The printer walks promql-parser's syntax tree. Parentheses are nodes of that tree, so printing
the tree as it is keeps its precedence; a test checks that every bundled rule prints back to
the tree the parser built (compared through the parser's own printer).

* an aggregation with ``by (...)`` gains the labels; one without a grouping gets
  ``by (labels)``; ``without (...)`` keeps them already and is left alone;
* ``on (...)`` gains the labels (``ignoring`` keeps them already);
* every vector selector gains the matchers, unless it already has a matcher on that label.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

import promql_parser as pp

from agent.config.types import format_duration
from agent.errors import PromQLError

__all__ = ["parse_selector", "print_expr", "rewrite"]

_MATCH_OPS = {"MatchOp.Equal": "=", "MatchOp.NotEqual": "!=", "MatchOp.Re": "=~", "MatchOp.NotRe": "!~"}

Matcher = tuple[str, str, str]  # (label, op, value)


def parse_selector(text: str) -> list[Matcher]:
    """``cluster="a", env=~"prod|staging"`` (braces optional) as matchers; PromQLError if invalid."""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    try:  # under a metric name: a selector alone must have a matcher that rejects "" (cluster!="b" has none)
        node = pp.parse("selector{" + body + "}")
    except ValueError as exc:
        raise PromQLError(f"not a label selector: {text!r}: {exc}") from exc
    if not isinstance(node, pp.VectorSelector) or node.matchers.or_matchers:
        raise PromQLError(f"not a label selector: {text!r} (expected label matchers like cluster=\"a\")")
    return [(m.name, _MATCH_OPS[str(m.op)], m.value) for m in node.matchers.matchers]


def rewrite(text: str, *, selector: list[Matcher] | None = None, by: list[str] | None = None) -> str:
    """``text`` with ``selector`` on every series selector and ``by`` labels kept apart."""
    try:
        tree = pp.parse(text)
    except ValueError as exc:
        raise PromQLError(f"cannot parse {text!r}: {exc}") from exc
    return _Printer(selector or [], by or []).expr(tree)


def print_expr(text: str) -> str:
    """``text`` printed back from its syntax tree, unchanged in meaning (the no-parameter rewrite)."""
    return rewrite(text)


def _duration(d: timedelta | None) -> str:
    seconds = d.total_seconds() if d is not None else 0.0
    return ("-" + format_duration(-seconds)) if seconds < 0 else format_duration(seconds)


def _number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


def _string(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # PromQL's double-quoted strings take JSON's escapes


def _labels(names: list[str]) -> str:
    return "(" + ", ".join(names) + ")"


class _Printer:
    def __init__(self, selector: list[Matcher], by: list[str]) -> None:
        self.selector = selector
        self.by = by

    def expr(self, n: Any) -> str:
        if isinstance(n, pp.ParenExpr):
            return f"({self.expr(n.expr)})"
        if isinstance(n, pp.NumberLiteral):
            return _number(float(n.val))
        if isinstance(n, pp.StringLiteral):
            return _string(str(n.val))
        if isinstance(n, pp.VectorSelector):
            return self._selector(n)
        if isinstance(n, pp.MatrixSelector):
            return self._selector(n.vector_selector, range_=f"[{_duration(n.range)}]")
        if isinstance(n, pp.SubqueryExpr):
            step = _duration(n.step) if n.step is not None else ""
            return f"{self.expr(n.expr)}[{_duration(n.range)}:{step}]" + self._at_offset(n)
        if isinstance(n, pp.UnaryExpr):
            return f"-{self.expr(n.expr)}"
        if isinstance(n, pp.BinaryExpr):
            return self._binary(n)
        if isinstance(n, pp.AggregateExpr):
            return self._aggregate(n)
        if isinstance(n, pp.Call):
            return f"{n.func.name}(" + ", ".join(self.expr(a) for a in n.args) + ")"
        raise PromQLError(f"cannot print a {type(n).__name__}")

    def _selector(self, v: Any, *, range_: str = "") -> str:
        if v.matchers.or_matchers:
            raise PromQLError("'or' between label matchers is Prometheus 3.x syntax")
        matchers = [(m.name, _MATCH_OPS[str(m.op)], m.value) for m in v.matchers.matchers]
        have = {name for name, _, _ in matchers}
        matchers += [m for m in self.selector if m[0] not in have]
        inner = ", ".join(f"{name}{op}{_string(value)}" for name, op, value in matchers)
        text = (v.name or "") + (f"{{{inner}}}" if inner or not v.name else "")
        return text + range_ + self._at_offset(v)

    @staticmethod
    def _at_offset(n: Any) -> str:
        out = ""
        if n.at is not None:
            kind = str(n.at.type)
            if kind.endswith("Start"):
                out += " @ start()"
            elif kind.endswith("End"):
                out += " @ end()"
            else:
                out += f" @ {n.at.at.timestamp():.3f}"
        if n.offset is not None and n.offset != timedelta(0):
            out += f" offset {_duration(n.offset)}"
        return out

    def _binary(self, n: Any) -> str:
        op, mod, parts = str(n.op), n.modifier, []
        if mod is not None:
            if mod.return_bool:
                parts.append("bool")
            if mod.matching is not None:
                labels = list(mod.matching.labels)
                if str(mod.matching.type).endswith("Include"):
                    parts.append("on " + _labels(labels + [b for b in self.by if b not in labels]))
                else:
                    parts.append("ignoring " + _labels(labels))
            card = str(mod.card)
            if card.endswith("ManyToOne"):
                parts.append("group_left " + _labels(list(mod.group_labels or [])))
            elif card.endswith("OneToMany"):
                parts.append("group_right " + _labels(list(mod.group_labels or [])))
        middle = " ".join([op, *parts])
        return f"{self.expr(n.lhs)} {middle} {self.expr(n.rhs)}"

    def _aggregate(self, n: Any) -> str:
        mod, grouping = n.modifier, ""
        if mod is not None and str(mod.type).endswith("Without"):
            grouping = " without " + _labels(list(mod.labels))
        else:
            labels = list(mod.labels) if mod is not None else []
            labels += [b for b in self.by if b not in labels]
            if labels or mod is not None:
                grouping = " by " + _labels(labels)
        args = ([self.expr(n.param)] if n.param is not None else []) + [self.expr(n.expr)]
        return f"{n.op}{grouping} (" + ", ".join(args) + ")"
