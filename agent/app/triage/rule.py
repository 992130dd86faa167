"""The alert's rule as the report shows it: its expression, its ``for`` and its threshold.

The threshold is read from the expression, the way a person reads it: the top-level comparison
(of the first operand of ``and``/``or``/``unless``, which is the condition the others only
qualify) splits into the *value* side, the series that crossed, and the *threshold* side: a
number (``> 0.95``, drawn as a line) or an expression (``> on (job) 2 * running``, drawn as a
second series). A rule without a comparison (``absent(...)``, ``vector(1)``) has neither, and the
report plots the expression itself.

The sides are queried for the incident's own series: :func:`scoped` adds the alert's identifying
labels (those a series selector can carry: ``job``, ``instance``, ``model_name``, ``gpu``, ...) to
every selector, with :func:`agent.promql.rewrite.rewrite`, so a fleet of a thousand replicas
answers one or two series, not a thousand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import promql_parser as pp

from agent.errors import PromQLError
from agent.promql.rewrite import Matcher, rewrite
from agent.rules.files import GroupSpec

__all__ = ["SCOPE_LABELS", "RuleInfo", "find_rule", "scoped"]

#: Alert labels that come from the series and identify them (rule labels such as severity do not).
SCOPE_LABELS = ("job", "instance", "model_name", "model", "gpu", "Hostname", "hostname", "UUID", "namespace",
                "pod", "service", "cluster")
_COMPARISONS = {">": "<", "<": ">", ">=": "<=", "<=": ">=", "==": "==", "!=": "!="}
_SET_OPS = frozenset({"and", "or", "unless"})


@dataclass(frozen=True)
class RuleInfo:
    """One alerting rule of the loaded rule files, with its comparison split (see the module docstring)."""

    name: str
    group: str
    file: str
    expr: str
    for_s: float
    keep_firing_for_s: float
    value_expr: str  # the side that crossed; the whole expression when there is no comparison
    op: str | None = None  # the comparison, written as "value op threshold"
    threshold: float | None = None
    threshold_expr: str | None = None
    annotations: Mapping[str, str] | None = None

    @property
    def condition(self) -> str:
        """``> 0.95`` or ``> 2 * job_model:...`` or "" when the rule compares nothing."""
        if self.op is None:
            return ""
        right = f"{self.threshold:g}" if self.threshold is not None else (self.threshold_expr or "")
        return f"{self.op} {right}"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "group": self.group, "file": self.file, "expr": self.expr, "for_s": self.for_s,
                "keep_firing_for_s": self.keep_firing_for_s, "value_expr": self.value_expr, "op": self.op,
                "threshold": self.threshold, "threshold_expr": self.threshold_expr, "condition": self.condition}


def find_rule(groups: Iterable[GroupSpec], alertname: str, group: str = "") -> RuleInfo | None:
    """The alerting rule named ``alertname`` (in ``group`` if given and found there), None if none is loaded."""
    candidates = [(g, r) for g in groups for r in g.rules if r.kind == "alert" and r.name == alertname]
    if not candidates:
        return None
    g, r = next(((g, r) for g, r in candidates if g.name == group), candidates[0])
    value, op, threshold, threshold_expr = _split(r.expr_text)
    return RuleInfo(r.name, g.name, g.file, r.expr_text.strip(), r.for_s, r.keep_firing_for_s, value, op,
                    threshold, threshold_expr, dict(r.annotations))


def _split(text: str) -> tuple[str, str | None, float | None, str | None]:
    try:
        node: Any = pp.parse(text)
    except ValueError:
        return text.strip(), None, None, None
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    while isinstance(node, pp.BinaryExpr) and str(node.op) in _SET_OPS:
        node = node.lhs
        while isinstance(node, pp.ParenExpr):
            node = node.expr
    if not isinstance(node, pp.BinaryExpr) or str(node.op) not in _COMPARISONS:
        return text.strip(), None, None, None
    op = str(node.op)
    lhs, rhs = _bare(node.lhs), _bare(node.rhs)
    if isinstance(lhs, pp.NumberLiteral) and not isinstance(rhs, pp.NumberLiteral):  # 0.95 < x: x > 0.95
        lhs, rhs, op = rhs, lhs, _COMPARISONS[op]
    if isinstance(rhs, pp.NumberLiteral):
        return rewrite(str(lhs)), op, float(rhs.val), None
    return rewrite(str(lhs)), op, None, rewrite(str(rhs))


def _bare(node: Any) -> Any:
    while isinstance(node, pp.ParenExpr):
        node = node.expr
    return node


def scoped(expr: str, labels: Mapping[str, str], names: Iterable[str] = SCOPE_LABELS) -> str:
    """``expr`` with ``name="value"`` on every selector for each of ``names`` the alert carries."""
    matchers: list[Matcher] = [(k, "=", labels[k]) for k in names if labels.get(k)]
    try:
        return rewrite(expr, selector=matchers)
    except PromQLError:
        return expr
