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
from tests.statefiles import damaged_state_db, empty_state_db, state_db_with_rows

HOUR = 3_600_000
DAY = 24 * HOUR


def note(key: str, receiver: str = "slack", created_ms: int = 1000) -> Notification:
    alert = AlertSnapshot(labels={"alertname": "VLLMKVCacheSaturated", "instance": "gpu-1:8000"},
                          annotations={"summary": "KV cache full"}, status="firing", starts_at_ms=500)
    return Notification(key=key, receiver=receiver, kind="alerts", created_ms=created_ms, group_key="{}:{}",
                        alerts=(alert,))


def put(db: StateDB, key: str, value: str) -> None:
    """A one-row write to test transactions with (a service's scale state, replicas = value)."""
    db.cooldowns.put(ScaleState(key, int(value), int(value), 0, 0, 0))


def get(db: StateDB, key: str) -> str | None:
    state = db.cooldowns.get(key)
    return None if state is None else str(state.replicas)


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    d = StateDB(tmp_path / "state.db")
    yield d
    d.close()


# -- outbox -------------------------------------------------------------------------------------


def test_due_is_fifo_per_receiver(db: StateDB) -> None:
    """due() returns only the oldest item of a receiver; the next one after the head is acked."""
    for k in ("a1", "a2", "a3"):
        assert db.outbox.enqueue(note(k), now_ms=1000)
    assert [i.key for i in db.outbox.due(1000)] == ["a1"]
    db.outbox.ack(db.outbox.due(1000)[0].id, now_ms=1001)
    assert [i.key for i in db.outbox.due(1001)] == ["a2"]
    assert [i.key for i in db.outbox.pending("slack")] == ["a2", "a3"]


def test_a_receiver_backing_off_does_not_block_another(db: StateDB) -> None:
    """A receiver whose head is waiting for its retry time leaves other receivers' heads due."""
    db.outbox.enqueue(note("s1", "slack"), now_ms=1000)
    db.outbox.enqueue(note("s2", "slack"), now_ms=1000)
    db.outbox.enqueue(note("w1", "webhook"), now_ms=1000)
    head = db.outbox.due(1000)[0]
    assert head.key == "s1"
    db.outbox.begin_attempt(head.id, next_attempt_ms=5000)
    assert [i.key for i in db.outbox.due(1000)] == ["w1"]  # s2 stays behind s1 (FIFO), webhook goes on
    assert {i.key for i in db.outbox.due(5000)} == {"s1", "w1"}
    assert db.outbox.depth() == {"slack": 2, "webhook": 1}


def test_begin_attempt_then_retry_records_attempts_and_error(db: StateDB) -> None:
    """begin_attempt counts the try and sets the retry time; retry sets the error and a new time."""
    db.outbox.enqueue(note("k"), now_ms=1000)
    item = db.outbox.due(1000)[0]
    assert (item.attempts, item.next_attempt_ms, item.last_error) == (0, 1000, "")
    db.outbox.begin_attempt(item.id, next_attempt_ms=31_000)
    after_crash = db.outbox.pending()[0]
    assert (after_crash.attempts, after_crash.next_attempt_ms) == (1, 31_000)
    db.outbox.retry(item.id, next_attempt_ms=3000, error="HTTP 503")
    again = db.outbox.pending()[0]
    assert (again.attempts, again.next_attempt_ms, again.last_error) == (1, 3000, "HTTP 503")
    assert db.outbox.due(2999) == []
    assert again.notification() == note("k")


def test_duplicate_key_is_refused_while_queued_and_after_delivery(db: StateDB) -> None:
    """enqueue is False for a key already queued, and for one already delivered (the delivered table)."""
    assert db.outbox.enqueue(note("k"), now_ms=1000)
    assert not db.outbox.enqueue(note("k"), now_ms=1001)
    db.outbox.ack(db.outbox.pending()[0].id, now_ms=2000)
    assert db.outbox.pending() == []
    assert not db.outbox.enqueue(note("k"), now_ms=3000)
    assert db.outbox.enqueue(note("other"), now_ms=3000)


