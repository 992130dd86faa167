"""The dispatcher end to end, in-process: a real StateDB, Router and sinks posting to local servers, a hand-moved clock.

Expected times are worked out by hand from the documented semantics: Alertmanager's
dispatcher (``group_wait``, ``group_interval``, ``DedupStage.needsUpdate`` with
``repeat_interval``), Prometheus' notifier (``needsSending``: re-send when
``lastSent + resend_delay < now``, ``endsAt = now + 4 × max(interval, resend_delay)``),
and the outbox's backoff: after the n-th failed attempt of an item the next one waits
``cap/2 + rng × cap/2`` with ``cap = min(retry_max, retry_initial × 2^(n-1))``, or the
receiver's ``Retry-After`` when that is longer. With ``rng = 0.5`` that is ``0.75 × cap``.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.act import build_sinks
from agent.act.dispatch import Dispatcher
from agent.act.notification import AlertSnapshot, Notification
from agent.act.routing import Router
from agent.act.scaling import Scaler
from agent.act.sinks import Sink
from agent.act.state import StateDB
from agent.config import Config, load_config
from agent.diagnose.findings import Finding
from agent.errors import ConfigError, StateError
from agent.rules.manager import Alert, AlertEvent, AlertState
from agent.series import labels_from
from agent.simulate.server import Fleet, FleetConfig
from tests.alertmanager import Alertmanager, eventually
from tests.fake_slack import running_fake_slack
from tests.receivers import Recorded, RecordingServer, reply
from tests.statefiles import full_disk

T0 = 1_700_000_000.0  # the fake clock's start (Unix seconds)
FAST = {"group_wait": "30s", "group_interval": "60s", "repeat_interval": "150s"}


# -- scenario: alerts as the rule manager would hand them over ----------------------------------------------
@dataclass(frozen=True)
class Spec:
    """One alert that fires at ``fire_s`` and resolves at ``resolve_s`` (seconds after the start)."""

    name: str
    fire_s: float
    resolve_s: float | None = None
    labels: dict[str, str] = field(default_factory=dict)


def spec(name: str, fire_s: float, resolve_s: float | None = None, **labels: str) -> Spec:
    return Spec(name, fire_s, resolve_s, labels)


def evaluate(specs: list[Spec], s: float, t0: float) -> tuple[list[AlertEvent], list[Alert]]:
    """The events and alerts of one evaluation at ``s``: firing once fired, inactive (kept) once resolved.
    Specs of one alert (name and labels) follow each other: the last one fired by ``s`` is the alert."""
    events, alerts = [], []
    latest = {(sp.name, tuple(sorted(sp.labels.items()))): sp for sp in sorted(specs, key=lambda sp: sp.fire_s)
              if sp.fire_s <= s}
    for sp in latest.values():
        resolved = sp.resolve_s is not None and s >= sp.resolve_s
        a = Alert(labels=labels_from(None, {"alertname": sp.name, **sp.labels}),
                  annotations={"summary": f"{sp.name} summary"}, value=1.0,
                  state=AlertState.INACTIVE if resolved else AlertState.FIRING,
                  active_at_ms=ms(t0 + sp.fire_s), fired_at_ms=ms(t0 + sp.fire_s),
                  resolved_at_ms=ms(t0 + sp.resolve_s) if resolved and sp.resolve_s is not None else 0)
        alerts.append(a)
        if s == sp.fire_s:
            events.append(AlertEvent("firing", "g", sp.name, a, ms(t0 + s)))
        if resolved and s == sp.resolve_s:
            events.append(AlertEvent("resolved", "g", sp.name, a, ms(t0 + s)))
    return events, alerts


def ms(seconds: float) -> int:
    return round(seconds * 1000)


def iso_ms(seconds: float) -> str:
    """RFC 3339 with milliseconds, UTC: how Prometheus writes startsAt/endsAt."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms(seconds) % 1000:03d}Z"


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    """The state database on a temporary file, closed at teardown."""
    state = StateDB(tmp_path / "s.db")
    yield state
    state.close()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """One client session shared by the HTTP sinks, as the daemon does."""
    async with aiohttp.ClientSession() as s:
        yield s


HookFactory = Callable[..., Awaitable[RecordingServer]]


@pytest.fixture
async def hooks() -> AsyncIterator[HookFactory]:
    """Start recording receivers that stamp requests with fake-clock seconds after ``t0``; all stopped at teardown."""
    started: list[RecordingServer] = []

    async def start(t: list[float], t0: float = T0) -> RecordingServer:
        started.append(await RecordingServer(clock=lambda: t[0] - t0).start())
        return started[-1]

    yield start
    for h in started:
        await h.stop()


def make_config(receivers: dict[str, dict[str, Any]], route: dict[str, Any], **extra: Any) -> Config:
    data = {"receivers": [{"name": n, **r} for n, r in receivers.items()], "route": route, "actions": [],
            "notify": {"retry_initial": "2s", "retry_max": "60s"}, **extra}
    return Config.model_validate(data, context={"environ": {"SLACK_TOKEN": "xoxb-fake-token"}})


def webhook(url: str) -> dict[str, Any]:
    return {"webhook": {"url": url}}


