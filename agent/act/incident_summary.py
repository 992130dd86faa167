"""One line that says what an incident was and what the agent did about it.

Written from the incident's own timeline (:class:`~agent.act.state.Incident`), never canned: when it
fired and for how long, the value it fired at, who was told, what was scaled and what the diagnosis
found. The Slack receiver puts it into the resolve update of the alert's message, and the triage
report (:mod:`agent.app.triage`) opens its summary with it, so both say the same thing. It lives in
the act layer because the dispatcher builds the resolve notification; the report sits above.
"""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime

from agent.act.state.records import Incident
from agent.config.types import format_duration

__all__ = ["clock_utc", "format_value", "human_duration", "one_line"]


def clock_utc(ms: int) -> str:
    """Unix ms -> ``12:03:10 UTC`` (the date is on the report; a line stays short)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S UTC")


def human_duration(ms: int) -> str:
    """A duration as people say it: whole seconds (``14m30s``), ``0s`` under half a second."""
    return format_duration(round(max(ms, 0) / 1000))


def format_value(value: object) -> str:
    """A sample value as people read it: 4 significant digits, ``n/a`` for none (NaN, null)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "n/a"
    return f"{value:.4g}"


def one_line(incident: Incident, *, now_ms: int) -> str:
    """``VLLMKVCacheSaturated fired 12:03:10 UTC at 0.97, resolved after 14m30s; notified slack; ...``."""
    parts: list[str] = []
    fired = next((e for e in incident.events if e.kind == "fired"), None)
    head = f"{incident.alertname} fired {clock_utc(incident.started_ms)}"
    if fired is not None and "value" in fired.detail:
        head += f" at {format_value(fired.detail['value'])}"
    if incident.resolved_ms:
        head += f", resolved after {human_duration(incident.resolved_ms - incident.started_ms)}"
    else:
        head += f", firing for {human_duration(now_ms - incident.started_ms)}"
    parts.append(head)
    notified = Counter(str(e.detail.get("receiver", "?")) for e in incident.events if e.kind == "notified")
    failed = sorted({str(e.detail.get("receiver", "?")) for e in incident.events if e.kind == "notify_failed"})
    if notified:
        parts.append("notified " + ", ".join(f"{r} ×{n}" if n > 1 else r for r, n in sorted(notified.items())))
    if failed:
        parts.append("notification failed for " + ", ".join(failed))
    parts += _actions(incident)
    findings = [e for e in incident.events if e.kind == "finding"]
    if findings:
        first = findings[0].detail
        change = f" ({first.get('setting')} → {first.get('suggested_value')})" if first.get("setting") else ""
        more = f" and {len(findings) - 1} more" if len(findings) > 1 else ""
        parts.append(f"finding: {first.get('kind', 'finding')}{change}{more}")
    return "; ".join(parts) + "."


def _actions(incident: Incident) -> list[str]:
    """Scale actions, merged: one phrase per service and kind (a scale-out every evaluation is one line)."""
    done: dict[tuple[str, str], tuple[int, int]] = {}
    refused: Counter[str] = Counter()
    for e in incident.events:
        if e.kind != "action":
            continue
        d = e.detail
        action, service = str(d.get("action", "action")), str(d.get("service", ""))
        if d.get("refused"):
            refused[f"{action} of {service}"] += 1
            continue
        key = (("would " if d.get("dry_run") else "") + action.replace("_", "-"), service)
        lo = done.get(key, (int(d.get("from_replicas", 0)), 0))[0]
        done[key] = (lo, int(d.get("to_replicas", 0)))
    out = [f"{what} {service} {lo}→{hi}" for (what, service), (lo, hi) in done.items()]
    out += [f"{what} refused" + (f" ×{n}" if n > 1 else "") for what, n in refused.items()]
    return out