def test_fail_moves_the_item_to_failed(db: StateDB) -> None:
    """fail() removes the item from the queue and keeps it, with the error, in failed()."""
    db.outbox.enqueue(note("k", "webhook"), now_ms=1000)
    item = db.outbox.pending()[0]
    db.outbox.begin_attempt(item.id, next_attempt_ms=2000)
    db.outbox.fail(item.id, error="HTTP 400 bad payload", now_ms=2500)
    assert db.outbox.pending() == []
    assert db.outbox.depth() == {}
    [f] = db.outbox.failed()
    assert (f["key"], f["receiver"], f["attempts"], f["error"], f["failed_ms"]) == (
        "k", "webhook", 1, "HTTP 400 bad payload", 2500)
    assert f["payload"]["key"] == "k"


def test_replace_payload_keeps_place_and_key(db: StateDB) -> None:
    """replace_payload swaps the notification but keeps the item's id, key and FIFO position."""
    db.outbox.enqueue(note("first", "am"), now_ms=1000)
    db.outbox.enqueue(note("second", "am"), now_ms=1000)
    head = db.outbox.due(1000)[0]
    merged = note("merged", "am", created_ms=1500)
    db.outbox.replace_payload(head.id, merged)
    new_head = db.outbox.due(1000)[0]
    assert (new_head.id, new_head.key) == (head.id, "first")
    assert new_head.notification() == merged


# -- durability and transactions --------------------------------------------------------------------

_CHILD = """
import os, signal, sys
from agent.act.notification import Notification
from agent.act.state import StateDB, ScaleState
db = StateDB(sys.argv[1])
db.outbox.enqueue(Notification(key="k1", receiver="slack", kind="alerts", created_ms=1), now_ms=1)
item = db.outbox.pending()[0]
db.outbox.begin_attempt(item.id, next_attempt_ms=60000)
db.silences.add(['alertname="X"'], starts_ms=0, ends_ms=10**13, created_by="child", comment="c")
db.cooldowns.put(ScaleState("api", 2, 3, 100, 0, 0))
db.alert_states.save("r1", [{"labels": {"a": "b"}, "active_at_ms": 5}], 42)
db.incidents.open(fingerprint="f", alertname="X", labels={}, severity="warning", summary="s", started_ms=7)
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
        [item] = db.outbox.pending()
        assert (item.key, item.attempts, item.next_attempt_ms) == ("k1", 1, 60_000)
        assert [s.created_by for s in db.silences.list(now_ms=1)] == ["child"]
        assert db.cooldowns.get("api") == ScaleState("api", 2, 3, 100, 0, 0)
        assert db.alert_states.load() == {"r1": (42, [{"labels": {"a": "b"}, "active_at_ms": 5}])}
        assert [i.fingerprint for i in db.incidents.list()] == ["f"]
    finally:
        db.close()


def test_transaction_rolls_back_on_exception(db: StateDB) -> None:
    """An exception inside transaction() undoes every write made inside it."""
    with pytest.raises(RuntimeError), db.transaction():
        db.outbox.enqueue(note("k"), now_ms=1)
        put(db, "group", "1")
        raise RuntimeError("boom")
    assert db.outbox.pending() == []
    assert get(db, "group") is None
    assert db.outbox.enqueue(note("k"), now_ms=2)  # the key was not remembered either


def test_nested_transaction_rolls_back_only_the_inner_level(db: StateDB) -> None:
    """A failing inner transaction undoes its own writes; the outer one still commits."""
    with db.transaction():
        put(db, "outer", "1")
        with pytest.raises(RuntimeError), db.transaction():
            put(db, "inner", "1")
            raise RuntimeError("boom")
        with db.transaction():
            put(db, "inner2", "1")
    assert (get(db, "outer"), get(db, "inner"), get(db, "inner2")) == ("1", None, "1")


def test_outer_rollback_undoes_committed_inner_levels(db: StateDB) -> None:
    """An inner level that completed is still undone when the outer transaction fails."""
    with pytest.raises(RuntimeError), db.transaction():
        with db.transaction():
            put(db, "inner", "1")
        raise RuntimeError("boom")
    assert get(db, "inner") is None


def test_second_writer_on_the_same_file(tmp_path: Path) -> None:
    """A second StateDB (the CLI) writes silences from a thread while the first reads; all land."""
    path = tmp_path / "state.db"
    daemon, cli = StateDB(path), StateDB(path)
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for i in range(50):
                cli.silences.add([f'instance="gpu-{i}"'], starts_ms=0, ends_ms=DAY, created_by="cli", comment="")
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    t = threading.Thread(target=write)
    t.start()
    seen = 0
    while t.is_alive():
        now = daemon.silences.list(now_ms=1)
        assert len(now) >= seen  # each read is a consistent snapshot that never goes backwards
        seen = len(now)
    t.join()
    assert errors == []
    assert len(daemon.silences.list(now_ms=1)) == 50
    daemon.close()
    cli.close()


def test_writer_waits_for_another_connections_transaction(tmp_path: Path) -> None:
    """A write blocked by another connection's open transaction waits (busy_timeout) and then lands."""
    path = tmp_path / "state.db"
    daemon, cli = StateDB(path), StateDB(path)
    done = threading.Event()
    with daemon.transaction():
        put(daemon, "x", "1")
        t = threading.Thread(target=lambda: (put(cli, "y", "2"), done.set()))
        t.start()
    t.join()
    assert done.is_set()
    assert (get(daemon, "x"), get(daemon, "y")) == ("1", "2")
    daemon.close()
    cli.close()


