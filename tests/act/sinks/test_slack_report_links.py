"""Tests for the triage report links in Slack messages (agent.act.sinks.slack_blocks.alert_blocks)."""

from __future__ import annotations

from typing import Any

from agent.act.notification import AlertSnapshot, Notification
from agent.act.queues import receiver_queue
from agent.act.sinks.slack_blocks import alert_blocks

BASE = "https://sre-agent.example.test"


def _note(status: str, refs: dict[str, dict[str, Any]], n: int = 1) -> Notification:
    alerts = tuple(AlertSnapshot({"alertname": "KVHigh", "instance": f"i{i}"}, {"summary": "KV full."}, status,
                                 1_000, 2_000 if status == "resolved" else 0) for i in range(n))
    incidents = {a.fingerprint: refs.get(a.labels["instance"], {}) for a in alerts}
    return Notification(key="k", receiver=receiver_queue("slack"), kind="alerts", created_ms=1_000, status=status,
                        alerts=alerts, incidents={k: v for k, v in incidents.items() if v})


def _buttons(blocks: list[dict[str, Any]]) -> dict[str, str]:
    return {e["text"]["text"]: e["url"] for b in blocks if b["type"] == "actions" for e in b["elements"]}


def test_one_incident_gets_a_report_button() -> None:
    """With server.external_url the message links the incident's report; without it, no link."""
    note = _note("firing", {"i0": {"id": 12}})
    _, blocks = alert_blocks(note, report_url=BASE)
    assert _buttons(blocks) == {"Triage report": f"{BASE}/incidents/12"}
    _, plain = alert_blocks(note)
    assert "Triage report" not in _buttons(plain)


def test_several_incidents_get_a_line_of_links() -> None:
    """A group of alerts links each incident's report in one context line (buttons would not fit)."""
    _, blocks = alert_blocks(_note("firing", {"i0": {"id": 3}, "i1": {"id": 4}}, n=2), report_url=BASE)
    contexts = [e["text"] for b in blocks if b["type"] == "context" for e in b["elements"]]
    assert f"<{BASE}/incidents/3|report #3> · <{BASE}/incidents/4|report #4>" in contexts
    assert "Triage report" not in _buttons(blocks)


def test_resolve_update_carries_the_one_line_summary_escaped() -> None:
    """The resolved message says each incident's summary (escaped for mrkdwn), and the fallback text too."""
    summary = "KVHigh fired 00:00:01 UTC at 0.97, resolved after 1s; notified <!channel>."
    text, blocks = alert_blocks(_note("resolved", {"i0": {"id": 5, "summary": summary}}), report_url=BASE)
    sections = [b["text"]["text"] for b in blocks if b["type"] == "section" and "text" in b]
    assert "• KVHigh fired 00:00:01 UTC at 0.97, resolved after 1s; notified &lt;!channel&gt;." in sections
    assert text == "[RESOLVED] KVHigh: " + summary.replace("<", "&lt;").replace(">", "&gt;")