class Rig:
    """A dispatcher on a fake clock, stepped by hand: an evaluation every ``interval_s``, a tick every ``step``."""

    def __init__(self, config: Config, db: StateDB, session: aiohttp.ClientSession, t: list[float], *,
                 specs: list[Spec] | None = None, t0: float = T0, sinks: dict[str, Sink] | None = None,
                 scaler: Scaler | None = None, diagnose: Callable[[AlertSnapshot], None] | None = None,
                 interval_s: float = 15.0) -> None:
        self.config, self.db, self.session, self.t, self.t0 = config, db, session, t, t0
        self.specs = specs or []
        self.interval_s = interval_s
        self.s = 0.0
        self.t[0] = t0
        self.sinks = sinks if sinks is not None else build_sinks(config, db, session, stream=io.StringIO())
        self.d = Dispatcher(config, db, Router(config), self.sinks, scaler=scaler, diagnose=diagnose,
                            clock=lambda: self.t[0], rng=lambda: 0.5)
        self.on_step: Callable[[float], Any] | None = None
        self.started = False

    def restart(self, db: StateDB) -> None:
        """A new process: a fresh Dispatcher (no memory) over ``db``; the old one is dropped as is."""
        self.db = db
        self.sinks = build_sinks(self.config, db, self.session, stream=io.StringIO())
        self.d = Dispatcher(self.config, db, Router(self.config), self.sinks, clock=lambda: self.t[0],
                            rng=lambda: 0.5)

    async def close(self) -> None:
        """Close the sinks (the Slack sink owns an HTTP session)."""
        for sink in self.sinks.values():
            await sink.close()

    async def run(self, until: float, *, step: float = 0.5) -> None:
        """Process every step after the current time up to ``until`` (the first call also processes 0)."""
        k = 0 if not self.started else 1
        self.started = True
        base = self.s
        while base + k * step <= until:
            self.s = base + k * step
            self.t[0] = self.t0 + self.s
            if self.on_step is not None:
                await self.on_step(self.s)
            if self.s % self.interval_s == 0:
                events, alerts = evaluate(self.specs, self.s, self.t0)
                self.d.observe("g", events, alerts, interval_s=self.interval_s, now_ms=ms(self.t[0]))
            await self.d.tick()
            await self.d.drain()
            k += 1


def alertnames(post: Recorded) -> list[tuple[str, str]]:
    """(status, instance or alertname) of each alert in a webhook body, in order."""
    return [(a["status"], a["labels"].get("instance", a["labels"]["alertname"])) for a in post.json()["alerts"]]


# -- 1. grouping, repeat, resolved ---------------------------------------------------------------------------
async def test_group_wait_interval_repeat_and_resolved(db: StateDB, session: aiohttp.ClientSession,
                                                       hooks: HookFactory) -> None:
    """Sent at group_wait, a joiner at the next group_interval, a repeat after repeat_interval, then resolves."""
    t = [T0]
    hook = await hooks(t)
    cfg = make_config({"hook": webhook(hook.url())}, {"receiver": "hook", "group_by": ["alertname"], **FAST})
    rig = Rig(cfg, db, session, t,
              specs=[spec("Q", 0, 285, instance="a"), spec("Q", 45, 345, instance="b")])
    await rig.run(29.5)
    assert hook.posts() == []  # nothing before group_wait
    await rig.run(30)
    assert [(p.at, alertnames(p)) for p in hook.posts()] == [(30, [("firing", "a")])]
    await rig.run(89.5)  # b joined at 45: not sent before the next group_interval (30 + 60)
    assert len(hook.posts()) == 1
    await rig.run(500)
    # 150, 210: unchanged and repeat_interval (150 s after 90) not passed; 270: repeat; 330: a resolved;
    # 390: all resolved. After that the group is gone and nothing else is sent.
    assert [(p.at, p.json()["status"], alertnames(p)) for p in hook.posts()] == [
        (30, "firing", [("firing", "a")]),
        (90, "firing", [("firing", "a"), ("firing", "b")]),
        (270, "firing", [("firing", "a"), ("firing", "b")]),
        (330, "firing", [("firing", "b"), ("resolved", "a")]),
        (390, "resolved", [("resolved", "a"), ("resolved", "b")]),
    ]
    assert hook.posts()[3].json()["alerts"][1]["endsAt"] == "2023-11-14T22:18:05Z"  # T0 + 285 s
    assert len({p.key for p in hook.posts()}) == 5


async def test_send_resolved_false_sends_no_resolved_but_a_refire_notifies(
        db: StateDB, session: aiohttp.ClientSession, hooks: HookFactory) -> None:
    """With send_resolved false the resolve is silent; the alert firing again is notified again."""
    t = [T0]
    hook = await hooks(t)
    cfg = make_config({"hook": webhook(hook.url())},
                      {"receiver": "hook", "group_by": ["alertname"], "send_resolved": False, **FAST})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0, 45)])
    await rig.run(110)
    assert [p.at for p in hook.posts()] == [30]  # the flush at 90 saw it resolved and sent nothing
    rig.specs = [spec("Q", 120)]  # the same alert fires again at 120
    await rig.run(300)
    # The kept resolved alert re-created the group at 105 (flush at 135); the re-fire at 120 is sent then.
    assert [(p.at, alertnames(p)) for p in hook.posts()] == [(30, [("firing", "Q")]), (135, [("firing", "Q")])]