def test_locked_database_raises_state_error(tmp_path: Path) -> None:
    """With no busy timeout left, a write against a held lock is a StateError naming path and operation."""
    path = tmp_path / "state.db"
    daemon, cli = StateDB(path), StateDB(path, busy_timeout_ms=0)
    with daemon.transaction():
        put(daemon, "x", "1")
        with pytest.raises(StateError, match=r"state\.db.*begin transaction.*locked") as info:
            put(cli, "y", "2")
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


def test_damaged_database_is_refused_naming_the_file_and_the_outbox(tmp_path: Path) -> None:
    """A real state file with garbage over its middle pages fails the start-up check, naming the file,
    saying to move it aside and that its outbox may hold undelivered notifications."""
    path = damaged_state_db(tmp_path / "state.db")
    with pytest.raises(StateError, match=r"state\.db.*damaged") as info:
        StateDB(path)
    text = str(info.value)
    assert f"mv {path} {path}.damaged" in text and "outbox" in text and "never delivered" in text
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError) or "quick_check" in text


def test_an_undamaged_file_with_rows_opens(tmp_path: Path) -> None:
    """The same file, not damaged, passes the check and keeps its rows (the check reads, never repairs)."""
    path = state_db_with_rows(tmp_path / "state.db")
    d = StateDB(path)
    assert len(d.outbox.pending()) == 300
    d.close()


def test_zero_byte_file_is_refused_not_started_fresh(tmp_path: Path) -> None:
    """A zero-byte state file is a start-up error naming the file; it is left as it was, not made a new database."""
    path = empty_state_db(tmp_path / "state.db")
    with pytest.raises(StateError, match=r"state\.db.*empty \(0 bytes\)") as info:
        StateDB(path)
    assert "outbox" in str(info.value) and "mv " in str(info.value)
    assert path.stat().st_size == 0


