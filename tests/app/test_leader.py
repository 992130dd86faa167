"""The Lease elector (kubernetes client's leader election) against tests/fake_kube.py: one leader of two,
the watermark travels on the lease (as a duration, whatever the two clocks say), an API outage ends
leadership within the renew deadline."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from agent.act.leadership import Leadership
from agent.app.leader import WATERMARK_ANNOTATION, LeaseElector, _watermarks
from agent.config import HaConfig, load_config
from tests.alertmanager import eventually
from tests.fake_kube import FakeKube, running_fake_kube

LEASE_S, RENEW_S, RETRY_S = 3, 2, 1  # the shortest timings the client accepts (renew > 1.2 x retry)


@pytest.fixture
async def kube() -> AsyncIterator[FakeKube]:
    async with running_fake_kube() as fake:
        yield fake


def _ha(tmp_path: Path, kube: FakeKube, identity: str) -> HaConfig:
    path = tmp_path / f"{identity}.yaml"
    path.write_text(json.dumps({"ha": {"mode": "kubernetes", "identity": identity, "lease": {
        "kubeconfig": str(kube.kubeconfig(tmp_path / "kubeconfig")), "lease_duration": f"{LEASE_S}s",
        "renew_deadline": f"{RENEW_S}s", "retry_period": f"{RETRY_S}s"}}}))
    return load_config(path, {}).ha


class SkewedClock:
    """A replica's wall clock: the real one plus ``offset_s`` (set once the test knows who leads)."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


class Replica:
    def __init__(self, ha: HaConfig) -> None:
        self.clock = SkewedClock()
        self.lead = Leadership(str(ha.identity), renew_deadline_s=RENEW_S, margin_s=0, queues=(), clock=self.clock,
                               write_allowance_s=RETRY_S)
        self.elector = LeaseElector(ha, self.lead)


async def _one_leader(a: Replica, b: Replica) -> tuple[Replica, Replica]:
    """Wait for exactly one of the two to lead; (leader, follower)."""
    async def one() -> Replica | None:
        leaders = [r for r in (a, b) if r.lead.is_leader()]
        assert len(leaders) <= 1
        return leaders[0] if leaders else None

    leader = await eventually(one, what="a leader")
    return leader, b if leader is a else a


BEHIND_MS = 5_000  # what the leader publishes: everything up to 5 s ago (its clock) is delivered


async def _published_and_seen(leader: Replica, follower: Replica, *, after: int | None = None) -> int:
    """The leader publishes a watermark BEHIND_MS ago on its own clock; the follower's copy of it, on its
    own clock, must never pass that moment and must get within a few lease rounds of it (and past
    ``after``). Returns it."""
    published_at_ms = follower.lead.now_ms()  # the moment, on the follower's clock
    leader.lead.publish({"hook": leader.lead.now_ms() - BEHIND_MS})
    slack_ms = RETRY_S * 1000 * 3 + 500  # the read before the write, the allowance, a slow round

    async def follower_caught_up() -> int | None:
        seen = follower.lead.watermarks().get("hook")
        if seen is None:
            return None
        assert seen <= published_at_ms - BEHIND_MS, (seen, published_at_ms)  # never more than was delivered
        caught_up = seen >= published_at_ms - BEHIND_MS - slack_ms and (after is None or seen > after)
        return seen if caught_up else None

    return await eventually(follower_caught_up, timeout=6 * RETRY_S + 5, what="the follower's watermark")


async def test_two_contend_one_leads_and_the_watermark_reaches_the_follower(tmp_path: Path, kube: FakeKube) -> None:
    """Exactly one holds the lease; what it publishes is written on the Lease and read by the other."""
    a, b = Replica(_ha(tmp_path, kube, "a")), Replica(_ha(tmp_path, kube, "b"))
    a.elector.start()
    b.elector.start()
    try:
        leader, follower = await _one_leader(a, b)
        assert kube.holder() == leader.lead.identity
        await _published_and_seen(leader, follower)
        carried = [json.loads(w.annotations[WATERMARK_ANNOTATION])["hook"] for w in kube.writes
                   if WATERMARK_ANNOTATION in w.annotations]
        assert carried and all(BEHIND_MS <= ms < BEHIND_MS + 60_000 for ms in carried)  # a duration, not a time
        deadline = time.monotonic() + LEASE_S + 2 * RETRY_S  # longer than a lease: the follower stays one
        while time.monotonic() < deadline:
            assert not follower.lead.is_leader()
            await asyncio.sleep(0.1)
        assert leader.lead.is_leader()
        assert {w.holder for w in kube.writes} == {leader.lead.identity}
    finally:
        a.elector.stop()
        b.elector.stop()


