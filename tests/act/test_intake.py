"""Tests for agent.act.intake and agent.act.state.intake: reading Alertmanager's webhook strictly, telling
transitions from re-sends, keeping them across a restart, and mapping them to the agent's alert model."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest

from agent.act.intake import INTAKE_GROUP, MAX_ALERTS, MAX_TIME_MS, evaluation, parse_webhook
from agent.act.sinks.webhook import format_go_time
from agent.act.state import IntakeAlert, StateDB, iso_ms
from agent.act.state.intake import InboxItem, is_news
from agent.rules.manager import AlertState

STARTS = "2025-06-15T15:00:00.123456789Z"  # Go writes nanoseconds
STARTS_MS = 1_749_999_600_123
ENDS = "2025-06-15T15:10:00Z"
ENDS_MS = 1_750_000_200_000


def alert(status: str = "firing", fp: str = "a1b2c3d4e5f60718", starts: str = STARTS, **labels: str) -> dict[str, Any]:
    """One alert as Alertmanager 0.25's webhook writes it."""
    return {"status": status, "labels": {"alertname": "GPUMemoryHigh", "Hostname": "gpu-a", **labels},
            "annotations": {"summary": "GPU memory is high."}, "startsAt": starts,
            "endsAt": ENDS if status == "resolved" else "0001-01-01T00:00:00Z",
            "generatorURL": "http://prometheus:9090/graph?g0.expr=x", "fingerprint": fp}