def test_a_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    """An SQLite file with tables but no sre-agent schema version is refused, not mixed with ours."""
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE photos (id INTEGER PRIMARY KEY)")
    conn.close()
    with pytest.raises(StateError, match=r"other\.db.*no sre-agent schema version"):
        StateDB(path)


def test_closed_database_raises_state_error(tmp_path: Path) -> None:
    """Any call after close() is a StateError, not an AttributeError."""
    d = StateDB(tmp_path / "s.db")
    d.close()
    with pytest.raises(StateError, match="closed"):
        get(d, "x")


def test_memory_database_works() -> None:
    """":memory:" opens a private in-memory database."""
    d = StateDB(":memory:")
    put(d, "a", "7")
    assert get(d, "a") == "7"
    d.close()


def test_wal_and_full_sync_are_set(tmp_path: Path) -> None:
    """The file is in WAL mode and the connection syncs FULL (2), as the outbox guarantee needs."""
    d = StateDB(tmp_path / "s.db")
    with d._conn.guard("test") as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert c.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        assert c.execute("PRAGMA user_version").fetchone()[0] == 1
    d.close()


# -- alert state, nflog, refs, scale --------------------------------------------------------------


def test_rule_alerts_are_replaced_per_rule(db: StateDB) -> None:
    """alert_states.save replaces that rule's alerts only; an empty list still records the eval time."""
    db.alert_states.save("g/A", [{"fp": "1"}, {"fp": "2"}], 100)
    db.alert_states.save("g/B", [{"fp": "3"}], 100)
    db.alert_states.save("g/A", [], 200)
    assert db.alert_states.load() == {"g/A": (200, []), "g/B": (100, [{"fp": "3"}])}


def test_nflog_refs_and_scale_round_trip(db: StateDB) -> None:
    """Each keyed table returns what was put, None when absent, and forgets on delete."""
    entry = NflogEntry(frozenset({"a", "b"}), frozenset({"c"}), 123)
    assert db.nflog.get("slack", "g") is None
    db.nflog.put("slack", "g", entry)
    assert db.nflog.get("slack", "g") == entry
    assert db.nflog.get("am", "g") is None
    db.nflog.delete("slack", "g")
    assert db.nflog.get("slack", "g") is None

    put(db, "groups", "1")
    put(db, "groups", "2")
    assert get(db, "groups") == "2"

    db.nflog.put_ref("slack", "g", "C123", "1700000000.000100")
    assert db.nflog.get_ref("slack", "g") == ("C123", "1700000000.000100")
    db.nflog.delete_ref("slack", "g")
    assert db.nflog.get_ref("slack", "g") is None

    assert db.cooldowns.get("api") is None
    db.cooldowns.put(ScaleState("api", 2, 3, 10, 0, 5))
    db.cooldowns.put(ScaleState("api", 3, 3, 10, 0, 5))
    assert db.cooldowns.get("api") == ScaleState("api", 3, 3, 10, 0, 5)


# -- silences -----------------------------------------------------------------------------------


def test_silence_states(db: StateDB) -> None:
    """A silence is pending before its start, active in [start, end), expired from its end on."""
    s = db.silences.add(['alertname="VLLMKVCacheSaturated"', 'instance=~"gpu-1.*"'], starts_ms=1000,
                       ends_ms=2000, created_by="ops", comment="maintenance")
    assert s.matchers == ['alertname="VLLMKVCacheSaturated"', 'instance=~"gpu-1.*"']
    assert [(t, s.active(t), s.state(t)) for t in (999, 1000, 1999, 2000)] == [
        (999, False, "pending"), (1000, True, "active"), (1999, True, "active"), (2000, False, "expired")]
    assert [x.id for x in db.silences.list(now_ms=1500)] == [s.id]
    assert db.silences.list(now_ms=2000) == []
    assert db.silences.list(now_ms=2000, include_expired=True) == [s]


