"""Rule evaluation with Prometheus' semantics: recording rules and the alert state machine.

Each evaluation of a group runs its rules in order at one timestamp. A recording
rule's result is written to the store at that timestamp, so later rules of the same
evaluation read it; series it produced last time and not now get staleness markers.
An alerting rule follows Prometheus 2.42 (``rules/alerting.go``) exactly:

* a new result element starts an alert in ``pending`` with ``activeAt`` = now; it
  turns ``firing`` once ``now - activeAt >= for`` (with ``for: 0`` in the same
  evaluation);
* an element that disappears resolves the alert (``inactive``, ``resolvedAt`` = now) —
  a pending one is forgotten at once; with ``keep_firing_for`` a firing alert stays
  firing until the condition has been absent that long;
* resolved alerts are kept 15 minutes so receivers keep hearing they resolved;
* ``ALERTS{alertname, alertstate, ...}`` = 1 and ``ALERTS_FOR_STATE{...}`` = activeAt
  (Unix seconds) are written for every pending and firing alert.

Every transition is returned as an :class:`AlertEvent` for the act layer. A rule whose
evaluation fails keeps its alerts as they were and reports ``health: err`` with the
error, like Prometheus.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, cast

import structlog

from agent.errors import AgentError, PromQLError, RuleError, TemplateError
from agent.gocompat.fmt import format_float
from agent.promql import Engine, Scalar, Vector
from agent.rules.files import GroupSpec
from agent.rules.restore import earliest_active_at
from agent.rules.state import Alert, AlertEvent, AlertState, Group, RuleState
from agent.rules.template import Template
from agent.series import METRIC_NAME, Labels, iso_ms, labels_from
from agent.store import RoundWriter, Store

__all__ = ["Alert", "AlertEvent", "AlertState", "Group", "RemoteQuery", "Result", "RuleManager", "RuleState",
           "rule_group_label"]

log = structlog.get_logger(__name__)

RESOLVED_RETENTION_MS = 15 * 60_000  # Prometheus' resolvedRetention

Result = list[tuple[Labels, float]]  # one rule's instant result: (labels, value) per element
# A remote instant query: (PromQL text, evaluation time in Unix ms) -> the result, or PromQLError
RemoteQuery = Callable[[str, int], Awaitable[Result]]


class RuleManager:
    """Evaluates loaded rule groups over the store."""

    def __init__(
        self,
        groups: Iterable[GroupSpec],
        store: Store,
        engine: Engine,
        *,
        default_interval_s: float = 15.0,
        external_labels: Mapping[str, str] | None = None,
        external_url: str = "",
    ) -> None:
        self.engine = engine
        self.external_labels = dict(external_labels or {})
        self.external_url = external_url
        self.groups = [
            Group(g, g.interval_s or default_interval_s,
                  [RuleState(r, writer=RoundWriter(store, keep_filter=False)) for r in g.rules])
            for g in groups
        ]

    #: What :meth:`observe_writes` calls a rule's writes: a recording rule's results, or an alerting rule's
    #: ``ALERTS`` and ``ALERTS_FOR_STATE``.
    WRITE_KINDS = ("recording", "alerts")

    def observe_writes(self, observer: Callable[[str, list[tuple[Labels, float, int]]], None] | None) -> None:
        """Have ``observer(kind, samples)`` told what each rule writes to the store (staleness markers too),
        ``kind`` being ``"recording"`` or ``"alerts"``; remote write feeds on it. None stops it."""
        for g in self.groups:
            for r in g.rules:
                kind = "recording" if r.spec.kind == "record" else "alerts"
                r.writer.observer = None if observer is None else functools.partial(observer, kind)

    # -- evaluation ------------------------------------------------------------------
    def eval_group(self, group: Group, at_ms: int) -> list[AlertEvent]:
        """Evaluate ``group`` at ``at_ms`` over the local store (the embedded engine)."""
        t0 = time.perf_counter()
        events: list[AlertEvent] = []
        for rule in group.rules:
            r0 = time.perf_counter()
            try:
                result: Result | AgentError = self._query(rule, at_ms)
            except (PromQLError, RuleError) as exc:
                result = exc
            events.extend(self._settle(group, rule, at_ms, result, r0))
        group.last_eval_ms, group.eval_seconds = at_ms, time.perf_counter() - t0
        return events

    async def eval_group_remote(self, group: Group, at_ms: int, query: RemoteQuery, *,
                                alerts_only: bool = False) -> list[AlertEvent]:
        """Evaluate ``group`` at ``at_ms`` through ``query`` (a remote server's instant-query API).

        The same state machine as :meth:`eval_group`; only where a rule's result comes from
        differs. A query that fails (server down, 5xx, timeout, ``status: error``, a partial
        answer refused) changes none of the rule's alerts: nothing resolves and a ``for``
        timer keeps running, as in Prometheus' ``rules/alerting.go``. ``alerts_only`` skips
        the recording rules (the server evaluates them itself).
        """
        t0 = time.perf_counter()
        events: list[AlertEvent] = []
        for rule in group.rules:
            if alerts_only and rule.spec.kind == "record":
                continue
            r0 = time.perf_counter()
            try:
                _check_type(rule)
                result: Result | AgentError = await query(rule.spec.expr_text, at_ms)
            except (PromQLError, RuleError) as exc:
                result = exc
            events.extend(self._settle(group, rule, at_ms, result, r0))
        group.last_eval_ms, group.eval_seconds = at_ms, time.perf_counter() - t0
        return events

    def eval_all(self, at_ms: int) -> list[AlertEvent]:
        return [e for g in self.groups for e in self.eval_group(g, at_ms)]

    def _settle(self, group: Group, rule: RuleState, at_ms: int, result: Result | AgentError,
                started: float) -> list[AlertEvent]:
        """Apply one rule's result (or its failure) to the rule's state; health, last error and
        the group's failure count follow, like ``prometheus_rule_evaluation_failures_total``."""
        events: list[AlertEvent] = []
        try:
            if isinstance(result, AgentError):
                raise result
            if rule.spec.kind == "record":
                self._record(group, rule, at_ms, result)
            else:
                events = self._alert(group, rule, at_ms, result)
            rule.health, rule.last_error = "ok", ""
        except (PromQLError, RuleError) as exc:
            if rule.last_error != str(exc):
                log.warning("rule evaluation failed", group=group.spec.name, rule=rule.spec.name,
                            query=rule.spec.expr_text, error=str(exc))
            rule.health, rule.last_error = "err", str(exc)
            group.failures += 1
        rule.last_eval_ms, rule.eval_seconds = at_ms, time.perf_counter() - started
        return events

    def _query(self, rule: RuleState, at_ms: int) -> Result:
        _check_type(rule)
        result = self.engine.instant(rule.spec.expr, at_ms)
        if isinstance(result, Scalar):
            return [((), result.value)]
        return [(s.labels, s.value) for s in cast(Vector, result)]  # a vector: the type check above

    def _record(self, group: Group, rule: RuleState, at_ms: int, result: Result) -> None:
        spec = rule.spec
        out: dict[Labels, float] = {}
        for labels, value in result:
            merged = {**dict(labels), **spec.labels}
            key = labels_from(spec.name, merged)
            if key in out:
                raise RuleError("vector contains metrics with the same labelset after applying rule labels")
            out[key] = value
        if group.spec.limit and len(out) > group.spec.limit:
            raise RuleError(f"exceeded limit of {group.spec.limit} with {len(out)} series")
        rule.writer.write(((k, v, at_ms) for k, v in out.items()), at_ms)

    def _alert(self, group: Group, rule: RuleState, at_ms: int, result: Result) -> list[AlertEvent]:
        spec = rule.spec
        seen: dict[Labels, tuple[float, dict[str, str]]] = {}
        for labels, value in result:
            data = dict(labels)
            final = {k: v for k, v in data.items() if k != METRIC_NAME}
            for lname, tmpl in spec.label_templates.items():
                final[lname] = self._render(tmpl, data, value)
            final = {k: v for k, v in final.items() if v != ""}  # Prometheus drops empty labels
            final["alertname"] = spec.name
            key = tuple(sorted(final.items()))
            if key in seen:
                raise RuleError("vector contains metrics with the same labelset after applying alert labels")
            annotations = {k: self._render(t, data, value) for k, t in spec.annotation_templates.items()}
            seen[key] = (value, annotations)
        if group.spec.limit and len(seen) > group.spec.limit:
            raise RuleError(f"exceeded limit of {group.spec.limit} with {len(seen)} alerts")

        events: list[AlertEvent] = []

        def emit(kind: str, alert: Alert) -> None:
            events.append(AlertEvent(kind, group.spec.name, spec.name, replace(alert), at_ms))

        for key, (value, annotations) in seen.items():
            alert = rule.alerts.get(key)
            if alert is not None and alert.state is not AlertState.INACTIVE:
                alert.value, alert.annotations = value, annotations
                continue
            rule.alerts[key] = Alert(key, annotations, value, AlertState.PENDING, at_ms)
        for key in list(rule.alerts):
            alert = rule.alerts[key]
            if key not in seen:
                keep_firing = False
                if alert.state is AlertState.FIRING and spec.keep_firing_for_s > 0:
                    if not alert.keep_firing_since_ms:
                        alert.keep_firing_since_ms = at_ms
                    keep_firing = at_ms - alert.keep_firing_since_ms < spec.keep_firing_for_s * 1000
                if alert.state is AlertState.PENDING or (
                    alert.resolved_at_ms and at_ms - alert.resolved_at_ms > RESOLVED_RETENTION_MS
                ):
                    del rule.alerts[key]
                if alert.state is not AlertState.INACTIVE and not keep_firing:
                    was_firing = alert.state is AlertState.FIRING
                    alert.state, alert.resolved_at_ms = AlertState.INACTIVE, at_ms
                    if was_firing:
                        emit("resolved", alert)
                if not keep_firing:
                    continue
            else:
                alert.keep_firing_since_ms = 0
            if alert.state is AlertState.PENDING and at_ms - alert.active_at_ms >= spec.for_s * 1000:
                alert.state, alert.fired_at_ms = AlertState.FIRING, at_ms
                emit("firing", alert)
            elif alert.state is AlertState.PENDING and alert.active_at_ms == at_ms:
                emit("pending", alert)
        self._write_alert_series(rule, at_ms)
        return events

    def _write_alert_series(self, rule: RuleState, at_ms: int) -> None:
        rows: list[tuple[Labels, float, int]] = []
        for alert in rule.alerts.values():
            if alert.state is AlertState.INACTIVE:
                continue
            base = dict(alert.labels)
            rows.append((labels_from("ALERTS", {**base, "alertstate": alert.state.value}), 1.0, at_ms))
            rows.append((labels_from("ALERTS_FOR_STATE", base), alert.active_at_ms / 1000, at_ms))
        rule.writer.write(rows, at_ms)

    def _render(self, tmpl: Template, labels: dict[str, str], value: float) -> str:
        """Expand a template; a failure becomes the text, as Prometheus does, not a rule error."""
        try:
            return tmpl.render(labels=labels, value=value, external_labels=self.external_labels,
                               external_url=self.external_url)
        except TemplateError as exc:
            return f"<error expanding template: {exc}>"

    # -- persistence (restored on start like Prometheus' ALERTS_FOR_STATE) ----------------
    @staticmethod
    def rule_key(group: Group, index: int) -> str:
        """Identity of an alerting rule across restarts: group, position and name."""
        return f"{group.spec.name}\x1f{index}\x1f{group.rules[index].spec.name}"

    def export_group(self, group: Group) -> dict[str, list[dict[str, Any]]]:
        """Pending, firing and recently resolved alerts of each alerting rule in ``group``."""
        out: dict[str, list[dict[str, Any]]] = {}
        for i, rule in enumerate(group.rules):
            if rule.spec.kind != "alert":
                continue
            out[self.rule_key(group, i)] = [
                {"labels": dict(a.labels), "annotations": a.annotations, "value": _json_float(a.value),
                 "state": a.state.value, "active_at_ms": a.active_at_ms, "fired_at_ms": a.fired_at_ms,
                 "resolved_at_ms": a.resolved_at_ms}
                for a in rule.alerts.values()
            ]
        return out

    def restore(self, saved: Mapping[str, tuple[int, list[dict[str, Any]]]], now_ms: int, *,
                outage_tolerance_ms: int) -> int:
        """Bring back alerts saved before a restart; returns how many.

        Firing alerts stay firing (no second "firing" notification); resolved ones stay
        resolved for the rest of their 15 minutes, so receivers still hear about the
        resolution if the agent died before telling them. A pending alert
        resumes its ``for`` where it stopped: its ``activeAt`` moves forward by the time
        the agent was down, so it neither fires early nor starts over. Prometheus skips
        restoring rules whose ``for`` is under its 10 min grace period; we restore all,
        since the guides' rules use 5 min. After more than ``outage_tolerance_ms`` down,
        pending alerts start over (the data they were based on is too old).
        """
        count = 0
        for group in self.groups:
            for i, rule in enumerate(group.rules):
                entry = saved.get(self.rule_key(group, i))
                if rule.spec.kind != "alert" or entry is None:
                    continue
                down_at_ms, alerts = entry
                rule.restored = True
                down_for = max(0, now_ms - down_at_ms)
                for data in alerts:
                    state = AlertState(data["state"])
                    active_at = int(data["active_at_ms"])
                    resolved_at = int(data.get("resolved_at_ms", 0))
                    if state is AlertState.PENDING:
                        if down_for > outage_tolerance_ms:
                            continue
                        active_at += down_for
                    elif state is AlertState.INACTIVE and now_ms - resolved_at > RESOLVED_RETENTION_MS:
                        continue
                    labels: Labels = tuple(sorted((str(k), str(v)) for k, v in data["labels"].items()))
                    rule.alerts[labels] = Alert(labels, dict(data.get("annotations", {})),
                                                float(data.get("value", 0.0)), state, active_at,
                                                fired_at_ms=int(data.get("fired_at_ms", 0)),
                                                resolved_at_ms=resolved_at)
                    count += 1
        return count

    async def restore_remote(self, group: Group, at_ms: int, query: RemoteQuery, *, outage_tolerance_ms: int) -> int:
        """After the first remote evaluation of ``group``: take ``activeAt`` from the server's
        ``ALERTS_FOR_STATE`` for alerts whose rule had no saved state (a new state database).

        The series is written by whoever evaluated these rules before (the agent's remote write,
        an HA peer, or Prometheus evaluating the same files), so an alert that has been pending
        or firing for an hour stays an hour old instead of starting its ``for`` again. As in
        Prometheus' ``RestoreForState`` the lookback is ``outage_tolerance``; the series' labels
        must include every label of the alert (a server adds its own, such as ``replica``).
        The earliest ``activeAt`` wins. Returns how many alerts were restored; a query that
        fails restores nothing and is not retried (the alerts simply start now).
        """
        count, window = 0, f"{max(1, outage_tolerance_ms // 1000)}s"
        for rule in group.rules:
            if rule.spec.kind != "alert" or rule.restored or not rule.alerts:
                continue
            rule.restored = True
            name = rule.spec.name.replace("\\", "\\\\").replace('"', '\\"')
            try:
                found = await query(f'last_over_time(ALERTS_FOR_STATE{{alertname="{name}"}}[{window}])', at_ms)
            except PromQLError as exc:
                log.warning("cannot restore alert state from the source", rule=rule.spec.name, error=str(exc))
                continue
            pending = [key for key, alert in rule.alerts.items() if alert.state is AlertState.PENDING]
            if not pending:
                continue
            # one index over the series, off the loop: thousands of alerts x series held start-up (agent.rules.restore)
            earliest = await asyncio.to_thread(earliest_active_at, pending, found)
            for key, seconds in earliest.items():
                alert = rule.alerts.get(key)  # the rule may have been evaluated meanwhile
                if alert is not None and alert.state is AlertState.PENDING and 0 < seconds * 1000 < alert.active_at_ms:
                    alert.active_at_ms = int(seconds * 1000)
                    count += 1
        return count

    # -- views -----------------------------------------------------------------------
    def alerts(self, *, states: tuple[AlertState, ...] = (AlertState.PENDING, AlertState.FIRING)) -> list[Alert]:
        return [a for g in self.groups for r in g.rules for a in r.alerts.values() if a.state in states]

    def alerts_json(self) -> list[dict[str, Any]]:
        return [a.as_json() for a in self.alerts()]

    def rules_json(self) -> list[dict[str, Any]]:
        """Groups shaped like Prometheus' ``/api/v1/rules`` ``data.groups``."""
        out = []
        for g in self.groups:
            rules = []
            for r in g.rules:
                s = r.spec
                item: dict[str, Any] = {
                    "name": s.name, "query": s.expr_text, "labels": s.labels, "health": r.health,
                    "lastError": r.last_error, "evaluationTime": r.eval_seconds,
                    "lastEvaluation": iso_ms(r.last_eval_ms) if r.last_eval_ms else None,
                }
                if s.kind == "alert":
                    active = [a for a in r.alerts.values() if a.state is not AlertState.INACTIVE]
                    state = max((a.state for a in active), key=_STATE_ORDER.index, default=AlertState.INACTIVE)
                    item.update(type="alerting", state=state.value, duration=s.for_s,
                                keepFiringFor=s.keep_firing_for_s, annotations=s.annotations,
                                alerts=[a.as_json() for a in active])
                else:
                    item["type"] = "recording"
                rules.append(item)
            out.append({"name": g.spec.name, "file": g.spec.file, "interval": g.interval_s, "rules": rules,
                        "evaluationTime": g.eval_seconds,
                        "lastEvaluation": iso_ms(g.last_eval_ms) if g.last_eval_ms else None})
        return out


_STATE_ORDER = [AlertState.INACTIVE, AlertState.PENDING, AlertState.FIRING]


def rule_group_label(group: Group) -> str:
    """The ``rule_group`` label of a group's metrics: ``file;name``, Prometheus' format."""
    return f"{group.spec.file};{group.spec.name}"


def _check_type(rule: RuleState) -> None:
    if rule.spec.expr.type not in ("vector", "scalar"):  # Prometheus fails such a rule at run time too
        raise RuleError(f"rule result is not a vector or scalar but a {rule.spec.expr.type}")


def _json_float(v: float) -> float | str:
    """A float that survives strict JSON for the state store: NaN/Inf as Go writes them, which float() reads back."""
    return v if math.isfinite(v) else format_float(v)

