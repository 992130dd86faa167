"""Tests for agent.act.sinks.registry and agent.act.queues: receiver kinds, factories and queue names."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator

import aiohttp
import pytest

from agent.act.queues import alertmanager_queue, receiver_queue, scale_queue
from agent.act.sinks.alertmanager import AlertmanagerSink
from agent.act.sinks.console import ConsoleSink
from agent.act.sinks.registry import FACTORIES, SinkContext, build_sinks
from agent.act.sinks.scale import ScaleSink
from agent.act.sinks.webhook import WebhookSink
from agent.config import Config, ReceiverConfig
from tests.act.sinks.test_slack import DictRefs


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


def test_every_receiver_kind_has_exactly_one_factory() -> None:
    """The kinds the config accepts (ReceiverConfig's fields besides name) and the registry's keys are the same."""
    kinds = set(ReceiverConfig.model_fields) - {"name"}
    assert set(FACTORIES) == kinds


async def test_one_sink_per_queue_with_the_queue_names_the_outbox_uses(session: aiohttp.ClientSession) -> None:
    """console/webhook: the receiver's name; Alertmanager: name[i] per URL; scaling webhooks: scale:<service>."""
    config = Config.model_validate({
        "receivers": [{"name": "c", "console": {}},
                      {"name": "hook", "webhook": {"url": "http://127.0.0.1:9/h"}},
                      {"name": "am", "alertmanager": {"urls": ["http://127.0.0.1:9", "http://127.0.0.1:10"]}}],
        "route": {"receiver": "c"},
        "scaling": {"services": [{"name": "llama", "matchers": ['model_name="x"'],
                                  "webhook": {"url": "http://127.0.0.1:9/scale"}}]},
    })
    sinks = build_sinks(config, SinkContext(session, DictRefs(), io.StringIO()))
    assert list(sinks) == ["c", "hook", "am[0]", "am[1]", "scale:llama"]
    assert list(sinks) == [receiver_queue("c"), receiver_queue("hook"), alertmanager_queue("am", 0),
                           alertmanager_queue("am", 1), scale_queue("llama")]
    assert [type(s) for s in sinks.values()] == [ConsoleSink, WebhookSink, AlertmanagerSink, AlertmanagerSink,
                                                 ScaleSink]
