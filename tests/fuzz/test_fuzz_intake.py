"""Fuzz the two intakes of a running agent: ``POST /api/v1/alertmanager/webhook`` and ``POST /api/v1/findings``
with any JSON-ish body answer 200 or 400 within a few seconds, never 500, and the agent goes on answering.

The bodies are shaped like the real thing (each field right, wrong, missing or hostile: times past year
9999 through an offset, year 0, ``-infinity``, NaN, runaway fractions, integers past 2**63, nesting
hundreds of levels deep) so that most examples get past the first check, plus arbitrary JSON and bytes.
One agent (in-memory state, no targets, HTTP on 127.0.0.1:0) serves every example, on an event loop in a
thread of its own, as in :mod:`tests.fuzz.test_fuzz_silences`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from hypothesis import event, example, given
from hypothesis import strategies as st

from tests.fuzz import budget
from tests.fuzz.running import JSON_VALUES, RunningAgent

WEBHOOK = "/api/v1/alertmanager/webhook"
FINDINGS = "/api/v1/findings"


@pytest.fixture(scope="module")
def running() -> Iterator[RunningAgent]:
    """One agent for all examples of this module."""
    agent = RunningAgent("fuzz-intake")
    yield agent
    agent.close()


def _nested(depth: int) -> Any:
    value: Any = "x"
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


_JSON = JSON_VALUES
_DEEP = (st.sampled_from([17, 100, 400, 600]) | st.integers(1, 600)).map(_nested)  # the server test goes deeper
_ANY = st.one_of(_JSON, _DEEP)
_HOSTILE_TEXT = st.sampled_from(["", "x\n[FIRING] forged", "\x1b[2J", "\u202e", "x" * 5000])
_TEXT = st.integers(0, 19).flatmap(lambda i: _HOSTILE_TEXT if i == 0 else st.text(max_size=12))
_SURROGATE = st.text(max_size=6).map(lambda t: t + "\ud800")  # valid JSON ("\\ud800"), not valid UTF-8
_GOOD_TIME = st.one_of(st.sampled_from(["2025-06-15T15:00:00.123456789Z", "9999-12-30T23:59:59Z"]),
                       st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(9999, 12, 1)).map(
                           lambda d: d.isoformat(timespec="milliseconds") + "Z"))
_BAD_TIME = st.one_of(
    st.sampled_from(["0001-01-01T00:00:00Z", "9999-12-31T23:59:59-01:00", "9999-12-31T23:30:00.5-00:59",
                     "0000-01-01T00:00:00Z", "-infinity", "infinity", "NaN", "2025-06-15T15:00:00." + "9" * 50 + "Z",
                     "2025-13-45T25:61:61Z", "0001-01-01T00:00:00+23:59", "1969-12-31T23:59:59Z",
                     "+292278994-08-17T07:12:55Z"]), _TEXT, _JSON)


Field = tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]  # (a right value, a wrong or hostile one)


def _shaped(draw: st.DrawFn, fields: dict[str, Field]) -> dict[str, Any]:
    """An object with every field right except at most two, each of those wrong, hostile or missing: most
    examples get past the first checks to the later ones (times, nesting, the state database)."""
    broken = draw(st.lists(st.sampled_from(sorted(fields)), min_size=2, max_size=2, unique=True))
    broken = broken[:max(0, draw(st.integers(-3, 2)))]  # none in four of six objects, else one or two
    out: dict[str, Any] = {}
    for name, (good, bad) in fields.items():
        if name not in broken:
            out[name] = draw(good)
        elif draw(st.integers(0, 4)):
            out[name] = draw(bad)
    return out


_NAME = st.sampled_from(["alertname", "instance", "severity", "gpu", "Hostname", "node"])
_GOOD_LABELS = st.dictionaries(_NAME, _TEXT, max_size=4).map(lambda d: {"alertname": "X", **d})
_BAD_LABELS = st.one_of(st.dictionaries(st.sampled_from(["a b", "", "x" * 2000]), _TEXT, min_size=1, max_size=2),
                        _ANY)
_LABELS: Field = (_GOOD_LABELS, _BAD_LABELS)
_TIME: Field = (_GOOD_TIME, _BAD_TIME)
_STR: Field = (_TEXT, _JSON | _SURROGATE)


@st.composite
def _alert(draw: st.DrawFn) -> dict[str, Any]:
    """One alert of a webhook."""
    alert = _shaped(draw, {
        "status": (st.sampled_from(["firing", "resolved"]), st.sampled_from(["pending", ""]) | _JSON),
        "labels": _LABELS, "annotations": _LABELS, "startsAt": _TIME, "endsAt": _TIME, "generatorURL": _STR,
        "fingerprint": (st.sampled_from(["0123456789abcdef", "00ff"]), st.just("x'y") | _JSON)})
    if draw(st.integers(0, 9)) == 0:
        alert["extra"] = draw(_ANY)
    return alert


@st.composite
def _webhook(draw: st.DrawFn) -> dict[str, Any]:
    """Bodies shaped like Alertmanager's version-4 webhook."""
    body = _shaped(draw, {
        "version": (st.just("4"), st.sampled_from(["3", ""]) | _JSON),
        "status": (st.sampled_from(["firing", "resolved"]), _JSON), "receiver": _STR, "groupKey": _STR,
        "groupLabels": _LABELS, "commonLabels": _LABELS, "commonAnnotations": _LABELS, "externalURL": _STR,
        "truncatedAlerts": (st.integers(0, 10), st.sampled_from([2**64, -(2**63) - 1]) | _JSON),
        "alerts": (st.lists(_alert(), min_size=1, max_size=2), _ANY)})
    if draw(st.integers(0, 9)) == 0:
        body["notification_reason"] = draw(_ANY)
    return body


