"""Tests for agent.act.state: the outbox, alert state, silences and incidents in SQLite."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.act.notification import AlertSnapshot, Notification
from agent.act.state import NflogEntry, ScaleState, StateDB
from agent.errors import StateError
from tests.conftest import REPO

HOUR = 3_600_000
DAY = 24 * HOUR


def note(key: str, receiver: str = "slack", created_ms: int = 1000) -> Notification:
    alert = AlertSnapshot(labels={"alertname": "VLLMKVCacheSaturated", "instance": "gpu-1:8000"},
                          annotations={"summary": "KV cache full"}, status="firing", starts_at_ms=500)
    return Notification(key=key, receiver=receiver, kind="alerts", created_ms=created_ms, group_key="{}:{}",
                        alerts=(alert,))


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    d = StateDB(tmp_path / "state.db")
    yield d
    d.close()


# -- outbox -------------------------------------------------------------------------------------


def test_due_is_fifo_per_receiver(db: StateDB) -> None:
    """due() returns only the oldest item of a receiver; the next one after the head is acked."""
    for k in ("a1", "a2", "a3"):
        assert db.enqueue(note(k), now_ms=1000)
    assert [i.key for i in db.due(1000)] == ["a1"]
    db.ack(db.due(1000)[0].id, now_ms=1001)
    assert [i.key for i in db.due(1001)] == ["a2"]
    assert [i.key for i in db.pending("slack")] == ["a2", "a3"]


def test_a_receiver_backing_off_does_not_block_another(db: StateDB) -> None:
    """A receiver whose head is waiting for its retry time leaves other receivers' heads due."""
    db.enqueue(note("s1", "slack"), now_ms=1000)
    db.enqueue(note("s2", "slack"), now_ms=1000)
    db.enqueue(note("w1", "webhook"), now_ms=1000)
    head = db.due(1000)[0]
    assert head.key == "s1"
    db.begin_attempt(head.id, next_attempt_ms=5000)
    assert [i.key for i in db.due(1000)] == ["w1"]  # s2 stays behind s1 (FIFO), webhook goes on
    assert {i.key for i in db.due(5000)} == {"s1", "w1"}
    assert db.outbox_depth() == {"slack": 2, "webhook": 1}


def test_begin_attempt_then_retry_records_attempts_and_error(db: StateDB) -> None:
    """begin_attempt counts the try and sets the retry time; retry sets the error and a new time."""
    db.enqueue(note("k"), now_ms=1000)
    item = db.due(1000)[0]
    assert (item.attempts, item.next_attempt_ms, item.last_error) == (0, 1000, "")
    db.begin_attempt(item.id, next_attempt_ms=31_000)
    after_crash = db.pending()[0]
    assert (after_crash.attempts, after_crash.next_attempt_ms) == (1, 31_000)
    db.retry(item.id, next_attempt_ms=3000, error="HTTP 503")
    again = db.pending()[0]
    assert (again.attempts, again.next_attempt_ms, again.last_error) == (1, 3000, "HTTP 503")
    assert db.due(2999) == []
    assert again.notification() == note("k")


def test_duplicate_key_is_refused_while_queued_and_after_delivery(db: StateDB) -> None:
    """enqueue is False for a key already queued, and for one already delivered (the delivered table)."""
    assert db.enqueue(note("k"), now_ms=1000)
    assert not db.enqueue(note("k"), now_ms=1001)
    db.ack(db.pending()[0].id, now_ms=2000)
    assert db.pending() == []
    assert not db.enqueue(note("k"), now_ms=3000)
    assert db.enqueue(note("other"), now_ms=3000)


def test_fail_moves_the_item_to_failed(db: StateDB) -> None:
    """fail() removes the item from the queue and keeps it, with the error, in failed()."""
    db.enqueue(note("k", "webhook"), now_ms=1000)
    item = db.pending()[0]
    db.begin_attempt(item.id, next_attempt_ms=2000)
    db.fail(item.id, error="HTTP 400 bad payload", now_ms=2500)
    assert db.pending() == []
    assert db.outbox_depth() == {}
    [f] = db.failed()
    assert (f["key"], f["receiver"], f["attempts"], f["error"], f["failed_ms"]) == (
        "k", "webhook", 1, "HTTP 400 bad payload", 2500)
    assert f["payload"]["key"] == "k"