# -- 2. silences -----------------------------------------------------------------------------------------------
async def test_silence_mutes_until_it_expires(db: StateDB, session: aiohttp.ClientSession,
                                              hooks: HookFactory) -> None:
    """A matching silence mutes the group's flushes; after it is expired the next flush notifies."""
    t = [T0]
    hook = await hooks(t)
    cfg = make_config({"hook": webhook(hook.url())}, {"receiver": "hook", "group_by": ["alertname"], **FAST})
    silence = db.silences.add(['alertname="Q"', 'instance=~"a|b"'], starts_ms=ms(T0), ends_ms=ms(T0 + 3600),
                             created_by="test", comment="maintenance")
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0, instance="a"), spec("R", 0, instance="a")])
    await rig.run(100)
    assert [(p.at, alertnames(p)[0][1], p.json()["groupLabels"]) for p in hook.posts()] == [
        (30, "a", {"alertname": "R"})]  # R is not silenced; Q is, at 30 and 90
    assert db.silences.expire(silence.id, now_ms=ms(t[0]))
    await rig.run(200)
    assert [(p.at, p.json()["groupLabels"]) for p in hook.posts()[1:]] == [(150, {"alertname": "Q"})]


# -- 3. routes ---------------------------------------------------------------------------------------------------
async def test_continue_routes_reach_every_matching_receiver(db: StateDB, session: aiohttp.ClientSession,
                                                             hooks: HookFactory) -> None:
    """continue: true sends to both children's receivers; a child's receiver (and group_wait) override the parent's."""
    t = [T0]
    hook = await hooks(t)
    cfg = make_config(
        {"default": webhook(hook.url("/default")), "db": webhook(hook.url("/db")),
         "pager": webhook(hook.url("/pager"))},
        {"receiver": "default", "group_by": ["alertname"], **FAST, "routes": [
            {"matchers": ['team="db"'], "receiver": "db", "continue": True},
            {"matchers": ['severity="critical"'], "receiver": "pager", "group_wait": "10s"}]})
    rig = Rig(cfg, db, session, t,
              specs=[spec("Disk", 0, team="db", severity="critical"), spec("Cpu", 0, team="web", severity="info")])
    await rig.run(40)
    got = sorted((p.path, p.at, p.json()["groupLabels"]["alertname"]) for p in hook.posts())
    assert got == [("/db", 30, "Disk"), ("/default", 30, "Cpu"), ("/pager", 10, "Disk")]


# -- 4. Alertmanager receivers ---------------------------------------------------------------------------------
async def test_alertmanager_resend_times_and_one_queue_per_url(db: StateDB, session: aiohttp.ClientSession,
                                                               hooks: HookFactory) -> None:
    """Prometheus' resend rules per alert; the second Alertmanager, down, gets one merged batch with latest states."""
    t = [T0]
    am0, am1 = await hooks(t), await hooks(t)
    cfg = make_config({"am": {"alertmanager": {"urls": [am0.url(""), am1.url("")], "resend_delay": "60s"}}},
                      {"receiver": "am"}, notify={"retry_initial": "1s", "retry_max": "10s"})
    rig = Rig(cfg, db, session, t, specs=[spec("X", 0, 165), spec("Y", 30)])
    await am1.stop()  # connection refused until 200

    async def outage(s: float) -> None:
        if s == 190:
            assert db.outbox.depth().get("am[1]") == 1  # every batch merged into the one queued item
        if s == 200:
            await am1.start()

    rig.on_step = outage
    await rig.run(230)
    # X: sent 0, then when lastSent + 60 s < now: 75, 150; resolved at 165 (resolved since last send), then 240.
    # Y: 30, 105, 180. endsAt while firing = now + 4 × max(15 s, 60 s) = now + 240 s; startsAt = firedAt.
    expect = [(0, "X", 0, 240), (30, "Y", 30, 270), (75, "X", 0, 315), (105, "Y", 30, 345), (150, "X", 0, 390),
              (165, "X", 0, 165), (180, "Y", 30, 420)]
    got = [(p.at, a["labels"]["alertname"], a["startsAt"], a["endsAt"]) for p in am0.posts() for a in p.json()]
    assert got == [(at, n, iso_ms(T0 + st), iso_ms(T0 + end)) for at, n, st, end in expect]
    assert all(p.path == "/api/v2/alerts" for p in am0.posts())
    assert len(am1.posts()) == 1 and am1.posts()[0].at <= 215
    latest = sorted((a["labels"]["alertname"], a["startsAt"], a["endsAt"]) for a in am1.posts()[0].json())
    assert latest == [("X", iso_ms(T0), iso_ms(T0 + 165)), ("Y", iso_ms(T0 + 30), iso_ms(T0 + 420))]
    assert db.outbox.depth() == {}


