"""Scale-out/in decisions over the real SQLite state database, with injected times (Unix ms)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent.act.notification import AlertSnapshot, Notification
from agent.act.scaling import Scaler, idempotency_key
from agent.act.state import ScaleState, StateDB
from agent.config import ScalingConfig, ScalingServiceConfig
from agent.errors import StateError

T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z
LONG_AGO = T0 - 10 * 3600_000  # an agent that has watched for hours
WEBHOOK = {"url": "http://127.0.0.1:9/scale"}
# The alerts below started 300 s before T0; with the 180 s scale_out_cooldown a decision at T0 falls in the
# cooldown window that began at start + 180 s = T0 - 120 s, one at T0 + 180 s in the window from T0 + 60 s.
WINDOW_T0 = T0 - 120_000


def service(**kw: Any) -> ScalingServiceConfig:
    return ScalingServiceConfig.model_validate({"name": "vllm", **kw})


def scaling(*services: ScalingServiceConfig, dry_run: bool = False) -> ScalingConfig:
    return ScalingConfig(dry_run=dry_run, services=list(services))


def alert(name: str = "VLLMScaleOutNeeded", value: float = 3.5, **labels: str) -> AlertSnapshot:
    return AlertSnapshot(labels={"alertname": name, "action": "scale_out", **labels},
                         annotations={"summary": "Requests are waiting.", "description": "waiting > 2x running"},
                         status="firing", starts_at_ms=T0 - 300_000, value=value)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    """A fresh state database file."""
    d = StateDB(tmp_path / "state.db")
    yield d
    d.close()


def open_incident(db: StateDB, a: AlertSnapshot) -> None:
    db.incidents.open(fingerprint=a.fingerprint, alertname=a.labels["alertname"], labels=a.labels,
                     severity="warning", summary="", started_ms=a.starts_at_ms)


def action_events(db: StateDB) -> list[dict[str, Any]]:
    return [e.detail for inc in db.incidents.list() for e in inc.events if e.kind == "action"]


def test_out_then_cooldown_refusal_then_out_again(db: StateDB) -> None:
    """A scale-out steps 2->3; another inside scale_out_cooldown (3m) is refused; at 3m it steps 3->4."""
    s = Scaler(scaling(service()), db, started_ms=LONG_AGO)
    d1 = s.decide("out", alert(), service=None, now_ms=T0)
    assert (d1.service, d1.direction, d1.from_replicas, d1.to_replicas, d1.acted) == ("vllm", "out", 2, 3, True)
    assert d1.notification is None  # no webhook: the exported desired replicas are the output
    assert db.cooldowns.get("vllm") == ScaleState("vllm", replicas=3, desired=3, last_out_ms=T0, last_in_ms=0,
                                              last_unhealthy_ms=0)
    d2 = s.decide("out", alert(), service=None, now_ms=T0 + 179_999)
    assert not d2.acted and not d2.dry_run
    assert "scale_out_cooldown" in d2.reason
    assert (d2.from_replicas, d2.to_replicas) == (3, 3)
    d3 = s.decide("out", alert(), service=None, now_ms=T0 + 180_000)
    assert (d3.from_replicas, d3.to_replicas, d3.acted) == (3, 4, True)
    assert s.desired_replicas() == {"vllm": 4}


def test_out_with_webhook_queues_the_request_in_the_outbox(db: StateDB) -> None:
    """With a webhook, acting queues one scale notification whose payload is the documented body."""
    a = alert()
    open_incident(db, a)
    s = Scaler(scaling(service(webhook=WEBHOOK)), db, started_ms=LONG_AGO)
    d = s.decide("out", a, service="vllm", now_ms=T0, values={"waiting": 40.0})
    key = f"scale:vllm:out:2->3:{WINDOW_T0}"
    assert d.acted and d.notification is not None
    n = d.notification
    assert (n.key, n.receiver, n.kind, n.created_ms) == (key, "scale:vllm", "scale", T0)
    assert n.scale == {
        "service": "vllm", "direction": "out", "from_replicas": 2, "to_replicas": 3, "replicas": 3, "step": 1,
        "reason": "VLLMScaleOutNeeded firing: Requests are waiting.",
        "alert": {"name": "VLLMScaleOutNeeded", "labels": a.labels, "annotations": a.annotations,
                  "startsAt": "2023-11-14T22:08:20.000Z", "fingerprint": a.fingerprint},
        "values": {"alert_value": 3.5, "waiting": 40.0},
        "idempotency_key": key, "dry_run": False, "decided_at": "2023-11-14T22:13:20.000Z",
    }
    [item] = db.outbox.pending()
    assert (item.key, item.receiver, item.kind) == (key, "scale:vllm", "scale")
    assert item.notification() == n
    # the receiver has not confirmed yet: replicas stays, desired moves
    state = db.cooldowns.get("vllm")
    assert state is not None and (state.replicas, state.desired) == (2, 3)
    assert s.desired_replicas() == {"vllm": 3}
    [event] = action_events(db)
    assert event["dry_run"] is False and event["queued"] is True and event["idempotency_key"] == key


def test_on_ack_sets_replicas_from_the_reply(db: StateDB) -> None:
    """The receiver's reported replicas become current; a reply without an integer changes nothing."""
    s = Scaler(scaling(service(webhook=WEBHOOK)), db, started_ms=LONG_AGO)
    d = s.decide("out", alert(), service=None, now_ms=T0)
    assert d.notification is not None
    s.on_ack(d.notification, {"replicas": True, "applied": True})
    s.on_ack(d.notification, {"replicas": "3"})
    s.on_ack(d.notification, None)
    assert db.cooldowns.get("vllm").replicas == 2  # type: ignore[union-attr]
    s.on_ack(d.notification, {"replicas": 3, "targets": [], "applied": True})
    assert db.cooldowns.get("vllm").replicas == 3  # type: ignore[union-attr]
    later = s.decide("out", alert(), service=None, now_ms=T0 + 180_000)
    assert (later.from_replicas, later.to_replicas) == (3, 4)


