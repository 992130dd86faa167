"""The HA pair's wiring (``ha:``, docs/ha.md): the leadership the outbox consults, its elector, its metric.

Apart from :mod:`agent.app.leader` so that an agent without ``ha.mode: kubernetes`` never imports
the kubernetes client (about half a second at start-up, and nothing it needs).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.act.leadership import Leadership, direct_queues
from agent.config import Config

__all__ = ["Elector", "LeaderCollector", "ha_status", "leadership_for", "start_elector"]


class Elector(Protocol):
    def start(self) -> None: ...
    def stop(self) -> None: ...


def leadership_for(config: Config, *, longest_interval_s: float,
                   clock: Callable[[], float] = time.time) -> Leadership | None:
    """A :class:`Leadership` in ``kubernetes`` mode; None otherwise (every replica sends everything:
    ``none`` has one replica, ``alertmanager_only`` has no direct receivers). ``longest_interval_s``: the
    longest rule-group interval, by which the replicas' evaluations (and so their notifications) may differ.
    ``clock``: the agent's wall clock, the one that stamps outbox items. The write allowance is the lease
    API's request timeout (``retry_period``, agent.app.leader): how late a renew may commit after the leader
    computed what it carries."""
    ha = config.ha
    if ha.mode != "kubernetes":
        return None
    margin = ha.margin_s(longest_interval_s, config.notify.dispatch_interval)
    return Leadership(str(ha.identity), renew_deadline_s=ha.lease.renew_deadline, margin_s=margin,
                      queues=direct_queues(config), clock=clock, write_allowance_s=ha.lease.retry_period)


def start_elector(config: Config, leadership: Leadership) -> Elector:
    """Start the Lease election in its thread (the kubernetes client is imported here, only here)."""
    from agent.app.leader import LeaseElector  # noqa: PLC0415  (see the module docstring)

    elector = LeaseElector(config.ha, leadership)
    elector.start()
    return elector


def ha_status(config: Config, leadership: Leadership | None) -> dict[str, Any]:
    """``/api/v1/status``'s ``ha``: the mode, this replica, and in kubernetes mode who leads."""
    ha = config.ha
    out: dict[str, Any] = {"mode": ha.mode, "identity": ha.identity, "replica_labels": ha.replica_labels()}
    if leadership is not None:
        out |= {"leader": leadership.is_leader(), "holder": leadership.holder,
                "direct_queues": sorted(leadership.queues), "watermarks_seen": leadership.watermarks(),
                "margin_s": leadership.margin_ms / 1000}
    return out


class LeaderCollector(Collector):
    """``sre_agent_leader{identity}``: 1 while this replica may send to direct receivers, else 0."""

    def __init__(self, leadership: Leadership) -> None:
        self._leadership = leadership

    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("sre_agent_leader", "1 while this HA replica holds the lease and sends to direct "
                              "receivers (Slack, webhooks), else 0.", labels=["identity"])
        g.add_metric([self._leadership.identity], 1.0 if self._leadership.is_leader() else 0.0)
        yield g
        t = GaugeMetricFamily("sre_agent_leader_transitions", "Times this replica became or stopped being "
                              "leader since it started.", labels=["identity"])
        t.add_metric([self._leadership.identity], float(self._leadership.transitions))
        yield t
