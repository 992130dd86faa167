"""Receiver kind -> sink factory: how a configured receiver becomes the sinks of its queues.

Why a table: adding a receiver kind is one factory and one line here, and a test checks that
every kind the config accepts has a factory (and no factory lacks a config kind). A factory
takes the receiver's config and what the sinks share (the HTTP session, the Slack message
references, the console's stream) and returns one sink per outbox queue it serves: one for
most kinds, one per URL for Alertmanager (:mod:`agent.act.queues`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import aiohttp

from agent.act.queues import QueueName, alertmanager_queue, forward_queue, receiver_queue, scale_queue
from agent.act.sinks import MessageRefs, Sink
from agent.act.sinks.alertmanager import AlertmanagerSink
from agent.act.sinks.console import ConsoleSink
from agent.act.sinks.forward import ForwardSink
from agent.act.sinks.scale import ScaleSink
from agent.act.sinks.slack import SlackSink
from agent.act.sinks.webhook import WebhookSink
from agent.config import Config, ReceiverConfig

__all__ = ["FACTORIES", "SinkContext", "build_sinks"]


@dataclass(frozen=True)
class SinkContext:
    """What sinks share: one HTTP session, the message references, the console's stream."""

    session: aiohttp.ClientSession
    refs: MessageRefs
    stream: TextIO | None = None
    report_url: str = ""  # server.external_url, for links to the triage reports


Factory = Callable[[ReceiverConfig, SinkContext], dict[QueueName, Sink]]


def _console(r: ReceiverConfig, ctx: SinkContext) -> dict[QueueName, Sink]:
    return {receiver_queue(r.name): ConsoleSink(r.name, ctx.stream or sys.stdout)}


def _slack(r: ReceiverConfig, ctx: SinkContext) -> dict[QueueName, Sink]:
    assert r.slack is not None  # the factory is chosen by the kind the receiver sets
    return {receiver_queue(r.name): SlackSink(r.name, r.slack, ctx.refs, report_url=ctx.report_url)}


def _webhook(r: ReceiverConfig, ctx: SinkContext) -> dict[QueueName, Sink]:
    assert r.webhook is not None
    return {receiver_queue(r.name): WebhookSink(r.name, r.webhook, ctx.session)}


def _alertmanager(r: ReceiverConfig, ctx: SinkContext) -> dict[QueueName, Sink]:
    am = r.alertmanager
    assert am is not None
    return {alertmanager_queue(r.name, i): AlertmanagerSink(r.name, url, am, ctx.session)
            for i, url in enumerate(am.urls)}


#: One factory per receiver kind (``ReceiverConfig.kind``).
FACTORIES: dict[str, Factory] = {
    "console": _console,
    "slack": _slack,
    "webhook": _webhook,
    "alertmanager": _alertmanager,
}


def build_sinks(config: Config, ctx: SinkContext) -> dict[QueueName, Sink]:
    """One sink per outbox queue: every receiver's, every scaling service's webhook, and the central
    agent's intake when ``forward`` is set."""
    sinks: dict[QueueName, Sink] = {}
    for r in config.receivers:
        sinks.update(FACTORIES[r.kind](r, ctx))
    for svc in config.scaling.services:
        if svc.webhook is not None:
            queue = scale_queue(svc.name)
            sinks[queue] = ScaleSink(queue, svc.webhook, ctx.session)
    if config.forward is not None:
        sinks[forward_queue()] = ForwardSink(forward_queue(), config.forward, ctx.session)
    return sinks