def test_replace_payload_keeps_place_and_key(db: StateDB) -> None:
    """replace_payload swaps the notification but keeps the item's id, key and FIFO position."""
    db.enqueue(note("first", "am"), now_ms=1000)
    db.enqueue(note("second", "am"), now_ms=1000)
    head = db.due(1000)[0]
    merged = note("merged", "am", created_ms=1500)
    db.replace_payload(head.id, merged)
    new_head = db.due(1000)[0]
    assert (new_head.id, new_head.key) == (head.id, "first")
    assert new_head.notification() == merged


# -- durability and transactions --------------------------------------------------------------------

_CHILD = """
import os, signal, sys
from agent.act.notification import Notification
from agent.act.state import StateDB, ScaleState
db = StateDB(sys.argv[1])
db.enqueue(Notification(key="k1", receiver="slack", kind="alerts", created_ms=1), now_ms=1)
item = db.pending()[0]
db.begin_attempt(item.id, next_attempt_ms=60000)
db.add_silence(['alertname="X"'], starts_ms=0, ends_ms=10**13, created_by="child", comment="c")
db.put_scale(ScaleState("api", 2, 3, 100, 0, 0))
db.save_rule_alerts("r1", [{"labels": {"a": "b"}, "active_at_ms": 5}], 42)
db.open_incident(fingerprint="f", alertname="X", labels={}, severity="warning", summary="s", started_ms=7)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_committed_writes_survive_a_killed_process(tmp_path: Path) -> None:
    """Writes made by a process that is then SIGKILLed are all there when the file is reopened."""
    path = tmp_path / "state.db"
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], cwd=REPO, capture_output=True, text=True,
                          check=False, timeout=120)
    assert proc.returncode == -9, proc.stderr
    db = StateDB(path)
    try:
        [item] = db.pending()
        assert (item.key, item.attempts, item.next_attempt_ms) == ("k1", 1, 60_000)
        assert [s.created_by for s in db.silences(now_ms=1)] == ["child"]
        assert db.get_scale("api") == ScaleState("api", 2, 3, 100, 0, 0)
        assert db.load_rule_alerts() == {"r1": (42, [{"labels": {"a": "b"}, "active_at_ms": 5}])}
        assert [i.fingerprint for i in db.incidents()] == ["f"]
    finally:
        db.close()


def test_transaction_rolls_back_on_exception(db: StateDB) -> None:
    """An exception inside transaction() undoes every write made inside it."""
    with pytest.raises(RuntimeError), db.transaction():
        db.enqueue(note("k"), now_ms=1)
        db.put_kv("group", "{}")
        raise RuntimeError("boom")
    assert db.pending() == []
    assert db.get_kv("group") is None
    assert db.enqueue(note("k"), now_ms=2)  # the key was not remembered either


def test_nested_transaction_rolls_back_only_the_inner_level(db: StateDB) -> None:
    """A failing inner transaction undoes its own writes; the outer one still commits."""
    with db.transaction():
        db.put_kv("outer", "1")
        with pytest.raises(RuntimeError), db.transaction():
            db.put_kv("inner", "1")
            raise RuntimeError("boom")
        with db.transaction():
            db.put_kv("inner2", "1")
    assert (db.get_kv("outer"), db.get_kv("inner"), db.get_kv("inner2")) == ("1", None, "1")


def test_outer_rollback_undoes_committed_inner_levels(db: StateDB) -> None:
    """An inner level that completed is still undone when the outer transaction fails."""
    with pytest.raises(RuntimeError), db.transaction():
        with db.transaction():
            db.put_kv("inner", "1")
        raise RuntimeError("boom")
    assert db.get_kv("inner") is None


def test_second_writer_on_the_same_file(tmp_path: Path) -> None:
    """A second StateDB (the CLI) writes silences from a thread while the first reads; all land."""
    path = tmp_path / "state.db"
    daemon, cli = StateDB(path), StateDB(path)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(50):
                cli.add_silence([f'instance="gpu-{i}"'], starts_ms=0, ends_ms=DAY, created_by="cli", comment="")
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    t = threading.Thread(target=write)
    t.start()
    seen = 0
    while t.is_alive():
        now = daemon.silences(now_ms=1)
        assert len(now) >= seen  # each read is a consistent snapshot that never goes backwards
        seen = len(now)
    t.join()
    assert errors == []
    assert len(daemon.silences(now_ms=1)) == 50
    daemon.close()
    cli.close()


def test_writer_waits_for_another_connections_transaction(tmp_path: Path) -> None:
    """A write blocked by another connection's open transaction waits (busy_timeout) and then lands."""
    path = tmp_path / "state.db"
    daemon, cli = StateDB(path), StateDB(path)
    done = threading.Event()
    with daemon.transaction():
        daemon.put_kv("x", "1")
        t = threading.Thread(target=lambda: (cli.put_kv("y", "2"), done.set()))
        t.start()
    t.join()
    assert done.is_set()
    assert (daemon.get_kv("x"), daemon.get_kv("y")) == ("1", "2")
    daemon.close()
    cli.close()