async def test_alertmanager_gets_a_refire_at_once_after_a_resolve(db: StateDB, session: aiohttp.ClientSession,
                                                                  hooks: HookFactory) -> None:
    """An alert that resolves and fires again within the resend delay is a new alert to Prometheus, sent at
    the evaluation that fires it, not when the resolve's resend delay is over."""
    t = [T0]
    am = await hooks(t)
    cfg = make_config({"am": {"alertmanager": {"urls": [am.url("")], "resend_delay": "60s"}}}, {"receiver": "am"})
    rig = Rig(cfg, db, session, t, specs=[spec("X", 0, 30), spec("X", 45)])
    await rig.run(130)
    # (sent at, startsAt, endsAt): firing at 0; resolved at 30 (endsAt = the resolve); firing again at 45,
    # a new alert (startsAt 45), re-sent once lastSent + 60 s < now: at 120. endsAt while firing: now + 240 s.
    expect = [(0, 0, 240), (30, 0, 30), (45, 45, 285), (120, 45, 360)]
    got = [(p.at, a["startsAt"], a["endsAt"]) for p in am.posts() for a in p.json()]
    assert got == [(at, iso_ms(T0 + st), iso_ms(T0 + end)) for at, st, end in expect]


async def test_real_alertmanager_stores_what_prometheus_would_send(tmp_path: Path, db: StateDB,
                                                                   session: aiohttp.ClientSession) -> None:
    """A real Alertmanager holds the alert with startsAt = firedAt and endsAt = now + 4 × interval; then resolves it."""
    async with Alertmanager(tmp_path / "am") as am:
        t0 = float(int(time.time()))
        t = [t0]
        cfg = make_config({"am": {"alertmanager": {"urls": [am.url], "resend_delay": "60s"}}}, {"receiver": "am"})
        rig = Rig(cfg, db, session, t, t0=t0, specs=[spec("X", 0, instance="i1")],
                  interval_s=120.0)
        await rig.run(0)

        async def held() -> list[dict[str, Any]] | None:
            return (await am.alerts()) or None

        [alert] = await eventually(held, what="the alert in Alertmanager")
        assert alert["labels"] == {"alertname": "X", "instance": "i1"}
        assert datetime.fromisoformat(alert["startsAt"]).timestamp() == t0
        assert datetime.fromisoformat(alert["endsAt"]).timestamp() == t0 + 4 * 120  # interval 120 s > resend 60 s
        await am.wait_webhook(lambda p: p["status"] == "firing", what="the firing notification")
        t[0] = resolved = round(time.time(), 3)
        _, [a] = evaluate([spec("X", 0, instance="i1")], 0, t0)
        a.state, a.resolved_at_ms = AlertState.INACTIVE, ms(resolved)
        rig.d.observe("g", [], [a], interval_s=120, now_ms=ms(resolved))
        await rig.d.tick()
        await rig.d.drain()
        hook = await am.wait_webhook(lambda p: p["status"] == "resolved", what="the resolved notification")
        assert ms(datetime.fromisoformat(hook["alerts"][0]["endsAt"]).timestamp()) == ms(resolved)
        assert await am.alerts() == []


# -- 5. a receiver down for ten minutes ------------------------------------------------------------------------
async def test_receiver_down_ten_minutes(db: StateDB, session: aiohttp.ClientSession, hooks: HookFactory) -> None:
    """A 10-minute outage: all queued arrives once, in order; backoff and Retry-After hold; others are on time."""
    t = [T0]
    up, down = await hooks(t), await hooks(t)
    cfg = make_config({"up": webhook(up.url()), "down": webhook(down.url())},
                      {"receiver": "up", "group_by": ["alertname"], "group_wait": "10s", "group_interval": "30s",
                       "routes": [{"receiver": "up", "continue": True}, {"receiver": "down"}]})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0, 300, instance="a"), spec("Q", 60, instance="b"),
                                          spec("KV", 210, instance="a")])
    down.status, down.retry_after = 429, "20"
    attempts: list[float] = []
    seen = [0]

    async def outage(s: float) -> None:
        count = rig.d.stats.retried.get("down", 0) + rig.d.stats.sent.get("down", 0)
        if count > seen[0]:  # attempts finished in the previous step
            attempts.append(s - 0.5)
            seen[0] = count
        if s == 30:
            down.status = 503
        if s == 120:
            await down.stop()  # connection refused
        if s == 599:
            assert db.outbox.depth() == {"down": 4}
        if s == 600:
            down.status = 200
            await down.start()

    rig.on_step = outage
    await rig.run(700)
    # The up receiver got each notification on time: n1 at group_wait, n2 (b joined) at 70, n3 (KV) at 220,
    # n4 (a resolved) at 310.
    assert [(p.at, alertnames(p)) for p in up.posts()] == [
        (10, [("firing", "a")]), (70, [("firing", "a"), ("firing", "b")]), (220, [("firing", "a")]),
        (310, [("firing", "b"), ("resolved", "a")])]
    # Attempts of the head item: 429 at 10 (Retry-After 20 s beats the 1.5 s backoff), then 503s with
    # waits 0.75 × min(60, 2 × 2^(n-1)) = 3, 6, 12, 24, 45; refused from 120 on, every 45 s; up again at 615.
    expected = [10.0, 30, 33, 39, 51, 75, *range(120, 616, 45)]
    assert attempts[:len(expected)] == expected
    assert [p.at for p in down.posts()[:6]] == expected[:6]  # the 429/503 ones reached the server
    delivered = down.accepted()
    assert [alertnames(p) for p in delivered] == [alertnames(p) for p in up.posts()]  # FIFO
    assert all(615 <= p.at <= 620 for p in delivered)
    assert len(down.posts()) == 6 + 4 and len({p.key for p in down.posts()}) == 4
    assert all(sum(1 for q in delivered if q.key == p.key) == 1 for p in delivered)
    assert rig.d.stats.sent == {"up": 4, "down": 4}
    assert rig.d.stats.retried == {"down": len(expected) - 1}
    assert rig.d.stats.failed == {}
    assert db.outbox.depth() == {}