def test_silence_to_json_is_alertmanager_shaped(db: StateDB) -> None:
    """to_json has Alertmanager's fields: RFC 3339 times, matcher objects, status.state."""
    s = db.silences.add(['instance!~"gpu-1.*"', "job=vllm"], starts_ms=1_700_000_000_000,
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
    active = db.silences.add(['a="1"'], starts_ms=0, ends_ms=10_000, created_by="x", comment="")
    pending = db.silences.add(['a="2"'], starts_ms=8000, ends_ms=10_000, created_by="x", comment="")
    assert db.silences.expire(active.id, now_ms=5000)
    assert db.silences.expire(pending.id, now_ms=5000)
    assert not db.silences.expire(active.id, now_ms=6000)
    assert not db.silences.expire("no-such-id", now_ms=6000)
    assert db.silences.list(now_ms=5000) == []
    everything = db.silences.list(now_ms=5000, include_expired=True)
    states = {s.id: (s.starts_ms, s.ends_ms, s.state(5000)) for s in everything}
    assert states == {active.id: (0, 5000, "expired"), pending.id: (5000, 5000, "expired")}


@pytest.mark.parametrize(("matchers", "reason"), [
    (["alertname"], "bad matcher"),
    (['instance=~"("'], "not a regular expression"),
    (['instance=~"x{1001}"'], r"^instance=~: not a regular expression in RE2 syntax: 'x\{1001\}'"),
    ([], "at least one matcher"),
    (['instance=~".*"'], "empty string"),
])
def test_bad_silences_are_value_errors(db: StateDB, matchers: list[str], reason: str) -> None:
    """A bad matcher, no matcher, or matchers that match everything raise ValueError with the reason."""
    with pytest.raises(ValueError, match=reason):
        db.silences.add(matchers, starts_ms=0, ends_ms=1, created_by="x", comment="")
    assert db.silences.list(now_ms=0, include_expired=True) == []


def test_silence_ending_before_it_starts_is_refused(db: StateDB) -> None:
    """ends_ms <= starts_ms raises ValueError."""
    with pytest.raises(ValueError, match="before it starts"):
        db.silences.add(['a="1"'], starts_ms=5, ends_ms=5, created_by="x", comment="")


# -- incidents ----------------------------------------------------------------------------------


def _open(db: StateDB, fp: str, started: int) -> int:
    return db.incidents.open(fingerprint=fp, alertname="VLLMQueueBuildup", labels={"service": "api"},
                            severity="warning", summary="requests queue", started_ms=started)


def test_incident_lifecycle(db: StateDB) -> None:
    """open -> events -> resolve: events come back in time order, the open incident gets them."""
    iid = _open(db, "fp1", 1000)
    assert _open(db, "fp1", 1500) == iid  # idempotent while open
    db.incidents.add_event("fp1", at_ms=1000, kind="fired", detail={"value": 12.5})
    db.incidents.add_event("fp1", at_ms=1200, kind="notified", detail={"receiver": "slack"})
    db.incidents.add_event("fp1", at_ms=1300, kind="action", detail={"action": "scale_out", "from": 2, "to": 3})
    db.incidents.add_event("fp1", at_ms=5000, kind="resolved", detail={})
    db.incidents.resolve("fp1", resolved_ms=5000)
    db.incidents.add_event("fp1", at_ms=5100, kind="notified", detail={"receiver": "slack"})  # the resolve message
    db.incidents.add_event("unknown", at_ms=1, kind="notified", detail={})  # ignored
    [inc] = db.incidents.list()
    assert (inc.id, inc.started_ms, inc.resolved_ms, inc.labels) == (iid, 1000, 5000, {"service": "api"})
    assert [(e.at_ms, e.kind) for e in inc.events] == [
        (1000, "fired"), (1200, "notified"), (1300, "action"), (5000, "resolved"), (5100, "notified")]
    assert inc.events[2].detail == {"action": "scale_out", "from": 2, "to": 3}
    assert db.incidents.list(open_only=True) == []
    j = inc.to_json()
    assert (j["status"], j["startsAt"], j["endsAt"]) == ("resolved", "1970-01-01T00:00:01.000Z",
                                                         "1970-01-01T00:00:05.000Z")


def test_a_new_firing_after_resolve_is_a_new_incident(db: StateDB) -> None:
    """After resolve, open_incident starts a second incident; events go to the open one; newest first."""
    first = _open(db, "fp", 1000)
    db.incidents.resolve("fp", resolved_ms=2000)
    db.incidents.add_event("fp", at_ms=2100, kind="notified", detail={"receiver": "slack"})  # to the latest
    second = _open(db, "fp", 3000)
    other = _open(db, "fp-other", 2500)
    assert second != first
    db.incidents.add_event("fp", at_ms=3100, kind="finding", detail={"kind": "gpu-oom-runtime", "summary": "OOM"})
    assert [i.id for i in db.incidents.list()] == [second, other, first]
    assert [i.id for i in db.incidents.list(open_only=True)] == [second, other]
    assert [i.id for i in db.incidents.list(limit=1)] == [second]
    by_id = {i.id: i for i in db.incidents.list()}
    assert [e.kind for e in by_id[second].events] == ["finding"]
    assert [e.kind for e in by_id[first].events] == ["notified"]
    assert by_id[other].events == []


def test_prune_drops_only_old_rows(db: StateDB) -> None:
    """prune drops resolved incidents, failed items and expired silences older than keep; delivered
    keys are kept at least 24 h; open incidents and queued items are never dropped."""
    now = 10 * DAY
    for fp in ("old", "recent", "open"):
        _open(db, fp, 0)
        db.incidents.add_event(fp, at_ms=0, kind="fired", detail={})
    db.incidents.resolve("old", resolved_ms=now - 3 * HOUR)  # older than keep (2 h): dropped
    db.incidents.resolve("recent", resolved_ms=now - HOUR)  # kept
    # "open" stays open: kept
    db.outbox.enqueue(note("f-old"), now_ms=0)
    db.outbox.fail(db.outbox.pending()[0].id, error="x", now_ms=now - 3 * HOUR)  # dropped
    db.outbox.enqueue(note("f-new"), now_ms=0)
    db.outbox.fail(db.outbox.pending()[0].id, error="x", now_ms=now - HOUR)  # kept
    db.silences.add(['a="1"'], starts_ms=0, ends_ms=now - 3 * HOUR, created_by="x", comment="")  # dropped
    db.silences.add(['a="2"'], starts_ms=0, ends_ms=now - HOUR, created_by="x", comment="")  # kept
    db.outbox.enqueue(note("d-old"), now_ms=0)
    db.outbox.ack(db.outbox.pending()[0].id, now_ms=now - 25 * HOUR)  # older than 24 h: dropped
    db.outbox.enqueue(note("d-new"), now_ms=0)
    db.outbox.ack(db.outbox.pending()[0].id, now_ms=now - 3 * HOUR)  # older than keep but within 24 h: kept
    db.outbox.enqueue(note("queued"), now_ms=0)  # queued: kept

    assert db.prune(now_ms=now, keep_ms=2 * HOUR) == 4
    assert sorted(i.fingerprint for i in db.incidents.list()) == ["open", "recent"]
    assert [f["key"] for f in db.outbox.failed()] == ["f-new"]
    assert [s.matchers for s in db.silences.list(now_ms=now, include_expired=True)] == [['a="2"']]
    assert db.outbox.enqueue(note("d-old"), now_ms=now)  # forgotten
    assert not db.outbox.enqueue(note("d-new"), now_ms=now)  # still refused
    assert [i.key for i in db.outbox.pending()] == ["queued", "d-old"]
    with db._conn.guard("test") as c:
        assert c.execute("SELECT COUNT(*) FROM incident_events").fetchone()[0] == 2  # recent's and open's