def test_locked_database_raises_state_error(tmp_path: Path) -> None:
    """With no busy timeout left, a write against a held lock is a StateError naming path and operation."""
    path = tmp_path / "state.db"
    daemon, cli = StateDB(path), StateDB(path, busy_timeout_ms=0)
    with daemon.transaction():
        daemon.put_kv("x", "1")
        with pytest.raises(StateError, match=r"state\.db.*begin transaction.*locked") as info:
            cli.put_kv("y", "2")
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)
    daemon.close()
    cli.close()


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    """A path in a directory that does not exist gives StateError naming the path and the directory."""
    path = tmp_path / "nope" / "state.db"
    with pytest.raises(StateError, match=r"nope/state\.db.*does not exist"):
        StateDB(path)


def test_a_file_that_is_not_a_database_is_a_state_error(tmp_path: Path) -> None:
    """Opening a non-SQLite file gives StateError naming the path, caused by the sqlite3 error."""
    path = tmp_path / "notes.txt"
    path.write_text("hello, this is not SQLite\n" * 100)
    with pytest.raises(StateError, match=r"notes\.txt") as info:
        StateDB(path)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    """A file whose user_version is newer than this code's schema is refused, not modified."""
    path = tmp_path / "state.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(StateError, match="schema version 99"):
        StateDB(path)


def test_closed_database_raises_state_error(tmp_path: Path) -> None:
    """Any call after close() is a StateError, not an AttributeError."""
    d = StateDB(tmp_path / "s.db")
    d.close()
    with pytest.raises(StateError, match="closed"):
        d.get_kv("x")


def test_memory_database_works() -> None:
    """":memory:" opens a private in-memory database."""
    d = StateDB(":memory:")
    d.put_kv("a", "b")
    assert d.get_kv("a") == "b"
    d.close()


def test_wal_and_full_sync_are_set(tmp_path: Path) -> None:
    """The file is in WAL mode and the connection syncs FULL (2), as the outbox guarantee needs."""
    d = StateDB(tmp_path / "s.db")
    with d._guard("test") as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert c.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert c.execute("PRAGMA user_version").fetchone()[0] == 1
    d.close()


# -- alert state, nflog, kv, refs, scale ----------------------------------------------------------


def test_rule_alerts_are_replaced_per_rule(db: StateDB) -> None:
    """save_rule_alerts replaces that rule's alerts only; an empty list still records the eval time."""
    db.save_rule_alerts("g/A", [{"fp": "1"}, {"fp": "2"}], 100)
    db.save_rule_alerts("g/B", [{"fp": "3"}], 100)
    db.save_rule_alerts("g/A", [], 200)
    assert db.load_rule_alerts() == {"g/A": (200, []), "g/B": (100, [{"fp": "3"}])}


def test_nflog_kv_refs_and_scale_round_trip(db: StateDB) -> None:
    """Each keyed table returns what was put, None when absent, and forgets on delete."""
    entry = NflogEntry(frozenset({"a", "b"}), frozenset({"c"}), 123)
    assert db.get_nflog("slack", "g") is None
    db.put_nflog("slack", "g", entry)
    assert db.get_nflog("slack", "g") == entry
    assert db.get_nflog("am", "g") is None
    db.delete_nflog("slack", "g")
    assert db.get_nflog("slack", "g") is None

    db.put_kv("groups", '{"a": 1}')
    db.put_kv("groups", '{"a": 2}')
    assert db.get_kv("groups") == '{"a": 2}'

    db.put_ref("slack", "g", "C123", "1700000000.000100")
    assert db.get_ref("slack", "g") == ("C123", "1700000000.000100")
    db.delete_ref("slack", "g")
    assert db.get_ref("slack", "g") is None

    assert db.get_scale("api") is None
    db.put_scale(ScaleState("api", 2, 3, 10, 0, 5))
    db.put_scale(ScaleState("api", 3, 3, 10, 0, 5))
    assert db.get_scale("api") == ScaleState("api", 3, 3, 10, 0, 5)


# -- silences -----------------------------------------------------------------------------------


