"""What the rule manager (:mod:`agent.rules.manager`) keeps per group, rule and alert: the state
machine's data, apart from the code that moves it, so the act and app layers, the API and the
state database read alerts without the evaluation's machinery.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from agent.gocompat.fmt import format_float
from agent.rules.files import GroupSpec, RuleSpec
from agent.series import Labels, iso_ms
from agent.store import RoundWriter

__all__ = ["Alert", "AlertEvent", "AlertState", "Group", "RuleState"]


class AlertState(StrEnum):
    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"


@dataclass
class Alert:
    """One alert of one alerting rule, identified by its labels (``alertname`` included)."""

    labels: Labels
    annotations: dict[str, str]
    value: float
    state: AlertState
    active_at_ms: int
    fired_at_ms: int = 0
    resolved_at_ms: int = 0
    keep_firing_since_ms: int = 0

    def as_json(self) -> dict[str, Any]:
        """Shaped like an alert in Prometheus' ``/api/v1/alerts``; ``value`` is Go's ``FormatFloat(v, 'e', -1, 64)``
        (``2e+01``), as Prometheus 2.42's API writes it there and in ``/api/v1/rules``."""
        return {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "state": self.state.value,
            "activeAt": iso_ms(self.active_at_ms),
            "value": format_float(self.value, "e"),
        }


@dataclass(frozen=True)
class AlertEvent:
    """A state transition: ``kind`` is ``pending``, ``firing`` or ``resolved``."""

    kind: str
    group: str
    rule: str
    alert: Alert
    at_ms: int


@dataclass
class RuleState:
    """A rule with its runtime state (health, last error, alerts)."""

    spec: RuleSpec
    writer: RoundWriter
    health: str = "unknown"
    last_error: str = ""
    last_eval_ms: int = 0
    eval_seconds: float = 0.0
    alerts: dict[Labels, Alert] = field(default_factory=dict)
    restored: bool = False  # state came back from the state database: no restore from a remote server


@dataclass
class Group:
    spec: GroupSpec
    interval_s: float
    rules: list[RuleState]
    last_eval_ms: int = 0
    eval_seconds: float = 0.0
    failures: int = 0  # rule evaluations that failed, for sre_agent_rule_evaluation_failures_total