def test_unacknowledged_request_is_asked_again_as_an_absolute_count(db: StateDB) -> None:
    """Without an ack the next scale-out (after the cooldown) asks for the same absolute count again."""
    s = Scaler(scaling(service(webhook=WEBHOOK)), db, started_ms=LONG_AGO)
    s.decide("out", alert(), service=None, now_ms=T0)
    again = s.decide("out", alert(), service=None, now_ms=T0 + 180_000)
    assert again.notification is not None and again.notification.scale is not None
    assert again.notification.scale["replicas"] == 3
    assert [i.key for i in db.outbox.pending()] == [f"scale:vllm:out:2->3:{WINDOW_T0}",
                                                 f"scale:vllm:out:2->3:{T0 + 60_000}"]


def test_out_refused_at_max_and_step_clamped(db: StateDB) -> None:
    """Scale-out never passes max_replicas: a step of 3 from 6 stops at 8, and at 8 it is refused."""
    s = Scaler(scaling(service(initial_replicas=6, step=3)), db, started_ms=LONG_AGO)
    d = s.decide("out", alert(), service=None, now_ms=T0)
    assert (d.from_replicas, d.to_replicas, d.acted) == (6, 8, True)
    refused = s.decide("out", alert(), service=None, now_ms=T0 + 3600_000)
    assert not refused.acted and refused.reason == "at max_replicas (8)"


def test_in_waits_for_healthy_for_since_start_and_since_the_last_unhealthy_mark(db: StateDB) -> None:
    """Scale-in needs 15m healthy: counted from the agent's start, and again from the last unhealthy mark."""
    s = Scaler(scaling(service(initial_replicas=5)), db, started_ms=T0)
    early = s.decide("in", alert("VLLMFleetIdle"), service="vllm", now_ms=T0 + 899_999)
    assert not early.acted and "healthy for 14m59s999ms since the agent started" in early.reason
    d = s.decide("in", alert("VLLMFleetIdle"), service="vllm", now_ms=T0 + 900_000)
    assert (d.from_replicas, d.to_replicas, d.acted) == (5, 4, True)
    t1 = T0 + 1_000_000
    s.mark_unhealthy("vllm", t1)
    blocked = s.decide("in", alert("VLLMFleetIdle"), service="vllm", now_ms=t1 + 899_999)
    assert not blocked.acted and "scale_in_healthy_for is 15m" in blocked.reason
    ok = s.decide("in", alert("VLLMFleetIdle"), service="vllm", now_ms=t1 + 900_000)
    assert (ok.from_replicas, ok.to_replicas, ok.acted) == (4, 3, True)


def test_in_bounded_by_min(db: StateDB) -> None:
    """A step of 2 from 3 stops at min_replicas 2; at 2 scale-in is refused."""
    s = Scaler(scaling(service(initial_replicas=3, step=2)), db, started_ms=LONG_AGO)
    d = s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0)
    assert (d.from_replicas, d.to_replicas, d.acted) == (3, 2, True)
    refused = s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 3600_000)
    assert not refused.acted and refused.reason == "at min_replicas (2)"