def webhook(*alerts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """A version-4 webhook body around ``alerts``."""
    body = {"receiver": "sre-agent", "status": "firing", "alerts": list(alerts) or [alert()],
            "groupLabels": {"alertname": "GPUMemoryHigh"}, "commonLabels": {"alertname": "GPUMemoryHigh"},
            "commonAnnotations": {}, "externalURL": "http://alertmanager:9093", "version": "4",
            "groupKey": '{}:{alertname="GPUMemoryHigh"}', "truncatedAlerts": 0}
    body.update(extra)
    return body


def test_a_webhook_becomes_intake_alerts() -> None:
    """Every field is read: times in ms (nanoseconds cut), Go's zero endsAt as 0, the source and receiver kept."""
    hook = parse_webhook(webhook(alert(), alert("resolved", fp="00ff00ff00ff00ff", instance="b"), truncatedAlerts=3))
    assert (hook.receiver, hook.status, hook.external_url, hook.truncated) == (
        "sre-agent", "firing", "http://alertmanager:9093", 3)
    firing, resolved = hook.alerts
    assert firing == IntakeAlert(fingerprint="a1b2c3d4e5f60718", status="firing",
                                 labels={"alertname": "GPUMemoryHigh", "Hostname": "gpu-a"},
                                 annotations={"summary": "GPU memory is high."}, starts_ms=STARTS_MS, ends_ms=0,
                                 generator_url="http://prometheus:9090/graph?g0.expr=x",
                                 source="http://alertmanager:9093", receiver="sre-agent")
    assert (resolved.status, resolved.ends_ms) == ("resolved", ENDS_MS)


def test_optional_and_unknown_keys() -> None:
    """truncatedAlerts may be absent; notification_reason and keys a later Alertmanager adds are ignored."""
    body = webhook(notification_reason="repeat", somethingNew={"x": 1})
    del body["truncatedAlerts"]
    assert parse_webhook(body).truncated == 0


@pytest.mark.parametrize("text, ms", [
    ("2025-06-15T15:00:00Z", 1_749_999_600_000),
    ("2025-06-15T15:00:00.5Z", 1_749_999_600_500),
    ("2025-06-15T17:00:00.250+02:00", 1_749_999_600_250),
    ("2025-06-15t15:00:00z", 1_749_999_600_000),
])
def test_rfc3339_times(text: str, ms: int) -> None:
    """RFC 3339 with any fraction up to nanoseconds and any offset is read to the millisecond."""
    assert parse_webhook(webhook(alert(starts=text))).alerts[0].starts_ms == ms


def _drop(path: str) -> dict[str, Any]:
    body = webhook()
    *parents, last = path.split(".")
    obj: Any = body
    for p in parents:
        obj = obj[int(p)] if p.isdigit() else obj[p]
    del obj[last]
    return body


def _set(path: str, value: Any) -> dict[str, Any]:
    body = webhook()
    *parents, last = path.split(".")
    obj: Any = body
    for p in parents:
        obj = obj[int(p)] if p.isdigit() else obj[p]
    obj[last] = value
    return body


BAD: list[tuple[str, dict[str, Any], str]] = [
    # (what, body, the text the error must contain)
    *[(f"no {key}", _drop(key), f"{key}: missing") for key in (
        "version", "groupKey", "status", "receiver", "groupLabels", "commonLabels", "commonAnnotations",
        "externalURL", "alerts")],
    *[(f"no alert {key}", _drop(f"alerts.0.{key}"), f"alerts[0].{key}: missing") for key in (
        "status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint")],
    ("version 3", _set("version", "3"), "version: expected '4'"),
    ("version a number", _set("version", 4), "version: must be a string, not a number"),
    ("status unknown", _set("status", "pending"), "status: must be 'firing' or 'resolved'"),
    ("alert status unknown", _set("alerts.0.status", "silenced"), "alerts[0].status"),
    ("alerts an object", _set("alerts", {}), "alerts: must be an array, not an object"),
    ("alerts empty", _set("alerts", []), "alerts: empty"),
    ("alert a string", _set("alerts", ["x"]), "alerts[0]: must be an object, not a string"),
    ("labels a list", _set("alerts.0.labels", []), "alerts[0].labels: must be an object, not an array"),
    ("labels empty", _set("alerts.0.labels", {}), "alerts[0].labels: empty"),
    ("label value a number", _set("alerts.0.labels", {"alertname": 1}), "alerts[0].labels.alertname: must be a string"),
    ("label name empty", _set("alerts.0.labels", {"": "x"}), "alerts[0].labels: a name must have"),
    ("annotation null", _set("alerts.0.annotations", {"summary": None}), "alerts[0].annotations.summary"),
    ("many labels", _set("alerts.0.labels", {f"l{i}": "x" for i in range(300)}), "more than the 256"),
    ("groupLabels value list", _set("groupLabels", {"a": []}), "groupLabels.a: must be a string"),
    ("startsAt a number", _set("alerts.0.startsAt", 1.5e9), "alerts[0].startsAt: must be a string, not a number"),
    ("startsAt no zone", _set("alerts.0.startsAt", "2025-06-15T15:00:00"), "not an RFC 3339 time"),
    ("startsAt with a space", _set("alerts.0.startsAt", "2025-06-15 15:00:00Z"), "not an RFC 3339 time"),
    ("startsAt no such day", _set("alerts.0.startsAt", "2025-02-30T15:00:00Z"), "not a valid time"),
    ("startsAt zero", _set("alerts.0.startsAt", "0001-01-01T00:00:00Z"), "after 1970"),
    ("startsAt huge", _set("alerts.0.startsAt", "2025-06-15T15:00:00." + "1" * 5000 + "Z"), "RFC 3339"),
    ("resolved without endsAt", _set("alerts.0.status", "resolved"), "alerts[0].endsAt: a resolved alert"),
    ("fingerprint empty", _set("alerts.0.fingerprint", ""), "alerts[0].fingerprint"),
    ("fingerprint with a quote", _set("alerts.0.fingerprint", "ab'; DROP"), "alerts[0].fingerprint"),
    ("truncatedAlerts negative", _set("truncatedAlerts", -1), "truncatedAlerts: must not be negative"),
    ("truncatedAlerts a boolean", _set("truncatedAlerts", True), "truncatedAlerts: must be a number, not a boolean"),
    ("truncatedAlerts a string", _set("truncatedAlerts", "0"), "truncatedAlerts: must be a number"),
    ("generatorURL null", _set("alerts.0.generatorURL", None), "alerts[0].generatorURL: must be a string, not null"),
    ("too many alerts", _set("alerts", [alert()] * (MAX_ALERTS + 1)), "more than the 10000"),
]


@pytest.mark.parametrize("what, body, word", BAD, ids=[b[0] for b in BAD])
def test_every_bad_webhook_is_refused_naming_the_problem(what: str, body: dict[str, Any], word: str) -> None:
    """A body that is not Alertmanager's version-4 webhook raises ValueError naming the field and the problem."""
    with pytest.raises(ValueError) as err:
        parse_webhook(body)
    assert word in str(err.value)


@pytest.mark.parametrize("known, status, starts, news", [
    (None, "firing", 10, True),
    (None, "resolved", 10, True),  # first seen resolved: recorded, so a re-send is a duplicate
    (("firing", 10), "firing", 10, False),  # Alertmanager's repeat_interval / group_interval re-send
    (("firing", 10), "resolved", 10, True),
    (("resolved", 10), "resolved", 10, False),
    (("resolved", 10), "firing", 10, False),  # a lagging HA peer re-sending the episode that ended
    (("resolved", 10), "firing", 20, True),  # it fires again: a new episode
    (("firing", 20), "resolved", 10, False),  # an old episode's resolve, late
    (("firing", 10), "firing", 20, True),
])
def test_what_is_news(known: tuple[str, int] | None, status: str, starts: int, news: bool) -> None:
    """Only a change of (status, startsAt) in the forward direction is a transition."""
    assert is_news(known, status, starts) is news


def _intake(**kw: Any) -> IntakeAlert:
    return parse_webhook(webhook(alert(**kw))).alerts[0]


def test_accept_dedupes_and_the_inbox_survives_a_restart(tmp_path: Path) -> None:
    """Re-sends are duplicates; transitions wait in the inbox, in order, across a close and reopen, until done."""
    db = StateDB(tmp_path / "s.db")
    firing, resolved = _intake(), _intake(status="resolved")
    assert db.intake.accept([firing], now_ms=1).new == 1
    assert db.intake.accept([firing, firing], now_ms=2).duplicates == 2
    assert db.intake.accept([resolved], now_ms=3).new == 1
    assert db.intake.accept([firing, resolved], now_ms=4).duplicates == 2
    db.close()
    db = StateDB(tmp_path / "s.db")
    items = db.intake.pending()
    assert [(i.alert.status, i.was) for i in items] == [("firing", ""), ("resolved", "firing")]
    assert db.intake.depth() == 2
    db.intake.done([items[0].id])
    assert [i.alert.status for i in db.intake.pending()] == ["resolved"]
    assert db.intake.accept([firing], now_ms=5).duplicates == 1  # processed or not, a re-send stays one
    db.close()


def test_current_and_prune(tmp_path: Path) -> None:
    """current() holds firing alerts and recent resolves; prune forgets old resolves, never firing alerts."""
    db = StateDB(tmp_path / "s.db")
    db.intake.accept([_intake(fp="aa"), _intake(fp="bb", status="resolved")], now_ms=ENDS_MS)
    assert {a.fingerprint for a in db.intake.current(now_ms=ENDS_MS + 1000, resolved_keep_ms=60_000)} == {"aa", "bb"}
    assert {a.fingerprint for a in db.intake.current(now_ms=ENDS_MS + 61_000, resolved_keep_ms=60_000)} == {"aa"}
    assert db.prune(now_ms=ENDS_MS + 10_000, keep_ms=60_000) == 0
    assert db.prune(now_ms=ENDS_MS + 61_000, keep_ms=60_000) == 1
    assert db.intake.accept([_intake(fp="bb", status="resolved")], now_ms=ENDS_MS + 62_000).new == 1
    db.close()


def test_evaluation_maps_to_the_agents_alert_model() -> None:
    """Transitions become events (firing at startsAt, resolved at endsAt, none for a resolve never seen
    firing), the latest state of each alert one snapshot, and nothing goes to Alertmanager receivers."""
    firing, resolved = _intake(), _intake(status="resolved")
    other = _intake(fp="cc", status="resolved", instance="b")
    ev = evaluation([InboxItem(1, firing, ""), InboxItem(2, resolved, "firing"), InboxItem(3, other, "")])
    assert ev.group == INTAKE_GROUP and ev.to_alertmanagers is False and ev.pending == ()
    assert [(e.kind, e.rule, e.at_ms) for e in ev.events] == [("firing", "GPUMemoryHigh", STARTS_MS),
                                                              ("resolved", "GPUMemoryHigh", ENDS_MS)]
    fired = ev.events[0].alert
    assert (fired.state, fired.active_at_ms, dict(fired.labels)) == (AlertState.FIRING, STARTS_MS, firing.labels)
    assert math.isnan(fired.value)  # an Alertmanager alert carries no sample value
    assert [(s.labels.get("instance"), s.status, s.starts_at_ms, s.ends_at_ms) for s in ev.snaps] == [
        (None, "resolved", STARTS_MS, ENDS_MS), ("b", "resolved", STARTS_MS, ENDS_MS)]
    assert ev.snaps[0].generator_url == firing.generator_url


def test_a_real_payload_round_trips_through_json() -> None:
    """What json.loads gives for a body (numbers as int, nested objects) parses; the input is not changed."""
    body = json.loads(json.dumps(webhook(alert(), alert(fp="ff", instance="x"))))
    before = copy.deepcopy(body)
    assert len(parse_webhook(body).alerts) == 2
    assert body == before


def _nested(depth: int) -> dict[str, Any]:
    """An object nested ``depth`` levels deep."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


OUT_OF_RANGE = [
    ("year 10000 via an offset", "alerts.0.startsAt", "9999-12-31T23:59:59-01:00", "alerts[0].startsAt"),
    ("year 10000 via an offset, fraction", "alerts.0.startsAt", "9999-12-31T23:30:00.999999999-00:59",
     "alerts[0].startsAt"),
    ("endsAt year 10000", "alerts.0.endsAt", "9999-12-31T23:59:59-01:00", "alerts[0].endsAt"),
    ("startsAt year 0000", "alerts.0.startsAt", "0000-01-01T00:00:00Z", "alerts[0].startsAt"),
    ("endsAt year 0000", "alerts.0.endsAt", "0000-12-31T23:59:59Z", "alerts[0].endsAt"),
    ("startsAt -infinity", "alerts.0.startsAt", "-infinity", "alerts[0].startsAt"),
    ("endsAt infinity", "alerts.0.endsAt", "infinity", "alerts[0].endsAt"),
    ("startsAt NaN", "alerts.0.startsAt", "NaN", "alerts[0].startsAt"),
    ("startsAt huge fraction", "alerts.0.startsAt", "2025-06-15T15:00:00." + "9" * 40 + "Z", "alerts[0].startsAt"),
    ("startsAt 5-digit year", "alerts.0.startsAt", "10000-01-01T00:00:00Z", "alerts[0].startsAt"),
    ("endsAt past 2**63 ms", "alerts.0.endsAt", "292278994-08-17T07:12:55.807Z", "alerts[0].endsAt"),
]


@pytest.mark.parametrize("what, path, text, word", OUT_OF_RANGE, ids=[o[0] for o in OUT_OF_RANGE])
def test_a_time_outside_the_representable_range_is_refused_naming_the_field(what: str, path: str, text: str,
                                                                              word: str) -> None:
    """A startsAt or endsAt the agent could not format back (year 10000 in UTC, year 0, infinities, NaN,
    runaway fractions) is a ValueError naming the field, never an alert stored to break every report."""
    body = _set(path, text)
    body["alerts"][0]["status"] = "resolved" if "endsAt" in path else "firing"
    with pytest.raises(ValueError) as err:
        parse_webhook(body)
    assert str(err.value).startswith(word)


def test_the_last_representable_time_is_taken_and_formats_back() -> None:
    """The latest time taken still formats as RFC 3339 with a day to spare (reports add windows around it)."""
    hook = parse_webhook(webhook(alert(starts=iso_ms(MAX_TIME_MS))))
    assert hook.alerts[0].starts_ms == MAX_TIME_MS
    assert format_go_time(MAX_TIME_MS + 86_400_000).startswith("9999-")


@pytest.mark.parametrize("where", ["somethingNew", "groupLabels", "alerts.0.annotations", "alerts.0.extra"])
@pytest.mark.parametrize("depth", [40, 500, 900])
def test_a_deeply_nested_webhook_is_refused_naming_the_depth(where: str, depth: int) -> None:
    """Nesting past a webhook's own few levels (anywhere, even under keys that are ignored) is a ValueError."""
    with pytest.raises(ValueError, match="nested"):
        parse_webhook(_set(where, _nested(depth)))


@pytest.mark.parametrize("where", ["receiver", "alerts.0.labels.instance", "alerts.0.annotations.summary",
                                   "groupKey", "alerts.0.generatorURL"])
def test_a_lone_surrogate_anywhere_is_refused(where: str) -> None:
    """A string JSON can carry but UTF-8 cannot (a lone surrogate) is a ValueError, never stored or logged."""
    with pytest.raises(ValueError, match="lone surrogate"):
        parse_webhook(_set(where, "x\ud800y"))
