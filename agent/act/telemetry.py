"""What the act layer shows of itself: the state database's views for /metrics, the health of its
writes, the Alertmanager intake's counts, and the collector that puts them on the agent's /metrics.

Kept apart from :mod:`agent.act` (the wiring) because a scrape of /metrics reads only these, from
memory: it never waits for the state database's writer thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.act.dispatch import Dispatcher
from agent.act.scaling import Scaler

__all__ = ["FINDING_OUTCOMES", "INTAKE_OUTCOMES", "ActCollector", "ActViews", "IntakeStats", "StateHealth"]

INTAKE_OUTCOMES = ("accepted", "duplicate", "own")
#: Outcomes of ``POST /api/v1/findings``: matched (into an alert's incident), unmatched (an incident of
#: its own), duplicate (a key recorded before: a node agent's retry), invalid (400), unstored (503).
FINDING_OUTCOMES = ("matched", "unmatched", "duplicate", "invalid", "unstored")


@dataclass(frozen=True)
class ActViews:
    """What /metrics shows of the state database, read on the writer thread after each dispatch
    round, so that a scrape of /metrics never waits for a commit."""

    outbox_depth: dict[str, int] = field(default_factory=dict)
    desired_replicas: dict[str, int] = field(default_factory=dict)
    silences_active: int = 0
    intake_inbox: int = 0


@dataclass
class StateHealth:
    """How the state database's writes are going, for /readyz, /api/v1/status and /metrics."""

    write_failures: int = 0
    last_error: str = ""
    failing_since_ms: int = 0
    held: int = 0  # evaluations and findings waiting in memory for a write to succeed


@dataclass
class IntakeStats:
    """What the Alertmanager webhook received, for /metrics: alerts by outcome, webhooks refused."""

    alerts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(INTAKE_OUTCOMES, 0))
    rejected: int = 0  # webhooks answered 400
    unstored: int = 0  # webhooks answered 503: the state database refused the write
    processed: int = 0  # transitions taken from the inbox
    findings: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINDING_OUTCOMES, 0))


class _Act(Protocol):
    """What the collector reads of :class:`agent.act.ActLayer` (a protocol: no import cycle)."""

    dispatcher: Dispatcher | None
    views: ActViews
    scaler: Scaler
    health: StateHealth
    intake_stats: IntakeStats


class ActCollector(Collector):
    """Notification outcomes per receiver, outbox depth and desired replicas, on /metrics."""

    def __init__(self, act: _Act) -> None:
        self._act = act

    def collect(self) -> Iterator[Metric]:
        lbl = ["receiver"]
        sent = CounterMetricFamily("sre_agent_notifications_sent", "Notifications the receiver acknowledged.",
                                   labels=lbl)
        failed = CounterMetricFamily("sre_agent_notifications_failed",
                                     "Notifications given up on (rejected, or older than notify.give_up_after).",
                                     labels=lbl)
        retried = CounterMetricFamily("sre_agent_notifications_retried", "Delivery attempts that will be retried.",
                                      labels=lbl)
        unrenderable = CounterMetricFamily(
            "sre_agent_notifications_unrenderable",
            "Notifications failed at once because they could not be rendered or encoded (also in _failed).",
            labels=lbl)
        depth = GaugeMetricFamily("sre_agent_outbox_depth", "Notifications waiting in the outbox.", labels=lbl)
        d = self._act.dispatcher
        views = self._act.views
        queues = set(d.sinks) if d is not None else set()
        outbox = views.outbox_depth
        for q in sorted(queues | set(outbox)):
            if d is not None:
                sent.add_metric([q], d.stats.sent.get(q, 0))
                failed.add_metric([q], d.stats.failed.get(q, 0))
                retried.add_metric([q], d.stats.retried.get(q, 0))
                unrenderable.add_metric([q], d.stats.unrenderable.get(q, 0))
            depth.add_metric([q], outbox.get(q, 0))
        desired = GaugeMetricFamily("sre_agent_desired_replicas",
                                    "Replicas the agent wants per service (for an HPA via prometheus-adapter or KEDA).",
                                    labels=["service"])
        for service, n in sorted(views.desired_replicas.items()):
            desired.add_metric([service], n)
        actions = CounterMetricFamily("sre_agent_scale_actions",
                                      "Scale decisions by service, direction (out, in) and outcome (acted, dry_run, "
                                      "refused by a bound or cooldown).", labels=["service", "direction", "outcome"])
        for key, n in sorted(self._act.scaler.actions().items()):
            actions.add_metric(list(key), n)
        silences = GaugeMetricFamily("sre_agent_silences_active", "Silences in effect now.")
        silences.add_metric([], views.silences_active)
        h = self._act.health
        failures = CounterMetricFamily("sre_agent_state_write_failures",
                                       "State database writes that failed (disk full, I/O error); the work is held "
                                       "in memory and retried.")
        failures.add_metric([], h.write_failures)
        held = GaugeMetricFamily("sre_agent_state_held_work",
                                 "Evaluations and findings held in memory until the state database takes them.")
        held.add_metric([], h.held)
        yield from (sent, failed, retried, unrenderable, depth, desired, actions, silences, failures, held)
        yield from self._intake()

    def _intake(self) -> Iterator[Metric]:
        st = self._act.intake_stats
        alerts = CounterMetricFamily("sre_agent_intake_alerts",
                                     "Alerts in Alertmanager webhooks, by outcome: accepted (a new state), duplicate "
                                     "(a re-send), own (raised by this agent and returned by an Alertmanager).",
                                     labels=["outcome"])
        for outcome, n in st.alerts.items():
            alerts.add_metric([outcome], n)
        refused = CounterMetricFamily("sre_agent_intake_webhooks_refused",
                                      "Alertmanager webhooks refused: invalid (answered 400) or unstored (503, the "
                                      "state database refused the write; Alertmanager retries).", labels=["reason"])
        refused.add_metric(["invalid"], st.rejected)
        refused.add_metric(["unstored"], st.unstored)
        processed = CounterMetricFamily("sre_agent_intake_processed",
                                        "Alert transitions from Alertmanager webhooks processed.")
        processed.add_metric([], st.processed)
        inbox = GaugeMetricFamily("sre_agent_intake_inbox", "Alert transitions accepted and not processed yet.")
        inbox.add_metric([], self._act.views.intake_inbox)
        findings = CounterMetricFamily("sre_agent_intake_findings",
                                       "Findings node agents forwarded to POST /api/v1/findings, by outcome: "
                                       "matched (into a firing alert's incident), unmatched (an incident of its own), "
                                       "duplicate (a retry of a recorded key), invalid (400), unstored (503).",
                                       labels=["outcome"])
        for outcome, n in st.findings.items():
            findings.add_metric([outcome], n)
        yield from (alerts, refused, processed, inbox, findings)
