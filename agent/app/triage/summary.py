"""The report's summary paragraph, written from the facts (never a fixed text per alert).

Sentences appear only for what happened: what fired, where, against which threshold and after how
long pending; how long it lasted or that it still fires; the peak the firing series reached (from
the plotted data); who was told and how that went; what the agent scaled; what the diagnosis
found; which silences muted it. The report's headline is the one-line summary the Slack resolve
update carries (:func:`agent.act.incident_summary.one_line`), so both say the same.
"""

from __future__ import annotations

import math
from collections import defaultdict

from agent.act.incident_summary import clock_utc, format_value, human_duration
from agent.app.triage.facts import Facts
from agent.app.triage.series import PlotData

__all__ = ["peak", "summary"]


def peak(plots: list[PlotData]) -> tuple[float, int] | None:
    """The firing series' highest value and when, if it was plotted with data."""
    best: tuple[float, int] | None = None
    for p in plots:
        if p.spec.key != "firing":
            continue
        for line in p.lines:
            if line.role != "value":
                continue
            for t, v in zip(line.ts, line.values, strict=True):
                if math.isfinite(v) and (best is None or v > best[0]):
                    best = (v, t)
    return best


def _where(labels: dict[str, str]) -> str:
    keys = [k for k in ("instance", "model_name", "job", "gpu", "Hostname") if labels.get(k)]
    return ", ".join(f"{k}={labels[k]}" for k in keys)


def summary(f: Facts, plots: list[PlotData]) -> list[str]:
    """The paragraph as sentences (the template joins them)."""
    inc, rule = f.incident, f.rule
    out: list[str] = []
    sev = f" ({inc.severity})" if inc.severity else ""
    where = _where(inc.labels)
    first = f"{inc.alertname}{sev} fired{' for ' + where if where else ''} at {clock_utc(inc.started_ms)}"
    if f.pending_ms is not None and f.pending_ms < inc.started_ms:
        approx = "about " if f.pending_estimated else ""
        first += f" after {approx}{human_duration(inc.started_ms - f.pending_ms)} pending"
    if rule is not None and rule.condition:
        first += f": {rule.value_expr} {rule.condition}"
        if f.fired_value is not None:
            first += f" (it was {format_value(f.fired_value)})"
    out.append(first + ".")
    if inc.resolved_ms:
        out.append(f"It resolved at {clock_utc(inc.resolved_ms)}, "
                   f"{human_duration(inc.resolved_ms - inc.started_ms)} later.")
    else:
        out.append(f"It is still firing, {human_duration(f.now_ms - inc.started_ms)} after it started.")
    top = peak(plots)
    if top is not None:
        out.append(f"The firing series peaked at {format_value(top[0])} at {clock_utc(top[1])}.")
    out += _notifications(f)
    for a in f.actions:
        verb = "would have scaled" if a.dry_run else "scaled"
        out.append(f"At {clock_utc(a.at_ms)} the agent {verb} {a.service} from {a.from_replicas} to "
                   f"{a.to_replicas} replicas.")
    for x in f.findings:
        change = f" Suggested change: {x.setting} → {x.value}." if x.setting and x.value else ""
        out.append(f"Diagnosis ({x.kind}): {x.summary.rstrip('.')}.{change}")
    if not f.findings and not f.actions:
        out.append("The agent took no action and recorded no diagnosis for it.")
    for s in f.silences:
        who = f" by {s.created_by}" if s.created_by else ""
        out.append(f"A silence{who} muted its notifications from {clock_utc(max(s.starts_ms, f.start_ms))} "
                   f"to {clock_utc(s.ends_ms)}" + (f" ({s.comment})." if s.comment else "."))
    return out


def _notifications(f: Facts) -> list[str]:
    if not f.notifications:
        return ["No receiver was notified."]
    by: dict[str, list[str]] = defaultdict(list)
    for n in f.notifications:
        by[n.receiver].append(n.outcome)
    parts = []
    for receiver, outcomes in sorted(by.items()):
        counts = {o: outcomes.count(o) for o in ("delivered", "failed", "retrying") if o in outcomes}
        parts.append(f"{receiver} ({', '.join(f'{n} {o}' for o, n in counts.items())})")
    retried = sum(max(n.attempts - 1, 0) for n in f.notifications)
    tail = f", after {retried} retr{'y' if retried == 1 else 'ies'} in all" if retried else ""
    return [f"Notifications: {'; '.join(parts)}{tail}."]