def test_in_refused_within_scale_in_cooldown_of_a_scale_out(db: StateDB) -> None:
    """A scale-in less than scale_in_cooldown (10m) after a scale-out is refused; at 10m it is allowed."""
    s = Scaler(scaling(service()), db, started_ms=LONG_AGO)
    assert s.decide("out", alert(), service=None, now_ms=T0).acted
    refused = s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 599_999)
    assert not refused.acted
    assert refused.reason == "scale_in_cooldown: last scale-out 9m59s999ms ago, cooldown 10m"
    d = s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 600_000)
    assert (d.from_replicas, d.to_replicas, d.acted) == (3, 2, True)


def test_in_refused_within_scale_in_cooldown_of_a_scale_in(db: StateDB) -> None:
    """Two scale-ins are at least scale_in_cooldown apart."""
    s = Scaler(scaling(service(initial_replicas=8)), db, started_ms=LONG_AGO)
    assert s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0).acted
    refused = s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 300_000)
    assert refused.reason == "scale_in_cooldown: last scale-in 5m ago, cooldown 10m"
    assert s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 600_000).to_replicas == 6


@pytest.mark.parametrize(("global_dry", "service_dry"), [(True, False), (False, True)])
def test_dry_run_records_but_changes_and_queues_nothing(db: StateDB, global_dry: bool, service_dry: bool) -> None:
    """Dry-run (global or per service) returns what it would do, records it, and persists/queues nothing."""
    a = alert()
    open_incident(db, a)
    s = Scaler(scaling(service(webhook=WEBHOOK, dry_run=service_dry), dry_run=global_dry), db, started_ms=LONG_AGO)
    d = s.decide("out", a, service=None, now_ms=T0)
    assert (d.from_replicas, d.to_replicas, d.acted, d.dry_run, d.notification) == (2, 3, False, True, None)
    assert db.cooldowns.get("vllm") is None
    assert db.outbox.pending() == []
    assert s.desired_replicas() == {"vllm": 2}
    [event] = action_events(db)
    assert event["dry_run"] is True and event["action"] == "scale_out" and event["to_replicas"] == 3


def test_dry_run_is_paced_by_the_cooldown_in_memory(db: StateDB) -> None:
    """Dry-run decide (run every evaluation) would scale again only after the cooldown, persisting nothing."""
    a = alert()
    open_incident(db, a)
    s = Scaler(scaling(service(), dry_run=True), db, started_ms=LONG_AGO)
    first = s.decide("out", a, service=None, now_ms=T0)
    again = s.decide("out", a, service=None, now_ms=T0 + 15_000)
    later = s.decide("out", a, service=None, now_ms=T0 + 180_000)
    assert (first.to_replicas, first.dry_run) == (3, True)
    assert not again.dry_run and not again.acted and "scale_out_cooldown" in again.reason
    assert (later.from_replicas, later.to_replicas, later.dry_run) == (3, 4, True)
    assert [e["to_replicas"] for e in action_events(db)] == [3, 4]
    assert db.cooldowns.get("vllm") is None and db.outbox.pending() == []


def test_repeated_refusals_log_at_info_once(db: StateDB) -> None:
    """A refusal repeated every evaluation logs at info when it starts or changes kind, then at debug."""
    s = Scaler(scaling(service(initial_replicas=8)), db, started_ms=LONG_AGO)
    with capture_logs() as logs:
        for i in range(3):
            s.decide("out", alert(), service=None, now_ms=T0 + i * 15_000)
        s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 45_000)  # 8 -> 7 acts
        s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 60_000)  # cooldown
        s.decide("out", alert(), service=None, now_ms=T0 + 75_000)  # 7 -> 8 acts
        s.decide("out", alert(), service=None, now_ms=T0 + 90_000)  # at max again: info after the act
    refused = [(e["log_level"], e["direction"], e["reason"].split(" ")[0]) for e in logs
               if e["event"] == "scale refused"]
    assert refused == [("info", "out", "at"), ("debug", "out", "at"), ("debug", "out", "at"),
                       ("info", "in", "scale_in_cooldown:"), ("info", "out", "at")]


def test_restart_keeps_the_cooldown(tmp_path: Path) -> None:
    """A new Scaler over the same database file does not scale out again inside the cooldown."""
    path = tmp_path / "state.db"
    first = StateDB(path)
    assert Scaler(scaling(service(webhook=WEBHOOK)), first, started_ms=LONG_AGO).decide(
        "out", alert(), service=None, now_ms=T0).acted
    first.close()
    second = StateDB(path)
    s = Scaler(scaling(service(webhook=WEBHOOK)), second, started_ms=T0 + 10_000)
    d = s.decide("out", alert(), service=None, now_ms=T0 + 60_000)
    assert not d.acted and "scale_out_cooldown" in d.reason
    assert [i.key for i in second.outbox.pending()] == [f"scale:vllm:out:2->3:{WINDOW_T0}"]
    assert s.desired_replicas() == {"vllm": 3}
    second.close()


