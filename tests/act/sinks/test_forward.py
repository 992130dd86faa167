"""Tests for agent.act.sinks.forward against a real local server: the request, the token, the status policy."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from agent.act.notification import AlertSnapshot, Notification
from agent.act.queues import forward_queue
from agent.act.sinks.forward import ForwardSink
from agent.config import ForwardConfig
from agent.diagnose.findings import Finding
from agent.errors import DeliveryError
from tests.receivers import RecordingServer

FINDING = Finding(kind="nccl-bandwidth-low", summary="all-reduce at 12 GB/s", labels={"gpu": "0"})
TOKEN = "forward-token-for-tests"


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def _note(kind: str = "finding", alerts: tuple[AlertSnapshot, ...] = ()) -> Notification:
    return Notification(key="finding:forward:0123:42", receiver=forward_queue(), kind=kind,  # type: ignore[arg-type]
                        created_ms=42, alerts=alerts, finding=FINDING.to_json())


def _sink(rec: RecordingServer, session: aiohttp.ClientSession) -> ForwardSink:
    cfg = ForwardConfig.model_validate({"url": rec.url("/"), "token_env": "T", "labels": {"node": "n7"}},
                                       context={"environ": {"T": TOKEN}})
    return ForwardSink(forward_queue(), cfg, session)


async def test_a_finding_is_posted_to_the_intake_with_the_token_and_key(session: aiohttp.ClientSession) -> None:
    """POST <url>/api/v1/findings, Bearer token, Idempotency-Key = the outbox key, body = key + finding + labels."""
    async with RecordingServer() as rec:
        alert = AlertSnapshot(labels={"alertname": "GPUMemoryNearFull", "gpu": "0"}, annotations={},
                              status="firing", starts_at_ms=7)
        await _sink(rec, session).send(_note(alerts=(alert,)))
        [req] = rec.posts()
    assert req.path == "/api/v1/findings"
    assert req.headers["Authorization"] == f"Bearer {TOKEN}"
    assert req.key == "finding:forward:0123:42"
    body = req.json()
    assert body == {"version": "1", "key": "finding:forward:0123:42", "finding": FINDING.to_json(),
                    "labels": {"node": "n7"},
                    "alert": {"labels": {"alertname": "GPUMemoryNearFull", "gpu": "0"}, "startsAt": 7}}


async def test_only_findings_are_forwarded(session: aiohttp.ClientSession) -> None:
    """An alert batch in the forward queue (none is put there) is not sent."""
    async with RecordingServer() as rec:
        assert await _sink(rec, session).send(_note(kind="alerts")) is None
        assert rec.posts() == []


@pytest.mark.parametrize(("status", "permanent"), [(401, True), (400, True), (403, True), (404, True), (413, True),
                                                  (422, True), (408, False), (429, False), (503, False),
                                                  (500, False)])
async def test_the_central_agents_answer_decides_retry(session: aiohttp.ClientSession, status: int,
                                                       permanent: bool) -> None:
    """A refused token or payload (any 4xx but 408 and 429) is permanent (the outbox's failed items); a request
    timeout, a rate limit and a 5xx are retried."""
    async with RecordingServer(status=status) as rec:
        with pytest.raises(DeliveryError) as err:
            await _sink(rec, session).send(_note())
    assert err.value.permanent is permanent
    assert TOKEN not in str(err.value)


async def test_a_central_outage_is_retryable(session: aiohttp.ClientSession) -> None:
    """Connection refused: a retryable DeliveryError (the outbox keeps the finding)."""
    rec = await RecordingServer().start()
    sink = _sink(rec, session)
    await rec.stop()
    with pytest.raises(DeliveryError) as err:
        await sink.send(_note())
    assert not err.value.permanent


def test_forward_config_takes_the_node_from_the_environment() -> None:
    """labels_env reads the node name (downward API); an unset variable or an inline token is refused."""
    cfg = ForwardConfig.model_validate({"url": "http://central:9400/", "labels_env": {"node": "NODE_NAME"}},
                                       context={"environ": {"NODE_NAME": "gpu-node-7"}})
    assert cfg.labels == {"node": "gpu-node-7"} and cfg.endpoint == "http://central:9400/api/v1/findings"
    with pytest.raises(ValueError, match="NODE_NAME"):
        ForwardConfig.model_validate({"url": "http://c:1", "labels_env": {"node": "NODE_NAME"}},
                                     context={"environ": {}})
    with pytest.raises(ValueError, match="not accepted inline"):
        ForwardConfig.model_validate({"url": "http://c:1", "token": "secret"})
