"""RuleManager.eval_group_remote: the state machine over a remote source, and Prometheus'
failure semantics (``rules/alerting.go``): a failed query changes no alert, marks the rule
unhealthy with the error, and is counted per group."""

from __future__ import annotations

from pathlib import Path

from agent.errors import SourceError
from agent.promql import Engine
from agent.rules.files import load_rule_files
from agent.rules.manager import AlertState, Result, RuleManager
from agent.series import labels_from
from agent.store import Store

S = 1000
T0 = 1_767_225_600_000
RULES = """
groups:
  - name: remote
    interval: 15s
    rules:
      - alert: QueueGrowing
        expr: sum by (model_name) (vllm:num_requests_waiting) > 10
        for: 1m
        labels: {severity: warning}
        annotations: {summary: "queue {{ $value }}"}
"""
ELEMENT = labels_from(None, {"model_name": "llama"})


class FakeServer:
    """Answers each query with the current ``answer``; a SourceError answer is raised as the server failing."""

    def __init__(self) -> None:
        self.answer: Result | SourceError = [(ELEMENT, 42.0)]
        self.queries: list[tuple[str, int]] = []

    async def query(self, expr: str, at_ms: int) -> Result:
        self.queries.append((expr, at_ms))
        if isinstance(self.answer, SourceError):
            raise self.answer
        return self.answer


def _manager(tmp_path: Path) -> RuleManager:
    f = tmp_path / "r.rules.yaml"
    f.write_text(RULES)
    store = Store(3_600_000)
    return RuleManager(load_rule_files([f]), store, Engine(store))


async def test_the_rule_text_is_queried_at_the_evaluation_time(tmp_path: Path) -> None:
    manager, server = _manager(tmp_path), FakeServer()
    (group,) = manager.groups
    events = await manager.eval_group_remote(group, T0, server.query)
    assert server.queries == [("sum by (model_name) (vllm:num_requests_waiting) > 10", T0)]
    assert [(e.kind, e.alert.labels) for e in events] == [
        ("pending", labels_from(None, {"alertname": "QueueGrowing", "model_name": "llama", "severity": "warning"}))]
    assert events[0].alert.annotations == {"summary": "queue 42"}


async def test_a_failed_evaluation_keeps_a_pending_alert_and_its_for_timer(tmp_path: Path) -> None:
    manager, server = _manager(tmp_path), FakeServer()
    (group,) = manager.groups
    await manager.eval_group_remote(group, T0, server.query)
    server.answer = SourceError("http://prometheus:9090/api/v1/query: ClientConnectorError")
    for t in (15, 30, 45):
        assert await manager.eval_group_remote(group, T0 + t * S, server.query) == []
        (alert,) = manager.alerts()
        assert (alert.state, alert.active_at_ms) == (AlertState.PENDING, T0)
    rule = group.rules[0]
    assert (rule.health, group.failures) == ("err", 3)
    assert "ClientConnectorError" in rule.last_error
    server.answer = [(ELEMENT, 42.0)]
    events = await manager.eval_group_remote(group, T0 + 60 * S, server.query)  # for: 1m elapsed during the outage
    assert [e.kind for e in events] == ["firing"]
    assert (rule.health, rule.last_error) == ("ok", "")


async def test_a_failed_evaluation_never_resolves_a_firing_alert(tmp_path: Path) -> None:
    manager, server = _manager(tmp_path), FakeServer()
    (group,) = manager.groups
    for t in (0, 60):
        await manager.eval_group_remote(group, T0 + t * S, server.query)
    assert [a.state for a in manager.alerts()] == [AlertState.FIRING]
    server.answer = SourceError("partial answer refused (partial_response: abort): store down")
    for t in range(75, 75 + 2 * 60, 15):  # two minutes of failures
        assert await manager.eval_group_remote(group, T0 + t * S, server.query) == []
    assert [a.state for a in manager.alerts()] == [AlertState.FIRING]
    server.answer = []  # the condition really cleared: now it resolves
    events = await manager.eval_group_remote(group, T0 + 200 * S, server.query)
    assert [e.kind for e in events] == ["resolved"]


