"""Thresholds read from the bundled rule files, so a dashboard's lines are the alerts' numbers.

Each alert's expression is parsed with promql-parser and its comparisons are collected:
``x > 0.95`` gives the value 0.95 for the metric ``x``; ``x > on (...) 2 * y`` gives the
factor 2. A threshold is looked up by alert name and the metric on the left of the
comparison, so an alert with two comparisons (``kv < 0.8 and waiting > 0``) still names
one number. A missing alert or an ambiguous lookup is an error at generation time, never
a silently stale line.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import promql_parser as pp
import yaml

__all__ = ["RULES_DIR", "Comparison", "comparisons", "factor", "threshold"]

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
_COMPARISONS = frozenset({">", ">=", "<", "<="})


@dataclass(frozen=True, slots=True)
class Comparison:
    """One ``lhs <op> number`` or ``lhs <op> number * rhs`` comparison of an alert."""

    names: frozenset[str]  # metric names the left-hand side selects
    op: str
    value: float
    is_factor: bool  # True for ``lhs > N * rhs``


def _names(node: object) -> set[str]:
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, pp.VectorSelector):
            if n.name:
                out.add(n.name)
        elif isinstance(n, pp.MatrixSelector):
            stack.append(n.vector_selector)
        elif isinstance(n, pp.BinaryExpr):
            stack += [n.lhs, n.rhs]
        elif isinstance(n, pp.AggregateExpr | pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
            stack.append(n.expr)
        elif isinstance(n, pp.Call):
            stack.extend(n.args)
    return out


def _walk(node: object, out: list[Comparison]) -> None:
    if isinstance(node, pp.BinaryExpr):
        op = str(node.op)
        if op in _COMPARISONS:
            rhs = node.rhs
            if isinstance(rhs, pp.NumberLiteral):
                out.append(Comparison(frozenset(_names(node.lhs)), op, float(rhs.val), False))
            elif (isinstance(rhs, pp.BinaryExpr) and str(rhs.op) == "*"
                  and isinstance(rhs.lhs, pp.NumberLiteral)):  # fmt: skip
                out.append(Comparison(frozenset(_names(node.lhs)), op, float(rhs.lhs.val), True))
        _walk(node.lhs, out)
        _walk(node.rhs, out)
    elif isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.AggregateExpr | pp.SubqueryExpr):
        _walk(node.expr, out)
    elif isinstance(node, pp.Call):
        for arg in node.args:
            _walk(arg, out)


@cache
def _alerts(rules_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for path in sorted(rules_dir.glob("*.rules.yaml")):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        for group in doc["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    out[rule["alert"]] = rule["expr"]
    return out


def comparisons(alert: str, rules_dir: Path = RULES_DIR) -> list[Comparison]:
    """Every numeric comparison in ``alert``'s expression, outermost first."""
    exprs = _alerts(rules_dir)
    if alert not in exprs:
        raise KeyError(f"no alert {alert!r} in {rules_dir}")
    out: list[Comparison] = []
    _walk(pp.parse(exprs[alert]), out)
    return out


def _one(alert: str, metric: str, is_factor: bool, rules_dir: Path) -> float:
    found = {c.value for c in comparisons(alert, rules_dir) if c.is_factor is is_factor and metric in c.names}
    if len(found) != 1:
        kind = "factor" if is_factor else "threshold"
        raise ValueError(f"{alert}: expected one {kind} on {metric}, found {sorted(found)}")
    return found.pop()


def threshold(alert: str, metric: str, rules_dir: Path = RULES_DIR) -> float:
    """The number ``metric`` is compared with in ``alert`` (``metric > 0.95`` gives 0.95)."""
    return _one(alert, metric, False, rules_dir)


def factor(alert: str, metric: str, rules_dir: Path = RULES_DIR) -> float:
    """The factor in ``metric > N * other`` in ``alert`` (the scale-out rule's 2)."""
    return _one(alert, metric, True, rules_dir)