def test_silence_states(db: StateDB) -> None:
    """A silence is pending before its start, active in [start, end), expired from its end on."""
    s = db.add_silence(['alertname="VLLMKVCacheSaturated"', 'instance=~"gpu-1.*"'], starts_ms=1000,
                       ends_ms=2000, created_by="ops", comment="maintenance")
    assert s.matchers == ['alertname="VLLMKVCacheSaturated"', 'instance=~"gpu-1.*"']
    assert [(t, s.active(t), s.state(t)) for t in (999, 1000, 1999, 2000)] == [
        (999, False, "pending"), (1000, True, "active"), (1999, True, "active"), (2000, False, "expired")]
    assert [x.id for x in db.silences(now_ms=1500)] == [s.id]
    assert db.silences(now_ms=2000) == []
    assert db.silences(now_ms=2000, include_expired=True) == [s]


def test_silence_to_json_is_alertmanager_shaped(db: StateDB) -> None:
    """to_json has Alertmanager's fields: RFC 3339 times, matcher objects, status.state."""
    s = db.add_silence(['instance!~"gpu-1.*"', "job=vllm"], starts_ms=1_700_000_000_000,
                       ends_ms=1_700_007_200_000, created_by="ops", comment="c")
    j = s.to_json(now_ms=1_700_000_000_000)
    assert j == {
        "id": s.id, "createdBy": "ops", "comment": "c", "status": {"state": "active"},
        "startsAt": "2023-11-14T22:13:20.000Z", "endsAt": "2023-11-15T00:13:20.000Z",
        "matchers": [{"name": "instance", "value": "gpu-1.*", "isRegex": True, "isEqual": False},
                     {"name": "job", "value": "vllm", "isRegex": False, "isEqual": True}],
    }


def test_expire_silence(db: StateDB) -> None:
    """expire ends an active silence now, ends a pending one too, and is False when unknown/expired."""
    active = db.add_silence(['a="1"'], starts_ms=0, ends_ms=10_000, created_by="x", comment="")
    pending = db.add_silence(['a="2"'], starts_ms=8000, ends_ms=10_000, created_by="x", comment="")
    assert db.expire_silence(active.id, now_ms=5000)
    assert db.expire_silence(pending.id, now_ms=5000)
    assert not db.expire_silence(active.id, now_ms=6000)
    assert not db.expire_silence("no-such-id", now_ms=6000)
    assert db.silences(now_ms=5000) == []
    states = {s.id: (s.starts_ms, s.ends_ms, s.state(5000)) for s in db.silences(now_ms=5000, include_expired=True)}
    assert states == {active.id: (0, 5000, "expired"), pending.id: (5000, 5000, "expired")}


@pytest.mark.parametrize(("matchers", "reason"), [
    (["alertname"], "bad matcher"),
    (['instance=~"("'], "not a regular expression"),
    ([], "at least one matcher"),
    (['instance=~".*"'], "empty string"),
])
def test_bad_silences_are_value_errors(db: StateDB, matchers: list[str], reason: str) -> None:
    """A bad matcher, no matcher, or matchers that match everything raise ValueError with the reason."""
    with pytest.raises(ValueError, match=reason):
        db.add_silence(matchers, starts_ms=0, ends_ms=1, created_by="x", comment="")
    assert db.silences(now_ms=0, include_expired=True) == []


def test_silence_ending_before_it_starts_is_refused(db: StateDB) -> None:
    """ends_ms <= starts_ms raises ValueError."""
    with pytest.raises(ValueError, match="before it starts"):
        db.add_silence(['a="1"'], starts_ms=5, ends_ms=5, created_by="x", comment="")


# -- incidents ----------------------------------------------------------------------------------


def _open(db: StateDB, fp: str, started: int) -> int:
    return db.open_incident(fingerprint=fp, alertname="VLLMQueueBuildup", labels={"service": "api"},
                            severity="warning", summary="requests queue", started_ms=started)


