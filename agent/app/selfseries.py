"""The agent's own health series, written into its own store at each scrape cycle.

Why: the bundled rules (``rules/agent.rules.yaml``) watch the agent itself: state database writes
(SREAgentStateWritesFailing), the store's series cap (SREAgentStoreSeriesLimitReached), rule
evaluation (SREAgentRuleEvaluationsFailing) and remote write (SREAgentRemoteWriteBehind,
SREAgentRemoteWriteLosingSamples). The same figures are on ``/metrics``; writing them into the
store too makes those alerts fire without a Prometheus scraping the agent.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.act.remote_write.queue import RemoteWriteQueue
from agent.act.telemetry import StateHealth
from agent.rules.manager import Group, rule_group_label
from agent.series import Labels, labels_from
from agent.store import Store

__all__ = ["self_series"]

_STATE_FAILURES = "sre_agent_state_write_failures_total"  # also on /metrics (agent.act.ActCollector)
_RULE_FAILURES = "sre_agent_rule_evaluation_failures_total"  # these two also on /metrics (agent.app.telemetry)
_FAILING_RULES = "sre_agent_rule_group_failing_rules"
_RW = "sre_agent_remote_write_"  # the remote-write series too (agent.act.remote_write.RemoteWriteCollector)


def self_series(store: Store, health: StateHealth, groups: Iterable[Group], queues: Iterable[RemoteWriteQueue],
                now_ms: int) -> list[tuple[Labels, float, int]]:
    """The rows (labels, value, timestamp) of the agent's own series at ``now_ms``."""
    st = store
    rows = [(labels_from(name), float(value), now_ms) for name, value in (
        (_STATE_FAILURES, health.write_failures),
        ("sre_agent_store_series", st.series_count),
        ("sre_agent_store_max_series", st.max_series),
        ("sre_agent_store_refused_series_total", st.refused_series),
    )]
    # per group, so SREAgentRuleEvaluationsFailing fires even while a remote source is down
    for g in groups:
        group_label = {"rule_group": rule_group_label(g)}
        rows.append((labels_from(_RULE_FAILURES, group_label), float(g.failures), now_ms))
        rows.append((labels_from(_FAILING_RULES, group_label), float(sum(r.health == "err" for r in g.rules)),
                     now_ms))
    # per remote, so SREAgentRemoteWriteBehind and SREAgentRemoteWriteLosingSamples fire from the agent's store
    for q in queues:
        remote, st_rw = {"remote_name": q.name, "url": q.url}, q.stats
        rows += [(labels_from(f"{_RW}pending_samples", remote), float(st_rw.pending), now_ms),
                 (labels_from(f"{_RW}last_send_timestamp_seconds", remote), st_rw.last_send_s, now_ms),
                 (labels_from(f"{_RW}failed_samples_total", remote), float(st_rw.failed), now_ms)]
        rows += [(labels_from(f"{_RW}dropped_samples_total", {**remote, "reason": reason}),
                  float(st_rw.dropped[reason]), now_ms) for reason in ("queue_full", "invalid", "state_error")]
    return rows