@st.composite
def _forwarded(draw: st.DrawFn) -> dict[str, Any]:
    """Bodies shaped like a forwarded finding."""
    plain_labels = st.dictionaries(_NAME, _TEXT, max_size=3)
    finding = _shaped(draw, {
        "kind": (st.sampled_from(["gpu-oom-runtime", "nccl-slow"]), st.sampled_from(["Has Space", ""]) | _JSON),
        "summary": (st.text(min_size=1, max_size=20).filter(str.strip), _TEXT | _JSON),
        "severity": (st.sampled_from(["critical", "warning", "info"]), st.just("page") | _JSON),
        "ok": (st.booleans(), _JSON), "evidence": (st.lists(_TEXT, max_size=3), _ANY),
        "details": (st.dictionaries(st.text(max_size=4), _JSON, max_size=3)  # often deep: the 500 of issue 23
                    | st.dictionaries(st.text(max_size=4), _DEEP, min_size=1, max_size=1), _ANY),
        "labels": (plain_labels, _BAD_LABELS), "runbook_url": (_TEXT, _SURROGATE | _JSON)})
    alert = _shaped(draw, {"labels": _LABELS, "startsAt": (
        st.integers(0, 253_402_214_399_999),
        st.sampled_from([2**63, 2**64 + 1, -1, 10**30, 253_402_300_800_000]) | st.floats() | _TEXT)})
    return _shaped(draw, {
        "version": (st.just("1"), st.just("2") | _JSON),
        "key": (st.from_regex(r"finding:forward:[a-f0-9]{6}:[0-9]{1,4}", fullmatch=True),
                st.sampled_from(["a b", ""]) | _JSON),
        "finding": (st.just(finding), _ANY), "labels": (plain_labels, _BAD_LABELS),
        "alert": (st.just(alert), _ANY)})


def _encode(value: Any) -> bytes:
    """JSON as a client would send it; a lone surrogate goes out as its escape, NaN as Python writes it."""
    return json.dumps(value).encode()