# -- 6. permanent failure and giving up ---------------------------------------------------------------------
async def test_rejected_notification_fails_at_once(db: StateDB, session: aiohttp.ClientSession,
                                                   hooks: HookFactory) -> None:
    """A 400 moves the item to failed, records notify_failed on the incident, and is never retried."""
    t = [T0]
    hook = await hooks(t)
    hook.status = 400
    cfg = make_config({"hook": webhook(hook.url())}, {"receiver": "hook", **FAST})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0)])
    await rig.run(120)
    assert [p.at for p in hook.posts()] == [30]
    [failed] = db.outbox.failed()
    assert failed["receiver"] == "hook" and failed["attempts"] == 1 and "HTTP 400" in failed["error"]
    [incident] = db.incidents.list()
    assert [e.kind for e in incident.events] == ["fired", "notify_failed"]
    assert rig.d.stats.failed == {"hook": 1} and rig.d.stats.retried == {}
    assert db.outbox.depth() == {}


async def test_gives_up_after_give_up_after(db: StateDB, session: aiohttp.ClientSession, hooks: HookFactory) -> None:
    """A retryable failure is retried until notify.give_up_after; the last attempt is made at the give-up time
    (not a backoff past it) and its failure ends the item in failed."""
    t = [T0]
    hook = await hooks(t)
    hook.status = 503
    cfg = make_config({"hook": webhook(hook.url())}, {"receiver": "hook", "group_wait": "10s"},
                      notify={"retry_initial": "2s", "retry_max": "60s", "give_up_after": "60s"})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0)])
    await rig.run(200)
    # Queued at 10; attempts 10, 11.5, 14.5, 20.5, 32.5, 56.5 (age < 60 s: retried; the 45 s backoff cut to
    # the give-up time), 70 (age 60 s: failed).
    assert [p.at for p in hook.posts()] == [10, 11.5, 14.5, 20.5, 32.5, 56.5, 70]
    assert [f["attempts"] for f in db.outbox.failed()] == [7]
    assert rig.d.stats.retried == {"hook": 6} and rig.d.stats.failed == {"hook": 1}


# -- 7. restart -----------------------------------------------------------------------------------------------
async def test_restart_keeps_nflog_and_delivers_the_old_outbox(tmp_path: Path, db: StateDB,
                                                              session: aiohttp.ClientSession,
                                                              hooks: HookFactory) -> None:
    """After a crash, a new dispatcher delivers what was queued, once, and does not notify the group again."""
    t = [T0]
    hook = await hooks(t)
    await hook.stop()
    cfg = make_config({"hook": webhook(hook.url())},
                      {"receiver": "hook", "group_by": ["alertname"], "group_wait": "30s", "group_interval": "60s"})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0, 200)])
    await rig.run(40)  # queued at 30; refused at 30, 31.5 and 34.5; next attempt due at 34.5 + 6 = 40.5
    assert rig.db.outbox.depth() == {"hook": 1}
    key = rig.db.outbox.pending("hook")[0].key
    db.close()  # the process dies: no drain, the in-memory groups are lost
    await hook.start()
    rig.restart(StateDB(tmp_path / "s.db"))
    await rig.run(190)  # the new dispatcher's group: created at 45, flushes at 75 and 135; nflog: nothing new
    assert [(p.key, p.at, p.json()["status"]) for p in hook.posts()] == [(key, 40.5, "firing")]
    await rig.run(260)  # resolved at 200: the flush at 255 reports it (the nflog knew it was firing)
    assert [(p.at, p.json()["status"]) for p in hook.posts()[1:]] == [(255, "resolved")]
    rig.db.close()


