"""Remote write: the agent's rule results (and, in embedded mode, what it scraped) into a Prometheus-compatible TSDB.

The daemon hands :meth:`RemoteWrite.enqueue` what the rule manager wrote in each evaluation, by
kind (``recording``: recording-rule results; ``alerts``: ``ALERTS`` and ``ALERTS_FOR_STATE``;
``scraped``); each ``remote_write`` entry takes the kinds its ``write:`` names into its own
persistent queue (:mod:`~agent.act.remote_write.queue`), which sends them with Prometheus' remote
write 1.0 protocol (:mod:`~agent.act.remote_write.wire`). :class:`RemoteWriteCollector` puts each
queue's counters on the agent's ``/metrics``, labelled ``remote_name`` and ``url``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.act.remote_write.queue import RemoteWriteQueue, RemoteWriteStats, Sample
from agent.act.state import StateDB
from agent.config.remote_write import RemoteWriteConfig

__all__ = ["RemoteWrite", "RemoteWriteCollector", "RemoteWriteQueue", "RemoteWriteStats", "Sample"]

log = structlog.get_logger(__name__)


class RemoteWrite:
    """Every configured remote's queue. Built at start-up: it reads what an earlier process left pending
    (and deletes the queues of remotes no longer configured, saying so)."""

    def __init__(self, configs: Sequence[RemoteWriteConfig], db: StateDB, *,
                 external_labels: Mapping[str, str] | None = None, clock: Callable[[], float] = time.time) -> None:
        self.queues = [RemoteWriteQueue(c, db, external_labels=external_labels, clock=clock) for c in configs]
        #: The kinds at least one remote writes; the daemon collects only these.
        self.kinds = frozenset(k for c in configs for k in c.write)
        for queue, gone in db.remote_write.forget({q.name for q in self.queues}).items():
            log.warning("remote write: dropped the queue of a remote no longer configured", remote=queue,
                        samples=gone)
        for q in self.queues:
            if q.load():
                log.info("remote write: samples pending from before the restart", remote=q.name,
                         samples=q.stats.pending)

    async def enqueue(self, by_kind: Mapping[str, Sequence[Sample]], now_ms: int) -> None:
        """Queue each remote's kinds of ``by_kind`` (persisted when this returns)."""
        for q in self.queues:
            kinds = [k for k in q.config.write if by_kind.get(k)]
            samples = by_kind[kinds[0]] if len(kinds) == 1 else [s for k in kinds for s in by_kind[k]]
            if samples:
                await q.enqueue(samples, now_ms)

    def start(self) -> None:
        for q in self.queues:
            q.start()

    async def stop(self) -> None:
        for q in self.queues:
            await q.stop()


class RemoteWriteCollector(Collector):
    """Each remote's counters on /metrics, read from memory (a scrape never waits for the state database)."""

    def __init__(self, remote_write: RemoteWrite) -> None:
        self._rw = remote_write

    def collect(self) -> Iterator[Metric]:
        names = ["remote_name", "url"]
        prefix = "sre_agent_remote_write_"
        sent = CounterMetricFamily(f"{prefix}sent_samples", "Samples the remote acknowledged (2xx).", labels=names)
        failed = CounterMetricFamily(f"{prefix}failed_samples", "Samples the remote refused with a 4xx other than "
                                     "429; not retried.", labels=names)
        retried = CounterMetricFamily(f"{prefix}retried_samples", "Samples in requests that failed (5xx, 429, "
                                      "timeout, connection) and are sent again.", labels=names)
        dropped = CounterMetricFamily(f"{prefix}dropped_samples", "Samples dropped before they were sent, by reason "
                                      "(queue_full: the oldest beyond queue.capacity).",
                                      labels=[*names, "reason"])
        pending = GaugeMetricFamily(f"{prefix}pending_samples", "Samples queued in the state database, waiting.",
                                    labels=names)
        sent_bytes = CounterMetricFamily(f"{prefix}sent_bytes", "Compressed request bytes the remote acknowledged.",
                                         labels=names)
        last = GaugeMetricFamily(f"{prefix}last_send_timestamp_seconds", "When the remote last acknowledged a "
                                 "request (0: never, in this process).", labels=names)
        for q in self._rw.queues:
            s, lv = q.stats, [q.name, q.url]
            sent.add_metric(lv, s.sent)
            failed.add_metric(lv, s.failed)
            retried.add_metric(lv, s.retried)
            for reason in ("queue_full", "invalid", "state_error"):
                dropped.add_metric([*lv, reason], s.dropped[reason])
            pending.add_metric(lv, s.pending)
            sent_bytes.add_metric(lv, s.sent_bytes)
            last.add_metric(lv, s.last_send_s)
        yield from (sent, failed, retried, dropped, pending, sent_bytes, last)