def test_a_failed_enqueue_rolls_back_the_decision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cooldown, the enqueue and the incident event commit together: if queueing fails, nothing is stamped."""
    db = StateDB(tmp_path / "state.db")
    real_enqueue = db.outbox.enqueue

    def enqueue(n: Notification, *, now_ms: int) -> bool:
        real_enqueue(n, now_ms=now_ms)
        raise StateError("disk full")

    monkeypatch.setattr(db.outbox, "enqueue", enqueue)
    a = alert()
    open_incident(db, a)
    s = Scaler(scaling(service(webhook=WEBHOOK)), db, started_ms=LONG_AGO)
    with pytest.raises(StateError):
        s.decide("out", a, service=None, now_ms=T0)
    assert db.cooldowns.get("vllm") is None
    assert db.outbox.pending() == []
    assert action_events(db) == []
    db.close()


def test_mark_unhealthy_is_persisted_at_most_once_a_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Marks inside a second after a write are not written, but still hold scale-in off."""
    writes: list[ScaleState] = []
    db = StateDB(tmp_path / "state.db")
    real_put = db.cooldowns.put

    def put(state: ScaleState) -> None:
        writes.append(state)
        real_put(state)

    monkeypatch.setattr(db.cooldowns, "put", put)
    s = Scaler(scaling(service(initial_replicas=4)), db, started_ms=LONG_AGO)
    for t in (T0, T0 + 500, T0 + 999):
        s.mark_unhealthy("vllm", t)
    assert [w.last_unhealthy_ms for w in writes] == [T0]
    blocked = s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 999 + 899_999)
    assert not blocked.acted  # the unwritten mark at T0+999 counts
    s.mark_unhealthy("vllm", T0 + 1000)
    assert [w.last_unhealthy_ms for w in writes] == [T0, T0 + 1000]
    assert db.cooldowns.get("vllm") == ScaleState("vllm", 4, 4, 0, 0, T0 + 1000)
    db.close()


def test_persisted_unhealthy_mark_counts_for_a_new_scaler(db: StateDB) -> None:
    """A mark written by one Scaler holds off scale-in for another over the same database."""
    Scaler(scaling(service(initial_replicas=4)), db, started_ms=T0).mark_unhealthy("vllm", T0 + 2000_000)
    s = Scaler(scaling(service(initial_replicas=4)), db, started_ms=T0)
    assert not s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 2000_000 + 899_999).acted
    assert s.decide("in", alert("VLLMFleetIdle"), service=None, now_ms=T0 + 2000_000 + 900_000).acted


def test_service_matching_by_name_and_by_matchers(db: StateDB) -> None:
    """A named service is found by name; otherwise the first service whose matchers fit the labels."""
    chat = ScalingServiceConfig(name="chat", matchers=['model_name="llama"'])
    code = ScalingServiceConfig(name="code", match={"model_name": "qwen"})
    anything = ScalingServiceConfig(name="default")
    s = Scaler(scaling(chat, code, anything), db, started_ms=LONG_AGO)
    assert s.service_for({"model_name": "qwen"}) is code
    assert s.service_for({"model_name": "llama"}) is chat
    assert s.service_for({"model_name": "mistral"}) is anything
    assert s.service_for({"model_name": "llama"}, "code") is code
    assert s.service_for({}, "nope") is None
    d = s.decide("out", alert(model_name="qwen"), service=None, now_ms=T0)
    assert d.service == "code" and d.acted


def test_no_matching_service_is_a_refusal(db: StateDB) -> None:
    """An alert no service matches is refused with a reason, and nothing is written."""
    s = Scaler(scaling(ScalingServiceConfig(name="chat", matchers=['model_name="llama"'])), db, started_ms=LONG_AGO)
    d = s.decide("out", alert(model_name="qwen"), service=None, now_ms=T0)
    assert (d.service, d.acted, d.notification) == ("", False, None)
    assert "no scaling service" in d.reason
    assert db.cooldowns.get("chat") is None


def test_non_finite_values_go_out_as_null(db: StateDB) -> None:
    """NaN/Inf values (not JSON) are sent as null."""
    s = Scaler(scaling(service(webhook=WEBHOOK)), db, started_ms=LONG_AGO)
    d = s.decide("out", alert(value=math.nan), service=None, now_ms=T0, values={"ratio": math.inf})
    assert d.notification is not None and d.notification.scale is not None
    assert d.notification.scale["values"] == {"alert_value": None, "ratio": None}