def _bodies(shaped: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """Shaped bodies four times in six, any JSON or any bytes otherwise."""
    return st.integers(0, 5).flatmap(lambda i: shaped.map(_encode) if i < 4 else _ANY.map(_encode) if i == 4
                                     else st.binary(max_size=40))


_WEBHOOK_BODY = _bodies(_webhook())
_FINDING_BODY = _bodies(_forwarded())


def _deep_text(levels: int) -> str:
    """JSON nested ``levels`` deep, written as text: ``json.dumps`` itself would recurse that deep."""
    return '{"a":[' * (levels // 2) + "1" + "]}" * (levels // 2)


def _with_deep(body: bytes, levels: int) -> bytes:
    """``body`` with its ``"DEEP"`` placeholder replaced by :func:`_deep_text`."""
    return body.replace(b'"DEEP"', _deep_text(levels).encode())


def _known_webhook(**alert: Any) -> bytes:
    """A valid webhook around one alert changed by ``alert``: the hostile cases issue 23 reproduced."""
    base = {"status": "firing", "labels": {"alertname": "X"}, "annotations": {}, "startsAt": "2025-06-15T15:00:00Z",
            "endsAt": "0001-01-01T00:00:00Z", "generatorURL": "", "fingerprint": "0123456789abcdef"}
    return _encode({"version": "4", "groupKey": "{}", "status": "firing", "receiver": "r", "groupLabels": {},
                    "commonLabels": {}, "commonAnnotations": {}, "externalURL": "", "alerts": [{**base, **alert}]})


def _known_finding(**change: Any) -> bytes:
    """A valid forwarded finding changed by ``change``."""
    return _encode({"version": "1", "key": "finding:forward:abc:1", "finding": {"kind": "x", "summary": "s"},
                    **change})


@budget(60)
@example(data=_known_webhook(startsAt="9999-12-31T23:59:59-01:00"))
@example(data=_known_webhook(status="resolved", endsAt="9999-12-31T23:30:00.5-00:59"))
@example(data=_known_webhook(annotations={"summary": "x\ud800"}))
@example(data=_with_deep(_known_webhook(extra="DEEP"), 600))
@example(data=_with_deep(_known_webhook(extra="DEEP"), 1500))  # hypothesis runs examples with a limit of ~2,100
@example(data=_with_deep(_known_webhook(extra="DEEP"), 3000))
@given(data=_WEBHOOK_BODY)
def test_any_webhook_body_answers_200_or_400(running: RunningAgent, data: bytes) -> None:
    """Any POST to the Alertmanager intake gets 200 or 400 in the API's envelope, and the agent stays healthy."""
    status, body = running.post(WEBHOOK, data)
    event(f"HTTP {status}: {str(body.get('error', ''))[:40]}")  # --hypothesis-show-statistics: what was reached
    assert status in (200, 400), (status, body)
    assert body["status"] == ("success" if status == 200 else "error")
    assert running.status("/healthz") == 200


@budget(60)
@example(data=_with_deep(_known_finding(key="finding:forward:abc:2", finding={"kind": "x", "summary": "s",
                                                                              "details": {"k": "DEEP"}}), 600))
@example(data=_with_deep(_known_finding(key="finding:forward:abc:3", finding={"kind": "x", "summary": "s",
                                                                              "details": {"k": "DEEP"}}), 1500))
@example(data=_with_deep(_known_finding(key="finding:forward:abc:4", finding={"kind": "x", "summary": "s",
                                                                              "details": {"k": "DEEP"}}), 3000))
@example(data=_known_finding(alert={"labels": {"alertname": "X"}, "startsAt": 2**63 + 1}))
@example(data=_known_finding(labels={"node": "x\ud800"}))
@given(data=_FINDING_BODY)
def test_any_findings_body_answers_200_or_400(running: RunningAgent, data: bytes) -> None:
    """Any POST to the findings intake gets 200 or 400 in the API's envelope, and the agent stays healthy."""
    status, body = running.post(FINDINGS, data)
    event(f"HTTP {status}: {str(body.get('error', ''))[:40]}")
    assert status in (200, 400), (status, body)
    assert body["status"] == ("success" if status == 200 else "error")
    assert running.status("/healthz") == 200


def test_the_agent_still_lists_its_incidents_after_the_fuzzing(running: RunningAgent) -> None:
    """Whatever the intakes took, ``/api/v1/incidents`` still answers (nothing stored that breaks it)."""
    assert running.status("/api/v1/incidents") == 200
