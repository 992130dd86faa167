"""Tests for agent.app.triage without processes: escaping of hostile values in all three formats, silences and
retrying notifications in the timeline, the rule's threshold, a missing incident, and the daemon-side cache."""

from __future__ import annotations

import base64
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from agent.act.notification import AlertSnapshot, Notification, fingerprint
from agent.act.queues import receiver_queue
from agent.act.state import StateDB
from agent.app.triage import Reports, build, render
from agent.app.triage.facts import read_state
from agent.app.triage.rule import find_rule
from agent.errors import NotFoundError
from agent.rules.files import GroupSpec, parse_rule_file

HOSTILE = '<script>alert("x")</script>'
T0 = 1_780_000_000_000  # ms


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the page's text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _groups(tmp_path: Path) -> list[GroupSpec]:
    rules = tmp_path / "r.rules.yaml"
    rules.write_text("groups:\n  - name: g\n    rules:\n"
                     "      - alert: KVHigh\n        expr: 0.95 < instance_model:kv:max\n        for: 2m\n"
                     "      - alert: Queue\n        expr: waiting > on (job) 2 * running and on () up > 0\n"
                     "      - alert: Always\n        expr: vector(1)\n")
    return parse_rule_file(rules)


def _hostile_incident(db: StateDB) -> tuple[int, str]:
    labels = {"alertname": "KVHigh", "instance": HOSTILE, "model_name": "m|`*[x](javascript:alert(1))",
              "severity": "warning"}
    fp = fingerprint(labels)
    iid = db.incidents.open(fingerprint=fp, alertname="KVHigh", labels=labels, severity="warning",
                            summary=f"summary {HOSTILE}", started_ms=T0)
    db.incidents.add_event(fp, at_ms=T0, kind="fired", detail={"value": 0.97, "active_at_ms": T0 - 120_000})
    db.incidents.add_event(fp, at_ms=T0 + 5000, kind="finding", detail={
        "kind": "kv-cache-capacity", "summary": f"<img src=x onerror=alert(1)> {HOSTILE}",
        "setting": "--max-num-seqs", "suggested_value": "<b>64</b>", "runbook_url": "javascript:alert(1)"})
    db.incidents.add_event(fp, at_ms=T0 + 1000, kind="notified", detail={
        "receiver": "slack", "status": "firing", "kind": "alerts", "attempts": 2, "last_error": "HTTP 503"})
    db.silences.add(["instance=" + json.dumps(HOSTILE)], starts_ms=T0 + 2000, ends_ms=T0 + 60_000, created_by=HOSTILE,
                    comment=f"comment {HOSTILE}")
    db.silences.add(['instance="elsewhere"'], starts_ms=T0, ends_ms=T0 + 60_000, created_by="bob", comment="no")
    stuck = Notification(key="k1", receiver=receiver_queue("pager"), kind="alerts", created_ms=T0 + 3000,
                         alerts=(AlertSnapshot(labels, {}, "firing", T0),))
    db.outbox.enqueue(stuck, now_ms=T0 + 3000)
    item = db.outbox.pending()[0]
    db.outbox.begin_attempt(item.id, next_attempt_ms=T0 + 4000)
    db.outbox.retry(item.id, next_attempt_ms=T0 + 9000, error="connection refused")
    return iid, fp


@pytest.fixture
def db(tmp_path: Path) -> StateDB:
    return StateDB(tmp_path / "state.db")