def test_hpa_example_bounds_are_the_defaults() -> None:
    """The guide's HPA example (min 2, max 8 replicas) is the default service config."""
    svc = ScalingServiceConfig(name="x")
    assert (svc.min_replicas, svc.max_replicas, svc.step, svc.initial_replicas) == (2, 8, 1, None)
    assert svc.scale_out_cooldown < svc.scale_in_cooldown  # scale-in deliberately slower


def test_desired_replicas_default_to_initial_then_min(db: StateDB) -> None:
    """Before any decision a service's desired count is initial_replicas, else min_replicas."""
    s = Scaler(scaling(service(initial_replicas=5), ScalingServiceConfig(name="b", min_replicas=1)), db,
               started_ms=LONG_AGO)
    assert s.desired_replicas() == {"vllm": 5, "b": 1}


def test_actions_are_counted_by_service_direction_and_outcome(db: StateDB) -> None:
    """Every decision counts once under acted, dry_run or refused; configured services start at 0."""
    s = Scaler(scaling(service(), service(name="lm", dry_run=True)), db, started_ms=LONG_AGO)
    assert set(s.actions().values()) == {0} and len(s.actions()) == 12  # 2 services x 2 directions x 3
    s.decide("out", alert(), service="vllm", now_ms=T0)  # acted
    s.decide("out", alert(), service="vllm", now_ms=T0 + 1)  # refused: cooldown
    s.decide("out", alert(), service="lm", now_ms=T0)  # dry run
    s.decide("out", alert(), service="nope", now_ms=T0)  # refused: no such service
    counts = {k: n for k, n in s.actions().items() if n}
    assert counts == {("vllm", "out", "acted"): 1, ("vllm", "out", "refused"): 1, ("lm", "out", "dry_run"): 1,
                      ("nope", "out", "refused"): 1}


def test_two_replicas_asking_for_the_same_step_use_one_key(tmp_path: Path) -> None:
    """Two scalers on separate databases (an HA pair), deciding on the same alert at the same aligned
    evaluation time, queue the same key, and report the same desired replicas; a clock reading of their
    own does not enter the key (a decision later in the same cooldown window keeps it)."""
    dbs = [StateDB(tmp_path / "a.db"), StateDB(tmp_path / "b.db")]
    try:
        a, b = (Scaler(scaling(service(webhook=WEBHOOK)), d, started_ms=LONG_AGO) for d in dbs)
        da = a.decide("out", alert(), service=None, now_ms=T0)
        db_ = b.decide("out", alert(), service=None, now_ms=T0 + 1_000)  # one evaluation later, same window
        assert da.notification is not None and db_.notification is not None
        assert da.notification.key == db_.notification.key == f"scale:vllm:out:2->3:{WINDOW_T0}"
        assert a.desired_replicas() == b.desired_replicas() == {"vllm": 3}
        # both learn the receiver's count (the first applied it, the second got the remembered answer)
        for s, d in ((a, da), (b, db_)):
            assert d.notification is not None
            s.on_ack(d.notification, {"replicas": 3, "applied": s is a})
        na = a.decide("out", alert(), service=None, now_ms=T0 + 180_000).notification
        nb = b.decide("out", alert(), service=None, now_ms=T0 + 181_000).notification
        assert na is not None and nb is not None
        assert na.key == nb.key == f"scale:vllm:out:3->4:{T0 + 60_000}"
        assert a.desired_replicas() == b.desired_replicas() == {"vllm": 4}
    finally:
        for d in dbs:
            d.close()


def test_key_windows_follow_the_direction_cooldown_and_a_new_alert_start(db: StateDB) -> None:
    """Scale-in counts windows of scale_in_cooldown; a later firing (a new startsAt) starts new windows;
    an alert without a start counts them from the epoch."""
    assert idempotency_key("vllm", "in", 4, 3, started_ms=T0, now_ms=T0 + 1_300_000, cooldown_s=600) \
        == f"scale:vllm:in:4->3:{T0 + 1_200_000}"
    assert idempotency_key("vllm", "out", 2, 3, started_ms=T0 + 5, now_ms=T0 + 5, cooldown_s=180) \
        == f"scale:vllm:out:2->3:{T0 + 5}"
    # 1_700_000_000_000 ms = 9_444_444 windows of 180 s and 80 s over
    assert idempotency_key("vllm", "out", 2, 3, started_ms=0, now_ms=T0, cooldown_s=180) \
        == f"scale:vllm:out:2->3:{T0 - 80_000}"