# -- 8. findings -----------------------------------------------------------------------------------------------
async def test_finding_goes_into_the_alerts_slack_thread(db: StateDB, session: aiohttp.ClientSession,
                                                          hooks: HookFactory) -> None:
    """A finding about an alert is a reply in its group's Slack thread; one without an alert goes to the root."""
    t = [T0]
    hook = await hooks(t)
    async with running_fake_slack() as slack:
        slack_cfg = {"token_env": "SLACK_TOKEN", "channel": "C0123ABCD", "api_url": slack.api_url,
                     "max_messages_per_second": 1000}
        cfg = make_config({"hook": webhook(hook.url()), "slack": {"slack": slack_cfg}},
                          {"receiver": "hook", "group_by": ["alertname"], **FAST,
                           "routes": [{"matchers": ['alertname="GPUMemoryNearFull"'], "receiver": "slack"}]},
                          actions=[{"type": "diagnose", "matchers": ['alertname="GPUMemoryNearFull"']}])
        seen: list[AlertSnapshot] = []
        rig = Rig(cfg, db, session, t, specs=[spec("GPUMemoryNearFull", 0, gpu="0")],
                  diagnose=seen.append)
        await rig.run(45)
        assert len(seen) == 1  # the diagnose hook runs once, when the alert starts firing
        [message] = slack.messages
        finding = Finding(kind="gpu-oom-runtime", summary="KV cache too large for the GPU",
                          setting="--max-model-len", suggested_value="16384")
        assert rig.d.post_finding(finding, seen[0], now_ms=ms(t[0])) == 1
        assert rig.d.post_finding(finding, None, now_ms=ms(t[0])) == 1
        await rig.run(50)
        [reply] = slack.replies(message.ts)
        assert "KV cache too large" in reply.text
        assert len(slack.messages) == 2
        [found] = hook.posts()
        assert found.json()["kind"] == "finding" and found.json()["finding"]["setting"] == "--max-model-len"
        by_name = {i.alertname: i for i in rig.db.incidents.list()}
        alertname = seen[0].labels["alertname"]
        assert [e.kind for e in by_name[alertname].events] == ["fired", "notified", "finding", "notified"]
        alone = by_name[finding.kind]  # the alert-less finding is an incident of its own, opened and closed
        assert [e.kind for e in alone.events] == ["finding"] and alone.resolved_ms == alone.started_ms
        await rig.close()


# -- 8b. state writes failing (disk full) --------------------------------------------------------------------
async def test_a_failed_apply_leaves_no_trace_and_applying_it_again_counts_once(
        db: StateDB, session: aiohttp.ClientSession, hooks: HookFactory) -> None:
    """An evaluation whose commit fails records no incident, groups nothing and diagnoses nothing; applied
    again once commits succeed it opens one incident, runs the diagnosis once and is notified once."""
    t = [T0]
    hook = await hooks(t)
    cfg = make_config({"hook": webhook(hook.url())}, {"receiver": "hook", "group_by": ["alertname"], **FAST},
                      actions=[{"type": "diagnose", "matchers": ['alertname="Q"']}])
    diagnosed: list[AlertSnapshot] = []
    rig = Rig(cfg, db, session, t, diagnose=diagnosed.append)
    disk = full_disk(db)
    events, alerts = evaluate([spec("Q", 0, instance="a")], 0, T0)
    ev = rig.d.evaluation("g", events, alerts, interval_s=15)
    disk.full = True
    with pytest.raises(StateError, match="disk is full"):
        rig.d.apply(ev, now_ms=ms(T0))
    disk.full = False
    assert db.incidents.list() == [] and diagnosed == []
    assert rig.d.flush_due(ms(T0 + 3600)) == 0  # no aggregation group was made
    rig.d.apply(ev, now_ms=ms(T0 + 5))
    assert [(i.alertname, [e.kind for e in i.events]) for i in db.incidents.list()] == [("Q", ["fired"])]
    assert [d.labels["alertname"] for d in diagnosed] == ["Q"]
    t[0] = T0 + 35  # group_wait after the successful apply
    await rig.d.tick()
    await rig.d.drain()
    assert [alertnames(p) for p in hook.posts()] == [[("firing", "a")]]


async def test_a_group_whose_flush_fails_stays_due_and_goes_out_next_round(
        db: StateDB, session: aiohttp.ClientSession, hooks: HookFactory) -> None:
    """A flush whose enqueue fails raises after the round and keeps its group due: the next round sends it."""
    t = [T0]
    hook = await hooks(t)
    cfg = make_config({"hook": webhook(hook.url())}, {"receiver": "hook", "group_by": ["alertname"], **FAST})
    rig = Rig(cfg, db, session, t)
    disk = full_disk(db)
    events, alerts = evaluate([spec("Q", 0, instance="a")], 0, T0)
    rig.d.observe("g", events, alerts, interval_s=15, now_ms=ms(T0))
    disk.full = True
    t[0] = T0 + 30
    with pytest.raises(StateError, match="disk is full"):
        await rig.d.tick()
    await rig.d.drain()
    assert hook.posts() == [] and db.outbox.pending() == []
    disk.full = False
    t[0] = T0 + 31  # well before group_interval (60 s) would have come round again
    await rig.d.tick()
    await rig.d.drain()
    assert [(p.at, alertnames(p)) for p in hook.posts()] == [(31, [("firing", "a")])]


