"""Tests for agent.rules.manager: recording rules and the alert state machine, with Prometheus' semantics."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from agent.promql import Engine
from agent.rules.files import load_rule_files
from agent.rules.manager import Alert, AlertState, RuleManager
from agent.series import is_stale, labels_from
from agent.store import SeriesMatcher, Store

MIN = 60_000


def _manager(tmp_path: Path, rules: str, **kw: object) -> tuple[RuleManager, Store]:
    f = tmp_path / "r.rules.yaml"
    f.write_text(textwrap.dedent(rules))
    store = Store(retention_ms=2**40)
    return RuleManager(load_rule_files([f]), store, Engine(store), **kw), store  # type: ignore[arg-type]


def _feed(store: Store, name: str, labels: dict[str, str], values: list[float], step_ms: int = MIN) -> None:
    for i, v in enumerate(values):
        store.append(labels_from(name, labels), i * step_ms, v)


ALERT = """
groups:
  - name: g
    rules:
      - alert: QueueLong
        expr: queue > 10
        for: 3m
        labels: {severity: warning}
        annotations:
          summary: Queue is long.
          description: '{{ $labels.instance }} has {{ $value }} waiting'
"""


def test_pending_then_firing_exactly_at_for(tmp_path: Path) -> None:
    """An alert is pending from its first true evaluation and fires once `for` has elapsed."""
    mgr, store = _manager(tmp_path, ALERT)
    _feed(store, "queue", {"instance": "a"}, [0, 20, 20, 20, 20, 20, 0])
    states = []
    for t in range(7):
        events = mgr.eval_all(t * MIN)
        alerts = mgr.alerts()
        states.append((alerts[0].state.value if alerts else "none", [e.kind for e in events]))
    assert states == [
        ("none", []), ("pending", ["pending"]), ("pending", []), ("pending", []),
        ("firing", ["firing"]), ("firing", []), ("none", ["resolved"]),
    ]


def test_alert_labels_annotations_and_alerts_series(tmp_path: Path) -> None:
    """Firing alerts carry rule labels, templated annotations, and write ALERTS/ALERTS_FOR_STATE."""
    mgr, store = _manager(tmp_path, ALERT)
    _feed(store, "queue", {"instance": "a", "job": "vllm"}, [20] * 5)
    for t in range(5):
        mgr.eval_all(t * MIN)
    (alert,) = mgr.alerts()
    assert dict(alert.labels) == {"alertname": "QueueLong", "instance": "a", "job": "vllm", "severity": "warning"}
    assert alert.annotations == {"summary": "Queue is long.", "description": "a has 20 waiting"}
    assert alert.state is AlertState.FIRING and alert.active_at_ms == 0
    alerts = list(store.iter_series([SeriesMatcher("__name__", "=", "ALERTS")]))
    by_state = {dict(s.labels)["alertstate"]: s for s in alerts}
    assert set(by_state) == {"pending", "firing"}
    assert is_stale(by_state["pending"].vals[-1]) and by_state["firing"].vals[-1] == 1.0
    (for_state,) = store.iter_series([SeriesMatcher("__name__", "=", "ALERTS_FOR_STATE")])
    assert list(for_state.vals) == [0.0] * 5


def test_keep_firing_for(tmp_path: Path) -> None:
    """With keep_firing_for, a firing alert stays firing that long after the condition clears."""
    rules = ALERT.replace("for: 3m", "for: 0s\n        keep_firing_for: 2m")
    mgr, store = _manager(tmp_path, rules)
    _feed(store, "queue", {"instance": "a"}, [20, 0, 0, 0, 0])
    seen = []
    for t in range(5):
        mgr.eval_all(t * MIN)
        seen.append([a.state.value for a in mgr.alerts()])
    assert seen == [["firing"], ["firing"], ["firing"], [], []]


def test_pending_alert_forgotten_when_condition_clears(tmp_path: Path) -> None:
    """A pending alert that clears emits no resolved event and restarts its `for` when it returns."""
    mgr, store = _manager(tmp_path, ALERT)
    _feed(store, "queue", {"instance": "a"}, [20, 0, 20, 20])
    kinds = [[e.kind for e in mgr.eval_all(t * MIN)] for t in range(4)]
    assert kinds == [["pending"], [], ["pending"], []]
    assert mgr.alerts()[0].active_at_ms == 2 * MIN


def test_recording_rule_feeds_next_rule_in_same_evaluation(tmp_path: Path) -> None:
    """A recording rule's output is visible to the following rule at the same timestamp."""
    mgr, store = _manager(tmp_path, """
    groups:
      - name: g
        rules:
          - record: job:queue:sum
            expr: sum by (job) (queue)
            labels: {source: rule}
          - alert: JobQueueLong
            expr: job:queue:sum > 15
    """)
    _feed(store, "queue", {"instance": "a", "job": "vllm"}, [10])
    _feed(store, "queue", {"instance": "b", "job": "vllm"}, [10])
    events = mgr.eval_all(0)
    rec = store.get(labels_from("job:queue:sum", {"job": "vllm", "source": "rule"}))
    assert rec is not None and list(rec.vals) == [20.0]
    assert [e.kind for e in events] == ["firing"]