async def test_remote_and_embedded_evaluation_agree_on_the_same_data(tmp_path: Path) -> None:
    """The same store answering both ways: the events are the same."""
    f = tmp_path / "r.rules.yaml"
    f.write_text(RULES)
    store = Store(3_600_000)
    for i in range(14):
        store.append(labels_from("vllm:num_requests_waiting", {"model_name": "llama", "instance": "a"}),
                     T0 - 60 * S + i * 15 * S, 50.0)
    embedded = RuleManager(load_rule_files([f]), store, Engine(store))
    remote = RuleManager(load_rule_files([f]), store, Engine(store))

    async def via_engine(expr: str, at_ms: int) -> Result:
        return remote._query(remote.groups[0].rules[0], at_ms)

    for t in (0, 15, 30, 60, 75):
        a = embedded.eval_group(embedded.groups[0], T0 + t * S)
        b = await remote.eval_group_remote(remote.groups[0], T0 + t * S, via_engine)
        assert [(e.kind, e.alert.labels, e.alert.value) for e in a] == \
            [(e.kind, e.alert.labels, e.alert.value) for e in b]


async def test_a_new_state_database_takes_active_at_from_the_servers_alerts_for_state(tmp_path: Path) -> None:
    """Pending for 50 s elsewhere (ALERTS_FOR_STATE on the server): the alert fires 10 s later, not 60 s."""
    manager, server = _manager(tmp_path), FakeServer()
    (group,) = manager.groups
    await manager.eval_group_remote(group, T0, server.query)
    alert_labels = dict(manager.alerts()[0].labels)
    server.answer = [(labels_from(None, {**alert_labels, "replica": "b"}), (T0 - 50 * S) / 1000),
                     (labels_from(None, {"alertname": "QueueGrowing", "model_name": "other"}), (T0 - 900 * S) / 1000)]
    assert await manager.restore_remote(group, T0, server.query, outage_tolerance_ms=3_600_000) == 1
    assert server.queries[-1] == ('last_over_time(ALERTS_FOR_STATE{alertname="QueueGrowing"}[3600s])', T0)
    assert manager.alerts()[0].active_at_ms == T0 - 50 * S
    server.answer = [(ELEMENT, 42.0)]
    events = await manager.eval_group_remote(group, T0 + 10 * S, server.query)
    assert [e.kind for e in events] == ["firing"]
    assert await manager.restore_remote(group, T0, server.query, outage_tolerance_ms=3_600_000) == 0  # once


async def test_no_remote_restore_over_state_from_the_database(tmp_path: Path) -> None:
    manager, server = _manager(tmp_path), FakeServer()
    (group,) = manager.groups
    key = manager.rule_key(group, 0)
    manager.restore({key: (T0, [])}, T0, outage_tolerance_ms=3_600_000)
    await manager.eval_group_remote(group, T0, server.query)
    assert await manager.restore_remote(group, T0, server.query, outage_tolerance_ms=3_600_000) == 0
    assert len(server.queries) == 1  # only the evaluation


async def test_restoring_thousands_of_alerts_matches_each_with_its_own_series(tmp_path: Path) -> None:
    """5,000 pending alerts against 10,000 ALERTS_FOR_STATE series (two replicas each, half older): every alert
    takes its own earliest activeAt, and the event loop stays free while they are matched."""
    import asyncio

    manager, server = _manager(tmp_path), FakeServer()
    (group,) = manager.groups
    n = 5000
    server.answer = [(labels_from(None, {"model_name": f"m{i}"}), 42.0) for i in range(n)]
    await manager.eval_group_remote(group, T0, server.query)
    base = {"alertname": "QueueGrowing", "severity": "warning"}
    server.answer = [(labels_from(None, {**base, "model_name": f"m{i}", "replica": r}), (T0 - (i % 50 + d) * S) / 1000)
                     for i in range(n) for r, d in (("a", 1), ("b", 2))]
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    try:
        assert await manager.restore_remote(group, T0, server.query, outage_tolerance_ms=3_600_000) == n
    finally:
        task.cancel()
    assert ticks > 1  # the loop ran the ticker while the alerts were matched in a worker thread
    by_model = {dict(a.labels)["model_name"]: a.active_at_ms for a in manager.alerts()}
    assert all(by_model[f"m{i}"] == T0 - (i % 50 + 2) * S for i in range(n))