# -- 9. scale actions ------------------------------------------------------------------------------------------
async def test_scale_out_against_the_simulator(db: StateDB, session: aiohttp.ClientSession) -> None:
    """A firing scale_out alert grows the real simulator 2 -> 3, waits out the cooldown, then 3 -> 4."""
    fleet = Fleet(FleetConfig(replicas=2, lmdeploy_replicas=0, base_port=0))
    await fleet.start()
    try:
        t = [T0]
        cfg = make_config({"console": {"console": {}}}, {"receiver": "console", **FAST},
                          actions=[{"type": "scale_out", "matchers": ['action="scale_out"']}],
                          scaling={"services": [{"name": "vllm", "webhook": {"url": fleet.control_url + "/scale"},
                                                 "min_replicas": 2, "max_replicas": 8,
                                                 "scale_out_cooldown": "60s"}]})
        scaler = Scaler(cfg.scaling, db, started_ms=ms(T0))
        rig = Rig(cfg, db, session, t, specs=[spec("VLLMQueueGrowing", 0, action="scale_out")], scaler=scaler)
        await rig.run(0)
        assert len(fleet.targets) == 3
        await rig.run(59.5)  # evaluations at 15, 30, 45: within the cooldown
        assert len(fleet.targets) == 3 and rig.d.stats.sent["scale:vllm"] == 1
        await rig.run(60)
        assert len(fleet.targets) == 4 and rig.d.stats.sent["scale:vllm"] == 2
        assert scaler.desired_replicas() == {"vllm": 4}
    finally:
        await fleet.stop()


# -- 10. a broken sink -----------------------------------------------------------------------------------------
class Flaky:
    """A sink whose first send raises something no sink should."""

    def __init__(self) -> None:
        self.name = "hook"
        self.deadline_s = 5.0
        self.calls = 0
        self.sent: list[Notification] = []

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        self.calls += 1
        if self.calls == 1:
            raise KeyError("bug")
        self.sent.append(notification)
        return None

    async def close(self) -> None:
        pass


async def test_sink_bug_is_retried_and_the_dispatcher_lives_on(db: StateDB,
                                                               session: aiohttp.ClientSession) -> None:
    """An unexpected exception from a sink counts as a retryable failure; the item is delivered next time."""
    t = [T0]
    sink = Flaky()
    cfg = make_config({"hook": webhook("http://127.0.0.1:9/unused")}, {"receiver": "hook", **FAST})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0)], sinks={"hook": sink})
    await rig.run(40)
    assert sink.calls == 2 and len(sink.sent) == 1 and sink.sent[0].alerts[0].labels["alertname"] == "Q"
    assert rig.d.stats.retried == {"hook": 1} and rig.d.stats.sent == {"hook": 1}
    assert rig.db.outbox.depth() == {}


class Hung:
    """A sink whose send never returns, however long its own timeouts say a send may take."""

    def __init__(self, deadline_s: float) -> None:
        self.name = "hook"
        self.deadline_s = deadline_s
        self.started = 0

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        self.started += 1
        await asyncio.Event().wait()
        return None

    async def close(self) -> None:
        pass


async def test_a_hung_send_is_cut_at_the_sinks_own_deadline(db: StateDB, session: aiohttp.ClientSession) -> None:
    """The outbox cancels a send after the sink's deadline_s (+ 1 s grace), not after a fixed cap, and retries it."""
    t = [T0]
    sink = Hung(deadline_s=0.2)
    cfg = make_config({"hook": webhook("http://127.0.0.1:9/unused")}, {"receiver": "hook", **FAST})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0)], sinks={"hook": sink})
    await rig.run(30)  # group_wait: the first send starts at 30 s (each step waits for sends in flight)
    assert sink.started == 1
    assert rig.d.stats.retried == {"hook": 1}, "the hung send was not given up within its deadline"
    [item] = db.outbox.pending()
    assert item.attempts == 1 and item.last_error  # still queued, with the timeout as its last error


def test_sink_deadlines_follow_their_configured_timeouts() -> None:
    """A webhook configured with 60 s gets 60 s (no hidden 30 s cap); Slack's covers every call it may make."""
    cfg = make_config({"hook": {"webhook": {"url": "http://127.0.0.1:9/x", "timeout": "1m"}},
                       "am": {"alertmanager": {"urls": ["http://127.0.0.1:9"], "timeout": "45s"}},
                       "slack": {"slack": {"token_env": "SLACK_TOKEN", "channel": "#alerts", "timeout": "20s"}}},
                      {"receiver": "hook"})
    sinks = build_sinks(cfg, StateDB(":memory:"), None, stream=io.StringIO())  # type: ignore[arg-type]
    assert sinks["hook"].deadline_s == 60.0 and sinks["am[0]"].deadline_s == 45.0
    assert sinks["slack"].deadline_s >= 13 * 20.0  # the channel lookup's pages, history, update and post


def test_a_receiver_timeout_over_five_minutes_is_refused(tmp_path: Path) -> None:
    """timeout above 5m is a config error naming the key: one attempt holds the receiver's queue."""
    path = tmp_path / "agent.yaml"
    path.write_text("receivers: [{name: h, webhook: {url: 'http://127.0.0.1:9/x', timeout: 10m}}]\n"
                    "route: {receiver: h}\n")
    with pytest.raises(ConfigError, match=r"receivers\[0\]\.webhook\.timeout: must be positive and at most 5m"):
        load_config(path, {})


