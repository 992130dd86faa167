"""HA in the outbox: a follower holds direct items, settles what the leader's watermark covers, and
sends the rest when it leads; a lease that is not renewed stops direct sends within its renew deadline;
a pair whose wall clocks disagree (an hour either way) still settles exactly what the leader delivered."""

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
ALLOWANCE_S = 1.0  # the lease API's request timeout
T0_MS = 1_700_000_000_000
NOW_MS = T0_MS + 60_000  # the rig's wall clock


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
                               queues=direct_queues(config), monotonic=clock, clock=lambda: NOW_MS / 1000)
        self.delivery = OutboxDelivery(db, build_sinks(config, db, session), config.notify, scaler=None,
                                       clock=lambda: NOW_MS / 1000, rng=lambda: 0.5, leadership=self.lead)

    def leader_says(self, watermark_ms: int) -> None:
        """Two reads of the lease as written by the other replica: the second, a new version, carries a
        ``behind`` that puts the leader's watermark at ``watermark_ms`` on this replica's clock."""
        self.lead.observed("other", None, version="1", read_started_ms=NOW_MS)
        self.lead.observed("other", {"hook": NOW_MS - watermark_ms}, version="2", read_started_ms=NOW_MS)

    async def round(self) -> None:
        await self.delivery.start_due(NOW_MS)
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
    rig.leader_says(watermark)
    await rig.round()
    assert hook.posts() == []
    assert rig.pending() == ["hook:2", "hook:3"]
    assert rig.delivery.stats.settled == {"hook": 2}
    rig.lead.acquired()
    await rig.round()
    assert _sent(hook) == ["A2", "A3"]
    assert rig.pending() == []
    # as leader it computes its watermark at the start of each round: just below the oldest item it
    # still had to send, then (nothing direct left) everything up to now; the lease carries how far
    # behind now that is
    assert rig.lead.to_publish() == {"hook": NOW_MS - (watermark - margin_ms), "other": 1}
    await rig.round()
    assert rig.lead.to_publish() == {"hook": 1, "other": 1}


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
    assert rig.lead.to_publish() == {"hook": NOW_MS - (T0_MS + 5_000 - 1), "other": 1}
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
    lead.observed("other", {"hook": 5}, version="1", read_started_ms=100)
    lead.observed("other", {"hook": 5}, version="2", read_started_ms=200)
    lead.observed("me", {"hook": 9}, version="3", read_started_ms=300)
    assert lead.watermarks() == {"hook": 95}
    assert lead.holder == "other"


A_MS = int(ALLOWANCE_S * 1000)

#: (what the reads returned: version, the holder's ``behind`` per queue, when the read started), the
#: follower's watermarks after them
READS = {
    "the first read proves nothing": ([("1", {"hook": 0}, 1000)], {}),
    "a new version: the previous read's start less behind and the allowance":
        ([("1", None, 1000), ("2", {"hook": 300, "other": 0}, 3000)], {"hook": 700 - A_MS, "other": 1000 - A_MS}),
    "the same version read again moves nothing":
        ([("1", None, 1000), ("2", {"hook": 300}, 3000), ("2", {"hook": 300}, 9000)], {"hook": 700 - A_MS}),
    "the next version counts from the read that returned the one before":
        ([("1", None, 1000), ("2", {"hook": 0}, 3000), ("3", {"hook": 0}, 5000)], {"hook": 3000 - A_MS}),
    "a claim of the future counts as zero":
        ([("1", None, 1000), ("2", {"hook": -3_600_000}, 3000)], {"hook": 1000 - A_MS}),
    "a version without annotation keeps what was seen":
        ([("1", None, 1000), ("2", {"hook": 100}, 3000), ("3", None, 5000)], {"hook": 900 - A_MS}),
}


@pytest.mark.parametrize(("reads", "expected"), list(READS.values()), ids=list(READS))
def test_follower_watermark_is_on_its_own_clock(reads: list[tuple[str, dict[str, int] | None, int]],
                                                expected: dict[str, int]) -> None:
    """The follower's copy of the leader's watermark comes from its own read times and the leader's
    durations only: never later than the start of the read before the version it was written in."""
    lead = Leadership("me", renew_deadline_s=RENEW_DEADLINE_S, margin_s=0, queues=(), write_allowance_s=ALLOWANCE_S)
    for version, behind, started in reads:
        lead.observed("other", behind, version=version, read_started_ms=started)
    assert lead.watermarks() == expected