def test_incident_lifecycle(db: StateDB) -> None:
    """open -> events -> resolve: events come back in time order, the open incident gets them."""
    iid = _open(db, "fp1", 1000)
    assert _open(db, "fp1", 1500) == iid  # idempotent while open
    db.add_incident_event("fp1", at_ms=1000, kind="fired", detail={"value": 12.5})
    db.add_incident_event("fp1", at_ms=1200, kind="notified", detail={"receiver": "slack"})
    db.add_incident_event("fp1", at_ms=1300, kind="action", detail={"action": "scale_out", "from": 2, "to": 3})
    db.add_incident_event("fp1", at_ms=5000, kind="resolved", detail={})
    db.resolve_incident("fp1", resolved_ms=5000)
    db.add_incident_event("fp1", at_ms=5100, kind="notified", detail={"receiver": "slack"})  # the resolve message
    db.add_incident_event("unknown", at_ms=1, kind="notified", detail={})  # ignored
    [inc] = db.incidents()
    assert (inc.id, inc.started_ms, inc.resolved_ms, inc.labels) == (iid, 1000, 5000, {"service": "api"})
    assert [(e.at_ms, e.kind) for e in inc.events] == [
        (1000, "fired"), (1200, "notified"), (1300, "action"), (5000, "resolved"), (5100, "notified")]
    assert inc.events[2].detail == {"action": "scale_out", "from": 2, "to": 3}
    assert db.incidents(open_only=True) == []
    j = inc.to_json()
    assert (j["status"], j["startsAt"], j["endsAt"]) == ("resolved", "1970-01-01T00:00:01.000Z",
                                                         "1970-01-01T00:00:05.000Z")


def test_a_new_firing_after_resolve_is_a_new_incident(db: StateDB) -> None:
    """After resolve, open_incident starts a second incident; events go to the open one; newest first."""
    first = _open(db, "fp", 1000)
    db.resolve_incident("fp", resolved_ms=2000)
    db.add_incident_event("fp", at_ms=2100, kind="notified", detail={"receiver": "slack"})  # to the latest
    second = _open(db, "fp", 3000)
    other = _open(db, "fp-other", 2500)
    assert second != first
    db.add_incident_event("fp", at_ms=3100, kind="finding", detail={"kind": "gpu-oom-runtime", "summary": "OOM"})
    assert [i.id for i in db.incidents()] == [second, other, first]
    assert [i.id for i in db.incidents(open_only=True)] == [second, other]
    assert [i.id for i in db.incidents(limit=1)] == [second]
    by_id = {i.id: i for i in db.incidents()}
    assert [e.kind for e in by_id[second].events] == ["finding"]
    assert [e.kind for e in by_id[first].events] == ["notified"]
    assert by_id[other].events == []


def test_prune_drops_only_old_rows(db: StateDB) -> None:
    """prune drops resolved incidents, failed items and expired silences older than keep; delivered
    keys are kept at least 24 h; open incidents and queued items are never dropped."""
    now = 10 * DAY
    for fp in ("old", "recent", "open"):
        _open(db, fp, 0)
        db.add_incident_event(fp, at_ms=0, kind="fired", detail={})
    db.resolve_incident("old", resolved_ms=now - 3 * HOUR)  # older than keep (2 h): dropped
    db.resolve_incident("recent", resolved_ms=now - HOUR)  # kept
    # "open" stays open: kept
    db.enqueue(note("f-old"), now_ms=0)
    db.fail(db.pending()[0].id, error="x", now_ms=now - 3 * HOUR)  # dropped
    db.enqueue(note("f-new"), now_ms=0)
    db.fail(db.pending()[0].id, error="x", now_ms=now - HOUR)  # kept
    db.add_silence(['a="1"'], starts_ms=0, ends_ms=now - 3 * HOUR, created_by="x", comment="")  # dropped
    db.add_silence(['a="2"'], starts_ms=0, ends_ms=now - HOUR, created_by="x", comment="")  # kept
    db.enqueue(note("d-old"), now_ms=0)
    db.ack(db.pending()[0].id, now_ms=now - 25 * HOUR)  # older than 24 h: dropped
    db.enqueue(note("d-new"), now_ms=0)
    db.ack(db.pending()[0].id, now_ms=now - 3 * HOUR)  # older than keep but within 24 h: kept
    db.enqueue(note("queued"), now_ms=0)  # queued: kept

    assert db.prune(now_ms=now, keep_ms=2 * HOUR) == 4
    assert sorted(i.fingerprint for i in db.incidents()) == ["open", "recent"]
    assert [f["key"] for f in db.failed()] == ["f-new"]
    assert [s.matchers for s in db.silences(now_ms=now, include_expired=True)] == [['a="2"']]
    assert db.enqueue(note("d-old"), now_ms=now)  # forgotten
    assert not db.enqueue(note("d-new"), now_ms=now)  # still refused
    assert [i.key for i in db.pending()] == ["queued", "d-old"]
    with db._guard("test") as c:
        assert c.execute("SELECT COUNT(*) FROM incident_events").fetchone()[0] == 2  # recent's and open's