async def test_item_for_a_receiver_no_longer_configured_fails(db: StateDB,
                                                               session: aiohttp.ClientSession) -> None:
    """An outbox item whose receiver left the config (a restart with a new config) is failed, not retried."""
    t = [T0]
    cfg = make_config({"console": {"console": {}}}, {"receiver": "console"})
    db.outbox.enqueue(Notification(key="old:1", receiver="gone", kind="alerts", created_ms=ms(T0)), now_ms=ms(T0))
    rig = Rig(cfg, db, session, t)
    await rig.run(5)
    assert [(f["receiver"], f["key"]) for f in db.outbox.failed()] == [("gone", "old:1")]
    assert rig.d.stats.failed == {"gone": 1} and db.outbox.depth() == {}


# -- 11. a notification that cannot be rendered -----------------------------------------------------------------
UNRENDERABLE = [
    pytest.param("webhook", {"starts_at_ms": 253_402_304_399_000}, id="startsAt year 10000"),
    pytest.param("webhook", {"starts_at_ms": 2**63 + 1}, id="startsAt past 2**63 ms"),
    pytest.param("webhook", {"status": "resolved", "ends_at_ms": 10**20}, id="endsAt far past year 9999"),
    pytest.param("webhook", {"annotations": {"summary": "x\ud800y"}}, id="a lone surrogate in an annotation"),
    pytest.param("alertmanager", {"annotations": {"d": "\udfff"}}, id="a lone surrogate, Alertmanager"),
    pytest.param("alertmanager", {"labels": {"alertname": "Bad", "x": float("nan")}}, id="NaN-ish label value"),
]


@pytest.mark.parametrize(("receiver", "change"), UNRENDERABLE)
async def test_a_notification_that_cannot_be_rendered_fails_at_once_and_the_next_goes(
        db: StateDB, session: aiohttp.ClientSession, hooks: HookFactory, receiver: str,
        change: dict[str, Any]) -> None:
    """An item whose payload cannot be rendered or encoded (a time past year 9999 queued before the intake
    refused them, text no encoder takes) fails permanently at its first attempt, counted and logged, and the
    notification queued behind it is delivered in the same round instead of waiting behind retries."""
    t = [T0]
    hook = await hooks(t)
    config: dict[str, Any] = webhook(hook.url()) if receiver == "webhook" else {
        "alertmanager": {"urls": [hook.url().removesuffix("/hook")]}}
    cfg = make_config({"r": config}, {"receiver": "r", **FAST})
    rig = Rig(cfg, db, session, t)
    queue = "r" if receiver == "webhook" else "r[0]"
    good = AlertSnapshot(labels={"alertname": "Good"}, annotations={}, status="firing", starts_at_ms=ms(T0))
    bad = AlertSnapshot(**{"labels": {"alertname": "Bad"}, "annotations": {}, "status": "firing",
                           "starts_at_ms": ms(T0), **change})
    for i, alert in enumerate((bad, good)):
        db.outbox.enqueue(Notification(key=f"k{i}", receiver=queue, kind="alerts", created_ms=ms(T0),  # type: ignore[arg-type]
                                       status=alert.status, alerts=(alert,)), now_ms=ms(T0))
    await rig.d.deliver_due(ms(T0))
    await rig.d.drain()
    sent = [p.json()["alerts"] if receiver == "webhook" else p.json() for p in hook.posts()]
    assert [alerts[0]["labels"]["alertname"] for alerts in sent] == ["Good"]
    [failed] = db.outbox.failed()
    assert failed["attempts"] == 1 and "cannot be rendered" in failed["error"]
    assert rig.d.stats.failed == {queue: 1} and rig.d.stats.unrenderable == {queue: 1}
    assert rig.d.stats.retried == {} and db.outbox.depth() == {}


# -- 12. Retry-After from a receiver that asks for too much -----------------------------------------------------
HUGE_RETRY_AFTER = [(429, str(10**10)), (503, "Fri, 31 Dec 9999 23:59:59 GMT"), (429, "9" * 25), (503, "1e308"),
                    (429, "9" * 400)]


@pytest.mark.parametrize("status, retry_after", HUGE_RETRY_AFTER, ids=[f"{s}-{r[:12]}" for s, r in HUGE_RETRY_AFTER])
async def test_a_huge_retry_after_is_capped_and_give_up_after_still_ends_it(
        db: StateDB, session: aiohttp.ClientSession, hooks: HookFactory, status: int, retry_after: str) -> None:
    """A receiver asking to come back in decades is retried within the cap (300 s), and notify.give_up_after
    (here 10 min) ends the notification on time: its last attempt is at the give-up time, not a wait later."""
    t = [T0]
    hook = await hooks(t)
    hook.responder = reply(status, text="busy", headers={"Retry-After": retry_after})
    cfg = make_config({"hook": webhook(hook.url())}, {"receiver": "hook", "group_wait": "10s"},
                      notify={"retry_initial": "2s", "retry_max": "60s", "give_up_after": "10m"})
    rig = Rig(cfg, db, session, t, specs=[spec("Q", 0)])
    await rig.run(1200, step=5)
    # Queued at 10 s: attempts at 10, 310 (the cap), 610 (the give-up time, 600 s after it was queued).
    assert [p.at for p in hook.posts()] == [10, 310, 610]
    [failed] = db.outbox.failed()
    assert failed["attempts"] == 3
    assert rig.d.stats.retried == {"hook": 2} and rig.d.stats.failed == {"hook": 1}
