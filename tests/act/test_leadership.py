"""HA in the outbox: a follower holds direct items, settles what the leader's watermark covers, and
sends the rest when it leads; a lease that is not renewed stops direct sends within its renew deadline."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agent.act import build_sinks
from agent.act.leadership import Leadership, direct_queues
from agent.act.notification import AlertSnapshot, Notification
from agent.act.outbox import OutboxDelivery
from agent.act.queues import receiver_queue
from agent.act.state import StateDB
from agent.config import Config
from tests.receivers import RecordingServer

RENEW_DEADLINE_S = 10.0
MARGIN_S = 2.0
T0_MS = 1_700_000_000_000


class Clock:
    """The elector's monotonic clock, moved by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def db(tmp_path: Path) -> Iterator[StateDB]:
    state = StateDB(tmp_path / "s.db")
    yield state
    state.close()


@pytest.fixture
async def hook() -> AsyncIterator[RecordingServer]:
    async with RecordingServer() as rec:
        yield rec


def _config(hook: RecordingServer, am_url: str = "http://127.0.0.1:9") -> Config:
    return Config.model_validate({
        "receivers": [{"name": "hook", "webhook": {"url": hook.url("/hook"), "timeout": "2s"}},
                      {"name": "other", "webhook": {"url": hook.url("/other"), "timeout": "2s"}},
                      {"name": "am", "alertmanager": {"urls": [am_url]}},
                      {"name": "console", "console": {}}],
        "route": {"receiver": "hook"}, "actions": [],
        "notify": {"retry_initial": "1s", "retry_max": "2s"},
    })


def _note(n: int, created_ms: int, receiver: str = "hook") -> Notification:
    alert = AlertSnapshot(labels={"alertname": f"A{n}"}, annotations={}, status="firing", starts_at_ms=created_ms)
    return Notification(key=f"{receiver}:{n}", receiver=receiver_queue(receiver), kind="alerts",
                        created_ms=created_ms, status="firing", alerts=(alert,))