# -- a skewed pair: each replica's wall clock at its own offset from the real time ----------------

SKEWS_S = [0.0, 60.0, 3600.0, -60.0, -3600.0]  # the leader's clock minus the follower's


class RealTime:
    """The one real time both replicas live in (monotonic seconds), moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Replica:
    """One replica of the pair: its own state database and outbox, its wall clock ``offset_s`` off the real time."""

    def __init__(self, name: str, db: StateDB, config: Config, session: aiohttp.ClientSession, *,
                 real: RealTime, offset_s: float) -> None:
        self.db = db
        self.real, self.offset_s = real, offset_s
        self.lead = Leadership(name, renew_deadline_s=RENEW_DEADLINE_S, margin_s=MARGIN_S,
                               queues=direct_queues(config), monotonic=real, clock=self.wall,
                               write_allowance_s=ALLOWANCE_S)
        self.delivery = OutboxDelivery(db, build_sinks(config, db, session), config.notify, scaler=None,
                                       clock=self.wall, rng=lambda: 0.5, leadership=self.lead)

    def wall(self) -> float:
        return T0_MS / 1000 + self.real() + self.offset_s

    def now_ms(self) -> int:
        return int(self.wall() * 1000)

    def enqueue(self, n: int) -> None:
        self.db.outbox.enqueue(_note(n, self.now_ms()), now_ms=self.now_ms())

    async def round(self) -> None:
        await self.delivery.start_due(self.now_ms())
        await self.delivery.drain()

    def pending(self) -> list[str]:
        return [i.key for i in self.db.outbox.pending("hook")]


class Lease:
    """The Lease as the API server keeps it: the holder, the watermark annotation, a version every write bumps."""

    def __init__(self) -> None:
        self.holder: str | None = None
        self.annotation: dict[str, int] | None = None
        self.version = 0

    def renew(self, leader: Replica) -> None:
        self.holder, self.annotation = leader.lead.identity, leader.lead.to_publish() or None
        self.version += 1
        leader.lead.acquired()

    def read(self, replica: Replica) -> None:
        replica.lead.observed(self.holder, self.annotation, version=str(self.version),
                              read_started_ms=replica.now_ms())


@pytest.mark.parametrize("skew_s", SKEWS_S, ids=[f"leader{s:+.0f}s" for s in SKEWS_S])
async def test_skewed_pair_settles_only_what_the_leader_delivered(
        tmp_path: Path, hook: RecordingServer, skew_s: float) -> None:
    """Whatever the skew between the two wall clocks, the follower settles the notification the leader
    delivered (not sent twice) and keeps the one the leader never delivered, which it sends on takeover."""
    config, real = _config(hook), RealTime()
    leader_db, follower_db = StateDB(tmp_path / "leader.db"), StateDB(tmp_path / "follower.db")
    lease = Lease()
    try:
        async with aiohttp.ClientSession() as session:
            leader = Replica("leader", leader_db, config, session, real=real, offset_s=skew_s)
            follower = Replica("follower", follower_db, config, session, real=real, offset_s=0.0)
            lease.read(follower)
            lease.renew(leader)

            async def tick(seconds: float) -> None:  # the pair in steady state, one dispatch round a second
                end = real.now + seconds
                while real.now < end:
                    real.now += 1
                    await leader.round()
                    lease.renew(leader)
                    lease.read(follower)
                    await follower.round()

            follower.enqueue(1)  # both evaluate the alert, the follower a moment first
            real.now += 0.3
            leader.enqueue(1)
            await tick(10)
            assert _sent(hook) == ["A1"]
            assert follower.pending() == []  # settled: the leader delivered it
            follower.enqueue(2)  # the next alert: the leader's evaluation comes later (within the margin) ...
            real.now += 0.5
            await leader.round()  # ... after it published "nothing left to send"
            lease.renew(leader)
            lease.read(follower)
            await follower.round()
            real.now += 0.5
            leader.enqueue(2)  # then it dies before delivering its copy
            for _ in range(5):
                real.now += 1
                lease.read(follower)
                await follower.round()
            assert follower.pending() == ["hook:2"]
            follower.lead.acquired()  # takeover
            await follower.round()
            assert _sent(hook) == ["A1", "A2"]
            assert follower.pending() == []
    finally:
        leader_db.close()
        follower_db.close()
