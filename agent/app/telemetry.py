"""The agent's own ``/metrics``: it watches itself the way it watches the fleet.

One :class:`prometheus_client.CollectorRegistry` per agent (never the global one),
filled at scrape time by a collector that reads live state: per-target health and
scrape cost, store size, and the latest NVML readings re-exported under their
dcgm-exporter names, so a Prometheus can scrape the agent in place of a
dcgm-exporter.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent import __version__
from agent.collect.discovery import FileSD
from agent.collect.scrape import Scraper
from agent.promql.remote import RemoteSource
from agent.rules.manager import AlertState, RuleManager, rule_group_label
from agent.series import Observation, labels_get
from agent.store import AppendResult, Store

__all__ = ["AgentCollector", "CycleStats", "FileSDCollector", "SourceCollector", "build_registry"]


@dataclass
class CycleStats:
    """What the daemon reports about its own jobs: scrape cycles run, and how long the last one took."""

    scrape_cycles: int = 0
    last_cycle_seconds: float = 0.0


class AgentCollector(Collector):
    def __init__(
        self,
        scraper: Scraper,
        store: Store,
        nvml_samples: Callable[[], Sequence[Observation]],
        stats: CycleStats,
        rules: RuleManager | None = None,
    ) -> None:
        self._rules = rules
        self._scraper = scraper
        self._store = store
        self._nvml = nvml_samples
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("sre_agent_build_info", "sre-agent version.", labels=["version"])
        info.add_metric([__version__], 1)
        yield info
        yield from self._targets()
        yield from self._store_metrics()
        cycles = CounterMetricFamily("sre_agent_scrape_cycles", "Scrape cycles run.")
        cycles.add_metric([], self._stats.scrape_cycles)
        yield cycles
        last = GaugeMetricFamily(
            "sre_agent_scrape_cycle_duration_seconds", "Wall time of the last scrape cycle (all targets)."
        )
        last.add_metric([], self._stats.last_cycle_seconds)
        yield last
        if self._rules is not None:
            yield from self._rule_metrics(self._rules)
        yield from _as_families(self._nvml())

    def _rule_metrics(self, rules: RuleManager) -> Iterator[Metric]:
        dur = GaugeMetricFamily("sre_agent_rule_group_last_duration_seconds",
                                "Wall time of the group's last evaluation.", labels=["rule_group"])
        failing = GaugeMetricFamily("sre_agent_rule_group_failing_rules",
                                    "Rules whose last evaluation failed.", labels=["rule_group"])
        failures = CounterMetricFamily("sre_agent_rule_evaluation_failures",
                                       "Rule evaluations that failed (a query error, or a remote source that did "
                                       "not answer); the rule's alerts stay as they were.", labels=["rule_group"])
        for g in rules.groups:
            key = [rule_group_label(g)]
            dur.add_metric(key, g.eval_seconds)
            failing.add_metric(key, sum(r.health == "err" for r in g.rules))
            failures.add_metric(key, g.failures)
        yield from (dur, failing, failures, _alerts(rules))

    def _targets(self) -> Iterator[Metric]:
        lbl = ["job", "instance"]
        up = GaugeMetricFamily("sre_agent_target_up", "1 if the last scrape of the target succeeded.", labels=lbl)
        dur = GaugeMetricFamily("sre_agent_target_scrape_duration_seconds", "Last scrape duration.", labels=lbl)
        samples = GaugeMetricFamily("sre_agent_target_scrape_samples", "Samples in the last payload.", labels=lbl)
        stored = GaugeMetricFamily(
            "sre_agent_target_stored_samples", "Samples the last scrape kept (keep-list).", labels=lbl
        )
        body = GaugeMetricFamily("sre_agent_target_body_bytes", "Size of the last payload.", labels=lbl)
        scrapes = CounterMetricFamily("sre_agent_target_scrapes", "Scrapes attempted.", labels=lbl)
        fails = CounterMetricFamily("sre_agent_target_scrape_failures", "Scrapes that failed.", labels=lbl)
        oob = GaugeMetricFamily("sre_agent_target_out_of_bounds_samples",
                                "Samples of the last scrape dropped for a timestamp out of bounds.", labels=lbl)
        for t in self._scraper.targets.values():
            key = [t.spec.job, t.spec.instance]
            up.add_metric(key, 1.0 if t.health == "up" else 0.0)
            dur.add_metric(key, t.duration_s)
            samples.add_metric(key, t.samples)
            stored.add_metric(key, t.stored)
            body.add_metric(key, t.body_bytes)
            scrapes.add_metric(key, t.scrapes)
            fails.add_metric(key, t.failures)
            oob.add_metric(key, t.out_of_bounds)
        yield from (up, dur, samples, stored, body, scrapes, fails, oob)

    def _store_metrics(self) -> Iterator[Metric]:
        st = self._store.stats()
        for key, doc in (("series", "Series in memory."), ("samples", "Samples in memory."),
                         ("bytes", "Bytes of sample data in memory (16 per sample).")):
            g = GaugeMetricFamily(f"sre_agent_store_{key}", doc)
            g.add_metric([], st[key])
            yield g
        rej = CounterMetricFamily(
            "sre_agent_store_rejected_samples", "Samples rejected (out of order, duplicate timestamp).",
            labels=["reason"],
        )
        for reason in (AppendResult.OUT_OF_ORDER, AppendResult.DUPLICATE):
            rej.add_metric([reason.value], self._store.rejected[reason])
        yield rej
        cap = GaugeMetricFamily("sre_agent_store_max_series",
                                "store.max_series: series scraped targets may create (0 = unlimited).")
        cap.add_metric([], self._store.max_series)
        yield cap
        refused = CounterMetricFamily(
            "sre_agent_store_refused_series",
            "New scraped series refused because the store held store.max_series series.",
        )
        refused.add_metric([], self._store.refused_series)
        yield refused


def _alerts(rules: RuleManager) -> GaugeMetricFamily:
    """Active alerts by state and ``severity`` label. Every severity a loaded alerting rule sets
    is exported in both states (0 when none), so a dashboard shows zeros, not gaps; an alert
    without the label counts under ``severity=""``."""
    fam = GaugeMetricFamily("sre_agent_alerts", "Active alerts by state and severity.", labels=["state", "severity"])
    counts: Counter[tuple[str, str]] = Counter(
        (a.state.value, labels_get(a.labels, "severity")) for a in rules.alerts())
    severities = {r.spec.labels.get("severity", "") for g in rules.groups for r in g.rules if r.spec.kind == "alert"}
    severities |= {sev for _, sev in counts}
    for state in (AlertState.PENDING, AlertState.FIRING):
        for sev in sorted(severities):
            fam.add_metric([state.value, sev], counts[(state.value, sev)])
    return fam


def _as_families(samples: Sequence[Observation]) -> Iterator[Metric]:
    """Re-export source samples as-is (names ending in ``_total`` become counters)."""
    fams: dict[str, Metric] = {}
    for s in samples:
        name = s.name
        fam_name, mtype = (name[:-6], "counter") if name.endswith("_total") else (name, "gauge")
        fam = fams.get(fam_name)
        if fam is None:
            fam = fams[fam_name] = Metric(fam_name, f"{fam_name} (from NVML).", mtype)
        fam.add_sample(name, {k: v for k, v in s.labels if k != "__name__"}, s.value)
    yield from fams.values()


def build_registry(*collectors: Collector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)
    return registry


class SourceCollector(Collector):
    """The remote rule source (Prometheus mode): whether it answers, and why not."""

    def __init__(self, source: RemoteSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("sre_agent_source_up", "1 if the last query to the rule source got a usable answer.",
                               labels=["url"])
        up.add_metric([self._source.config.url or ""], 1.0 if self._source.up else 0.0)
        failed = CounterMetricFamily("sre_agent_source_query_failures",
                                     "Queries to the rule source that failed, by reason.", labels=["reason"])
        for reason, n in sorted(self._source.failures.items()):
            failed.add_metric([reason], n)
        partial = CounterMetricFamily("sre_agent_source_partial_answers",
                                      "Partial answers (warnings or isPartial) used under partial_response: warn.")
        partial.add_metric([], self._source.partial_answers)
        yield from (up, failed, partial)


class FileSDCollector(Collector):
    """file_sd files the agent refused: a refused file keeps its last targets (their ``up`` stays as it was),
    so these are what says a file stopped being read. Prometheus' own is ``prometheus_sd_file_read_errors_total``."""

    def __init__(self, file_sd: FileSD) -> None:
        self._file_sd = file_sd

    def collect(self) -> Iterator[Metric]:
        errors = CounterMetricFamily("sre_agent_file_sd_read_errors",
                                     "file_sd reads refused (unreadable, malformed or over a limit); the file keeps "
                                     "its last targets.")
        errors.add_metric([], self._file_sd.read_errors)
        failing = GaugeMetricFamily("sre_agent_file_sd_failing_files",
                                    "file_sd files whose last read was refused (see /api/v1/status file_sd_errors).")
        failing.add_metric([], self._file_sd.failing_files)
        yield from (errors, failing)