class Rig:
    def __init__(self, db: StateDB, config: Config, session: aiohttp.ClientSession, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.lead = Leadership("me", renew_deadline_s=RENEW_DEADLINE_S, margin_s=MARGIN_S,
                               queues=direct_queues(config), monotonic=clock)
        self.delivery = OutboxDelivery(db, build_sinks(config, db, session), config.notify, scaler=None,
                                       clock=lambda: T0_MS / 1000 + 60, rng=lambda: 0.5, leadership=self.lead)

    async def round(self) -> None:
        await self.delivery.start_due(T0_MS + 60_000)
        await self.delivery.drain()

    def pending(self) -> list[str]:
        return [i.key for i in self.db.outbox.pending("hook")]


@pytest.fixture
async def rig(db: StateDB, hook: RecordingServer) -> AsyncIterator[Rig]:
    async with aiohttp.ClientSession() as session:
        yield Rig(db, _config(hook), session, Clock())


def _sent(hook: RecordingServer) -> list[str]:
    return [r.json()["alerts"][0]["labels"]["alertname"] for r in hook.accepted("/hook")]


def test_direct_queues_are_slack_and_webhooks_only(hook: RecordingServer) -> None:
    """Alertmanager (de-duplicates) and console (the replica's own output) receivers are not held."""
    assert direct_queues(_config(hook)) == {"hook", "other"}


async def test_follower_holds_direct_items(rig: Rig, hook: RecordingServer) -> None:
    """Without the lease nothing goes to the webhook, and the items stay queued."""
    rig.db.outbox.enqueue(_note(1, T0_MS), now_ms=T0_MS)
    await rig.round()
    assert hook.posts() == []
    assert rig.pending() == ["hook:1"]


async def test_follower_settles_what_the_watermark_covers_and_sends_the_rest_as_leader(
        rig: Rig, hook: RecordingServer) -> None:
    """Held items created at or before the leader's watermark less the margin leave the outbox unsent;
    on takeover the new leader sends exactly the others, in order."""
    margin_ms = int(MARGIN_S * 1000)
    watermark = T0_MS + 10_000
    for n, created in enumerate([watermark - margin_ms - 1, watermark - margin_ms, watermark - margin_ms + 1,
                                 watermark + 5_000]):
        rig.db.outbox.enqueue(_note(n, created), now_ms=created)
    rig.lead.observed("other", {"hook": watermark})
    await rig.round()
    assert hook.posts() == []
    assert rig.pending() == ["hook:2", "hook:3"]
    assert rig.delivery.stats.settled == {"hook": 2}
    rig.lead.acquired()
    await rig.round()
    assert _sent(hook) == ["A2", "A3"]
    assert rig.pending() == []
    # as leader it publishes its watermark at the start of each round: just below the oldest item it
    # still had to send, then (nothing direct left) everything up to now
    assert rig.lead.to_publish() == {"hook": watermark - margin_ms, "other": T0_MS + 60_000 - 1}
    await rig.round()
    assert rig.lead.to_publish() == {"hook": T0_MS + 60_000 - 1, "other": T0_MS + 60_000 - 1}


async def test_leader_watermark_stops_below_its_oldest_undelivered_item_of_that_receiver_only(
        rig: Rig, hook: RecordingServer) -> None:
    """A receiver that is down holds its own watermark just below the item it is stuck on; the other
    receiver's goes on (one watermark per queue)."""
    async def answer(request: web.Request, body: bytes) -> web.StreamResponse:
        return web.Response(status=503 if request.path == "/hook" else 200)

    hook.responder = answer
    rig.lead.acquired()
    rig.db.outbox.enqueue(_note(1, T0_MS + 5_000), now_ms=T0_MS + 5_000)
    rig.db.outbox.enqueue(_note(2, T0_MS + 6_000, "other"), now_ms=T0_MS + 6_000)
    await rig.round()
    await rig.round()  # the watermark is computed at the start of a round, from what is still queued
    assert rig.lead.to_publish() == {"hook": T0_MS + 5_000 - 1, "other": T0_MS + 60_000 - 1}
    assert rig.pending() == ["hook:1"]


async def test_lease_not_renewed_stops_direct_sends_within_the_renew_deadline(
        rig: Rig, hook: RecordingServer) -> None:
    """The flag is lease-bound: renew_deadline after the last successful renew, the next send is held,
    even in the middle of a backlog, without the elector having noticed."""
    rig.lead.acquired()
    sent_at: list[float] = []

    async def answer(request: web.Request, body: bytes) -> web.StreamResponse:
        sent_at.append(rig.clock.now)
        rig.clock.now += RENEW_DEADLINE_S / 2 + 0.1  # each delivery takes over half the deadline
        return web.Response(status=200)

    hook.responder = answer
    for n in range(4):
        rig.db.outbox.enqueue(_note(n, T0_MS + n), now_ms=T0_MS + n)
    await rig.round()
    assert _sent(hook) == ["A0", "A1"]  # the third would start past the deadline
    assert all(t - 100.0 < RENEW_DEADLINE_S for t in sent_at)
    assert rig.pending() == ["hook:2", "hook:3"]
    assert not rig.lead.is_leader()
    rig.lead.acquired()  # renewed again: the backlog follows
    hook.responder = None
    await rig.round()
    assert _sent(hook) == ["A0", "A1", "A2", "A3"]


def test_leader_flag_expires_exactly_at_the_renew_deadline() -> None:
    """True just before renew_deadline after the last renew, false at it; a renew extends it."""
    clock = Clock()
    lead = Leadership("me", renew_deadline_s=RENEW_DEADLINE_S, margin_s=0, queues=(), monotonic=clock)
    assert not lead.is_leader()
    lead.acquired()
    clock.now += RENEW_DEADLINE_S - 0.001
    assert lead.is_leader()
    clock.now += 0.001
    assert not lead.is_leader()
    lead.acquired()
    assert lead.is_leader()
    lead.lost()
    assert not lead.is_leader()
    assert lead.transitions == 4


def test_own_watermark_is_not_taken_as_the_leaders() -> None:
    """A lease read that shows this replica as holder does not move the observed watermark."""
    lead = Leadership("me", renew_deadline_s=RENEW_DEADLINE_S, margin_s=0, queues=())
    lead.observed("other", {"hook": 5})
    lead.observed("me", {"hook": 9})
    assert lead.watermarks() == {"hook": 5}
    assert lead.holder == "other"