def test_hostile_values_stay_text_in_html(db: StateDB, tmp_path: Path) -> None:
    """A label, summary, finding or silence holding markup is shown as text: no element, no javascript: link."""
    iid, _ = _hostile_incident(db)
    report = build(read_state(db, iid, now_ms=T0 + 90_000), _groups(tmp_path), now_ms=T0 + 90_000, query=None,
                   source="nowhere (test)", images=True)
    page = render(report, "html")
    parser = _Tags()
    parser.feed(page)
    tags = [t for t, _ in parser.tags]
    assert "script" not in tags and "b" not in tags
    imgs = [a for t, a in parser.tags if t == "img"]
    assert len(imgs) == 6 and all(str(a["src"]).startswith("data:image/png;base64,") for a in imgs)
    assert all(base64.b64decode(str(a["src"]).split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n" for a in imgs)
    assert all(a.get("alt") for a in imgs)
    hrefs = [a.get("href") for t, a in parser.tags if t == "a"]
    assert not any(str(h).startswith("javascript") for h in hrefs)
    text = "".join(parser.text)
    assert HOSTILE in text and "<img src=x onerror=alert(1)>" in text and "<b>64</b>" in text
    assert "javascript:alert(1)" in text  # the runbook shown, not linked
    assert {a.get("id") for t, a in parser.tags if t == "section"} >= {"timeline", "plots", "findings", "summary",
                                                                        "rule"}


def test_hostile_values_stay_text_in_markdown_and_json(db: StateDB, tmp_path: Path) -> None:
    """Markdown carries no raw tag, table pipe or link of a label's making; JSON keeps the exact value."""
    iid, _ = _hostile_incident(db)
    report = build(read_state(db, iid, now_ms=T0 + 90_000), _groups(tmp_path), now_ms=T0 + 90_000, query=None,
                   source="nowhere (test)", images=False)
    md = render(report, "md")
    assert "<script" not in md and "<img" not in md
    assert re.search(r"(?<!\\)\]\(javascript", md) is None  # every ] a label brings is escaped: no link
    assert "&lt;script&gt;" in md and r"m\|\`\*\[x\]" in md
    data = json.loads(render(report, "json"))
    assert data["incident"]["labels"]["instance"] == HOSTILE
    assert data["findings"][0]["runbook_url"] == "javascript:alert(1)"


def test_timeline_holds_silences_that_match_and_notifications_still_retrying(db: StateDB, tmp_path: Path) -> None:
    """The matching silence is in the timeline (created, ended), the other not; the stuck outbox item is retrying."""
    iid, _ = _hostile_incident(db)
    report = build(read_state(db, iid, now_ms=T0 + 90_000), _groups(tmp_path), now_ms=T0 + 90_000, query=None,
                   source="nowhere (test)", images=False)
    rows = [(e.at_ms - T0, e.kind, e.outcome) for e in report.timeline]
    assert rows == [(-120_000, "pending", ""), (0, "firing", ""), (1000, "notification", "ok"),
                    (2000, "silence", ""), (3000, "notification", "retrying"), (5000, "finding", ""),
                    (60_000, "silence", "")]
    texts = {e.kind + str(e.at_ms - T0): e.text for e in report.timeline}
    assert "after 2 attempts (1 retries)" in texts["notification1000"]
    assert "pager" in texts["notification3000"] and "connection refused" in texts["notification3000"]
    assert "bob" not in " ".join(texts.values())
    assert [s.comment for s in report.facts.silences] == [f"comment {HOSTILE}"]
    assert "still firing" in " ".join(report.summary)


def test_rule_threshold_is_read_from_the_expression(tmp_path: Path) -> None:
    """``0.95 < x`` reads as x > 0.95; ``a > 2 * b and up`` has an expression threshold; vector(1) has none."""
    groups = _groups(tmp_path)
    kv, queue, always = (find_rule(groups, n) for n in ("KVHigh", "Queue", "Always"))
    assert kv is not None and (kv.value_expr, kv.op, kv.threshold, kv.for_s) == ("instance_model:kv:max", ">",
                                                                                 0.95, 120.0)
    assert queue is not None and (queue.value_expr, queue.threshold, queue.threshold_expr) == ("waiting", None,
                                                                                               "2 * running")
    assert always is not None and (always.op, always.condition, always.value_expr) == (None, "", "vector(1)")
    assert find_rule(groups, "Nope") is None


def test_unknown_incident_is_a_clear_error(db: StateDB) -> None:
    """An id that was never recorded, or no incidents at all for --latest, raise NotFoundError saying so."""
    with pytest.raises(NotFoundError, match="no incident 7"):
        read_state(db, 7, now_ms=T0)
    with pytest.raises(NotFoundError, match="no incidents yet"):
        read_state(db, None, now_ms=T0)


async def test_reports_are_cached_per_incident_version(tmp_path: Path) -> None:
    """A second request for an unchanged incident is served from the cache; a new event makes a new report."""
    db = StateDB(tmp_path / "state.db")
    iid, fp = _hostile_incident(db)
    db.incidents.resolve(fp, resolved_ms=T0 + 10_000)
    groups = _groups(tmp_path)
    reports = Reports(db, lambda: groups, clock=lambda: (T0 + 7_200_000) / 1000)  # two hours on: plots done
    try:
        first = await reports.render(iid, "html")
        assert await reports.render(iid, "html") == first and reports.built == 1
        await db.run(db.incidents.add_event, fp, at_ms=T0 + 11_000, kind="notified",
                     detail={"receiver": "slack", "status": "resolved", "kind": "alerts", "attempts": 1})
        second = await reports.render(iid, "html")
        assert reports.built == 2 and second != first and "resolved notification delivered to slack" in second
    finally:
        await db.aclose()


def test_cli_names_a_missing_state_database_and_creates_none(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """``sre-agent triage --db`` on a path with no database exits 2 saying so, and leaves no empty file behind."""
    from agent.cli import main

    missing = tmp_path / "nope.db"
    assert main(["triage", "1", "--db", str(missing)]) == 2
    assert f"no state database at {missing}" in capsys.readouterr().err and not missing.exists()


def test_gpu_plot_is_scoped_to_the_alerts_node_and_falls_back_to_every_gpu(db: StateDB, tmp_path: Path) -> None:
    """A server's alert plots the GPUs whose Hostname is its instance's host; with none there, every GPU."""
    from agent.app.triage.facts import facts
    from agent.app.triage.series import fetch, plot_specs, window

    labels = {"alertname": "KVHigh", "instance": "node-3:8000", "job": "vllm"}
    fp = fingerprint(labels)
    iid = db.incidents.open(fingerprint=fp, alertname="KVHigh", labels=labels, severity="", summary="",
                            started_ms=T0)
    f = facts(read_state(db, iid, now_ms=T0 + 60_000), _groups(tmp_path), now_ms=T0 + 60_000)
    w = window(f)
    gpu = next(s for s in plot_specs(f, w) if s.key == "gpu")
    assert 'Hostname="node-3"' in gpu.queries[0].expr and "Hostname" not in gpu.fallback[0].expr
    asked: list[str] = []

    def answers(expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[tuple[dict[str, str], list[int],
                                                                                   list[float]]]:
        asked.append(expr)
        return [] if "node-3" in expr else [({"Hostname": "other", "gpu": "0"}, [start_ms], [50.0])]

    data = fetch(gpu, w, answers, f.labels)
    assert len(asked) == 2 and [line.label for line in data.lines] == ["GPU other 0"]