def test_recording_output_goes_stale_when_input_vanishes(tmp_path: Path) -> None:
    """A recorded series that is not produced again gets a staleness marker."""
    mgr, store = _manager(tmp_path, """
    groups:
      - name: g
        rules:
          - record: q2
            expr: queue * 2
    """)
    store.append(labels_from("queue", {"i": "a"}), 0, 1.0)
    mgr.eval_all(0)
    mgr.eval_all(10 * MIN)  # beyond the 5m lookback: queue is gone
    (s,) = store.iter_series([SeriesMatcher("__name__", "=", "q2")])
    assert s.vals[0] == 2.0 and is_stale(s.vals[-1])


def test_duplicate_labelset_is_a_rule_error(tmp_path: Path) -> None:
    """Rule labels that collapse two series into one labelset fail the rule, like Prometheus."""
    mgr, store = _manager(tmp_path, """
    groups:
      - name: g
        rules:
          - record: x
            expr: queue
            labels: {i: same}
    """)
    _feed(store, "queue", {"i": "a"}, [1])
    _feed(store, "queue", {"i": "b"}, [1])
    mgr.eval_all(0)
    rule = mgr.groups[0].rules[0]
    assert rule.health == "err" and "same labelset" in rule.last_error


def test_api_shapes(tmp_path: Path) -> None:
    """alerts_json and rules_json follow Prometheus' /api/v1 shapes."""
    mgr, store = _manager(tmp_path, ALERT)
    _feed(store, "queue", {"instance": "a"}, [20])
    mgr.eval_all(0)
    (a,) = mgr.alerts_json()
    assert a["state"] == "pending" and a["value"] == "2e+01" and a["activeAt"] == "1970-01-01T00:00:00.000Z"
    (g,) = mgr.rules_json()
    (r,) = g["rules"]
    assert r["type"] == "alerting" and r["state"] == "pending" and r["duration"] == 180 and r["health"] == "ok"
    assert r["query"] == "queue > 10" and len(r["alerts"]) == 1


@pytest.mark.parametrize(("value", "text"), [(20.0, "2e+01"), (0.5, "5e-01"), (1e21, "1e+21"), (float("nan"), "NaN")])
def test_alert_value_formatting(value: float, text: str) -> None:
    """Alert values print the way Prometheus' API prints them: Go's FormatFloat(v, 'e', -1, 64)."""
    alert = Alert((("alertname", "A"),), {}, value, AlertState.PENDING, 0)
    assert alert.as_json()["value"] == text


def test_saved_alert_values_restore_exactly(tmp_path: Path) -> None:
    """Alert state saved as strict JSON (NaN and infinities as Go writes them) restores the same values."""
    alerts = "".join(f"      - alert: A{i}\n        expr: vector({v})\n        for: 1h\n"
                     for i, v in enumerate(["20", "-3.25", "NaN", "+Inf", "-Inf"]))
    rules = "groups:\n  - name: g\n    rules:\n" + alerts
    mgr, _ = _manager(tmp_path, rules)
    mgr.eval_all(0)
    saved = {k: (0, saved) for g in mgr.groups for k, saved in mgr.export_group(g).items()}
    restored, _ = _manager(tmp_path, rules)
    assert restored.restore(json.loads(json.dumps(saved, allow_nan=False)), 0, outage_tolerance_ms=MIN) == 5
    assert restored.alerts_json() == mgr.alerts_json()
    assert [a["value"] for a in restored.alerts_json()] == ["2e+01", "-3.25e+00", "NaN", "+Inf", "-Inf"]