SKEWS_S = [60.0, 3600.0, -60.0, -3600.0]  # the leader's clock minus the follower's


@pytest.mark.parametrize("skew_s", SKEWS_S, ids=[f"leader{s:+.0f}s" for s in SKEWS_S])
async def test_the_followers_watermark_ignores_the_skew_between_the_clocks(
        tmp_path: Path, kube: FakeKube, skew_s: float) -> None:
    """With the leader's clock a minute or an hour ahead or behind, the follower's copy of the watermark
    still never passes what the leader delivered, and still follows it within a few lease rounds."""
    a, b = Replica(_ha(tmp_path, kube, "a")), Replica(_ha(tmp_path, kube, "b"))
    a.elector.start()
    b.elector.start()
    try:
        leader, follower = await _one_leader(a, b)
        leader.clock.offset_s = skew_s
        first = await _published_and_seen(leader, follower)
        await _published_and_seen(leader, follower, after=first)  # and it moves on with the leader
    finally:
        a.elector.stop()
        b.elector.stop()


async def test_api_outage_ends_leadership_within_the_renew_deadline(tmp_path: Path, kube: FakeKube) -> None:
    """No renew gets through: the flag drops at most renew_deadline after the last successful renew (before
    the lease could expire for anyone else); when the API is back, leadership is taken again."""
    a = Replica(_ha(tmp_path, kube, "a"))
    a.elector.start()
    try:
        async def leading() -> bool | None:
            return True if a.lead.is_leader() else None

        await eventually(leading, what="leadership")
        kube.outage()
        last_renew = kube.writes[-1].at

        async def stopped() -> float | None:
            return None if a.lead.is_leader() else time.time()

        stopped_at = await eventually(stopped, what="leadership lost")
        assert kube.refused > 0
        assert stopped_at - last_renew <= RENEW_S + 0.5, stopped_at - last_renew
        kube.recover()
        await eventually(leading, what="leadership taken again")
    finally:
        a.elector.stop()


@pytest.mark.parametrize("raw", [None, "", "12", "[1]", '{"hook": "12"}', '{"hook": 1.5}', '{"hook": true}', "{"])
def test_a_watermark_annotation_of_another_shape_is_ignored(raw: object) -> None:
    """Only a JSON object of queue -> integer milliseconds is taken; anything else is as if absent."""
    assert _watermarks(raw) is None


def test_the_watermark_annotation_is_read() -> None:
    assert _watermarks('{"hook":12,"slack":13}') == {"hook": 12, "slack": 13}


async def test_fake_lease_api_refuses_a_stale_resource_version(kube: FakeKube) -> None:
    """The stand-in's optimistic concurrency, as the elector meets it: the second writer of one version
    gets 409, a write without a version 422."""
    headers = {"Authorization": f"Bearer {kube.token}"}
    base = f"{kube.url}/apis/coordination.k8s.io/v1/namespaces/default/leases"
    async with aiohttp.ClientSession(headers=headers) as s:
        async with s.get(f"{base}/x") as r:
            assert r.status == 404 and (await r.json())["code"] == 404
        async with s.post(base, json={"metadata": {"name": "x"}, "spec": {"holderIdentity": "a"}}) as r:
            assert r.status == 201
            version = (await r.json())["metadata"]["resourceVersion"]
        statuses = []
        for holder in ("a", "b"):
            body = {"metadata": {"name": "x", "resourceVersion": version}, "spec": {"holderIdentity": holder}}
            async with s.put(f"{base}/x", json=body) as r:
                statuses.append(r.status)
        async with s.put(f"{base}/x", json={"metadata": {"name": "x"}, "spec": {}}) as r:
            statuses.append(r.status)
        async with s.get(f"{base}/x", headers={"Authorization": "Bearer wrong"}) as r:
            statuses.append(r.status)
    assert statuses == [200, 409, 422, 401]
    assert kube.holder("x") == "a"
