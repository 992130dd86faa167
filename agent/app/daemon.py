"""Wiring: builds store, sources, rules and HTTP server from the :class:`Config` and runs the jobs.

Jobs run on APScheduler's ``AsyncIOScheduler`` (DESIGN.md decision 10): the scrape
cycle every ``scrape.interval``, the NVML poll every ``nvml.interval`` (in a worker
thread, since NVML calls block), each rule group at its own interval, and store
retention every minute. Rule files are loaded and checked before anything starts: a
broken rule file stops start-up with every problem listed, as Prometheus does. Everything the
outside world touches (clock, NVML module, hostname) is passed in so tests can swap
it. ``stop()`` is what SIGTERM triggers: jobs stop, series are left as they are,
the HTTP server and sessions close.
"""

from __future__ import annotations

import asyncio
import functools
import resource
import socket
import time
import types
from collections import deque
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO

import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.triggers.cron import CronTrigger

from agent.act import ActCollector, ActLayer
from agent.act.remote_write import RemoteWrite, RemoteWriteCollector, Sample
from agent.app.connections import AcceptErrorLog, raise_open_file_limit
from agent.app.groupjobs import add_group_jobs, eval_at_ms
from agent.app.ha import Elector, LeaderCollector, ha_status, leadership_for, start_elector
from agent.app.listener import HttpCollector, HttpServer, descriptor_warning, serve, server_status
from agent.app.recording import RecordingPlacement
from agent.app.rulefiles import keep_list, rule_paths, rule_selector
from agent.app.selfseries import self_series
from agent.app.served import ServedLengths
from agent.app.server import build_app, new_guard
from agent.app.telemetry import AgentCollector, CycleStats, FileSDCollector, SourceCollector, build_registry
from agent.app.triage import Reports
from agent.app.triggers import Diagnostics, DiagnosticsCollector
from agent.collect.discovery import FileSD, all_targets, expand_globs, static_targets
from agent.collect.nvml import NvmlSource
from agent.collect.scrape import Scraper
from agent.config import Config
from agent.errors import StateError
from agent.promql import Engine
from agent.promql.history import RemoteHistory
from agent.promql.remote import RemoteSource
from agent.rules.files import load_rule_files, parametrize
from agent.rules.manager import AlertEvent, Group, RuleManager
from agent.series import Observation
from agent.store import RoundWriter, Store

__all__ = ["Agent", "keep_list", "rule_paths"]

log = structlog.get_logger(__name__)

_GC_INTERVAL_S = 60.0
_PRUNE_INTERVAL_S = 3600.0
_LOG_POLL_S = 5.0  # tailed log files (OOM evidence)


class Agent:
    """One agent process: sources -> store, plus the HTTP endpoint."""

    def __init__(
        self,
        config: Config,
        *,
        clock: Callable[[], float] = time.time,
        nvml_module: types.ModuleType | None = None,
        hostname: str | None = None,
        notify_stream: TextIO | None = None,
        time_scale: float = 1.0,
    ) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.config = config
        self._clock = clock
        # the demo runs model time faster than the wall: ``clock`` then reads model time, and every
        # job runs each ``interval / time_scale`` wall seconds so intervals stay true in model time
        self._wall = 1.0 / time_scale
        groups = load_rule_files(expand_globs(config.rules.files))  # RuleError stops start-up
        groups = parametrize(groups, selector=rule_selector(config.rules.selector), by=config.rules.by)
        self.store = Store(int(config.store.retention * 1000), keep_list(config, groups),
                           max_series=config.store.max_series)
        rc = config.rules
        self.engine = Engine(self.store, subquery_step_ms=int(rc.evaluation_interval * 1000))
        self.rules = RuleManager(groups, self.store, self.engine, default_interval_s=rc.evaluation_interval,
                                 external_labels=rc.external_labels, external_url=rc.external_url)
        # Prometheus mode: rule groups query the server, except source.local_groups (the agent's own)
        self.source = RemoteSource(config.source) if config.source.remote else None
        self._local_groups = frozenset(config.source.local_groups)
        self._remote_restored: set[str] = set()
        self._pruned_ms = 0  # the first retention job prunes the state database
        self._evaluating: set[int] = set()  # groups being evaluated now (the first run and the grid's may meet)
        writes_back = any("recording" in r.write for r in config.remote_write)
        self.recording = RecordingPlacement(config.source, self.rules.groups, writes_back=writes_back)
        self.events: deque[AlertEvent] = deque(maxlen=1000)
        # opens the state db and restores alert state; console receivers write to notify_stream (default stdout)
        longest = max((g.interval_s for g in self.rules.groups), default=rc.evaluation_interval)
        self.leadership = leadership_for(config, longest_interval_s=longest, clock=clock)  # HA (docs/ha.md)
        self._elector: Elector | None = None
        self.act = ActLayer(config, self.rules, clock=clock, stream=notify_stream, leadership=self.leadership)
        history = RemoteHistory(config.source) if config.source.remote else None
        self.reports = Reports(self.act.db, lambda: [g.spec for g in self.rules.groups],
                               engine=None if history is not None else Engine(self.store), history=history,
                               clock=clock, min_step_ms=int(config.scrape.interval * 1000))
        self.diagnostics = Diagnostics(config, self.store, self.act.post_finding, clock=clock, history=history,
                                       served=ServedLengths(clock=clock))
        self.act.set_diagnose_hook(self.diagnostics.on_alert)
        # remote_write: what the rules write (and, if asked, what scrapes store) is collected per evaluation
        # and queued in the state database; without remote_write nothing is collected
        # the HA replica label goes on what is remote-written, never on alerts (Prometheus' HA pairs)
        written_labels = {**rc.external_labels, **config.ha.replica_labels()}
        self.remote_write = (RemoteWrite(config.remote_write, self.act.db, external_labels=written_labels,
                                         clock=clock) if config.remote_write else None)
        self._written: dict[str, list[Sample]] = {}
        if self.remote_write is not None and self.remote_write.kinds & set(RuleManager.WRITE_KINDS):
            self.rules.observe_writes(self._note_written)
        sc = config.scrape
        self.scraper = Scraper(
            self.store, timeout_s=sc.timeout, body_limit=sc.body_limit, concurrency=sc.concurrency,
            sample_limit=sc.sample_limit, label_limit=sc.label_limit,
            label_name_length_limit=sc.label_name_length_limit, label_value_length_limit=sc.label_value_length_limit,
            new_series_limit=sc.new_series_limit, clock=clock,
        )
        self.file_sd = FileSD(config.file_sd, time.monotonic) if config.file_sd else None
        self._static_targets = static_targets(config.targets)  # the config is frozen: once is enough
        self.nvml: NvmlSource | None = None
        if config.nvml.mode != "false":
            self.nvml = NvmlSource(nvml=nvml_module, hostname=hostname or config.nvml.hostname or socket.gethostname())
        self._nvml_writer = RoundWriter(self.store)
        self._self_writer = RoundWriter(self.store, keep_filter=False)  # the agent's own health, for our rules
        if self.remote_write is not None and "scraped" in self.remote_write.kinds:  # embedded mode (config checks)
            self.scraper.observer = self._nvml_writer.observer = functools.partial(self._note_written, "scraped")
        self._nvml_started = False
        self._nvml_samples: list[Observation] = []
        self.stats = CycleStats()
        self.http_guard = new_guard(config.server)
        self._accept_log = AcceptErrorLog()
        self.registry = build_registry(
            AgentCollector(self.scraper, self.store, lambda: self._nvml_samples, self.stats, self.rules),
            ActCollector(self.act),
            DiagnosticsCollector(self.diagnostics),
            HttpCollector(self.http_guard, self._accept_log),
            *([SourceCollector(self.source)] if self.source is not None else []),
            *([FileSDCollector(self.file_sd)] if self.file_sd is not None else []),
            *([RemoteWriteCollector(self.remote_write)] if self.remote_write is not None else []),
            *([LeaderCollector(self.leadership)] if self.leadership is not None else []),
        )
        self._scheduler: AsyncIOScheduler | None = None
        self._http: HttpServer | None = None
        self.port: int | None = None

    # -- state for the HTTP layer -------------------------------------------------
    @property
    def ready(self) -> bool:
        return self.stats.scrape_cycles > 0

    @property
    def degraded(self) -> str | None:
        """Why the agent runs but cannot keep its promises (state writes failing), else None."""
        return self.act.state_problem

    def targets_json(self) -> list[dict[str, Any]]:
        return self.scraper.targets_json()

    def alerts_json(self) -> list[dict[str, Any]]:
        return self.rules.alerts_json()

    def rules_json(self) -> list[dict[str, Any]]:
        return self.rules.rules_json()

    async def incidents_json(self, limit: int = 50) -> list[dict[str, Any]]:
        return await self.act.incidents_json(limit)

    async def silences_json(self) -> list[dict[str, Any]]:
        return await self.act.silences_json()

    async def add_silence(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.act.add_silence(body)

    async def expire_silence(self, silence_id: str) -> bool:
        return await self.act.expire_silence(silence_id)

    async def accept_webhook(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.act.accept_webhook(body)

    async def incident_report(self, incident_id: int, fmt: str) -> str:
        return await self.reports.render(incident_id, fmt)

    def webhook_refused(self) -> None:
        self.act.intake_stats.rejected += 1

    async def accept_finding(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.act.accept_finding(body)

    def finding_refused(self) -> None:
        self.act.intake_stats.findings["invalid"] += 1

    def status_json(self) -> dict[str, Any]:
        nv = self.nvml
        return {
            "config": self.config.redacted(),
            "store": self.store.stats(),
            "nvml": {
                "enabled": nv is not None,
                "available": bool(nv and nv.available),
                "reason": nv.reason if nv else "disabled in config (nvml.enabled: false)",
                "gpus": nv.gpus() if nv and nv.available else [],
            },
            "file_sd_errors": self.file_sd.errors() if self.file_sd else {},
            "scrape_cycles": self.stats.scrape_cycles,
            "state": self._state_json(),
            "ha": ha_status(self.config, self.leadership),
            "server": server_status(self.config.server, self.http_guard) | {"warnings": self.server_warnings()},
        }

    def _state_json(self) -> dict[str, Any]:
        h = self.act.health
        return {"path": self.config.state.path, "degraded": self.degraded is not None, "reason": self.degraded or "",
                "write_failures": h.write_failures, "held": h.held}

    def server_warnings(self) -> list[str]:
        """:meth:`ServerConfig.warnings` plus whether the file-descriptor budget fits under ``ulimit -n``."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        # concurrency 0: a connection per target (those of the last cycle, or the static ones before it)
        targets = max(len(self.scraper.targets), len(self._static_targets))
        over = descriptor_warning(self.config.server, self.config.scrape.concurrency, targets, soft)
        return self.config.server.warnings() + ([over] if over else [])

    # -- jobs ------------------------------------------------------------------------
    async def scrape_cycle(self) -> None:
        t0 = time.perf_counter()
        # file_sd files are read and parsed off the loop: a 4 MiB YAML file takes seconds to parse
        targets = await asyncio.to_thread(all_targets, self.config, self.file_sd, static=self._static_targets)
        self.scraper.set_targets(targets)
        await self.scraper.scrape_all()
        self.diagnostics.check_targets((t.spec.instance, t.health) for t in self.scraper.targets.values())
        self._write_self_metrics()
        await self._flush_written(int(self._clock() * 1000))
        self.stats.last_cycle_seconds = time.perf_counter() - t0
        self.stats.scrape_cycles += 1

    def _write_self_metrics(self) -> None:
        """The agent's own series its bundled rules read (``rules/agent.rules.yaml``: state database writes,
        the store's series cap, rule evaluation), also on /metrics, written into its store so
        SREAgentStateWritesFailing, SREAgentStoreSeriesLimitReached and SREAgentRuleEvaluationsFailing
        fire without a Prometheus scraping the agent."""
        now_ms = int(self._clock() * 1000)
        queues = self.remote_write.queues if self.remote_write is not None else []
        self._self_writer.write(self_series(self.store, self.act.health, self.rules.groups, queues, now_ms), now_ms)

    async def poll_nvml(self) -> None:
        nv = self.nvml
        if nv is None:
            return
        if not self._nvml_started:
            self._nvml_started = True
            ok = await asyncio.to_thread(nv.start)
            if not ok and self.config.nvml.mode == "true":  # NvmlSource already warned; say it louder
                log.error("nvml.enabled is true but NVML is unavailable; continuing without GPU metrics",
                          reason=nv.reason)
        now_ms = int(self._clock() * 1000)
        samples = await asyncio.to_thread(nv.poll, now_ms)
        self._nvml_samples = samples
        self._nvml_writer.write(((s.labels, s.value, s.timestamp_ms or now_ms) for s in samples), now_ms)
        await self._flush_written(now_ms)

    async def evaluate(self, group: Group, at_ms: int | None = None) -> None:
        """Evaluate ``group`` at ``at_ms`` (its grid point, from the scheduler), else now."""
        now_ms = at_ms if at_ms is not None else int(self._clock() * 1000)
        if self.source is not None and group.spec.name not in self._local_groups:
            await self.recording.check(self.source)
            events = await self.rules.eval_group_remote(group, now_ms, self.source.instant,
                                                        alerts_only=self.recording.server_runs_them)
            # a new state database: activeAt from the server, once the server has answered this group
            if group.spec.name not in self._remote_restored and self.source.up:
                self._remote_restored.add(group.spec.name)
                tolerance_ms = int(self.config.rules.outage_tolerance * 1000)
                restored = await self.rules.restore_remote(group, now_ms, self.source.instant,
                                                           outage_tolerance_ms=tolerance_ms)
                if restored:
                    log.info("alert state restored from the source's ALERTS_FOR_STATE", group=group.spec.name,
                             alerts=restored)
        else:
            events = self.rules.eval_group(group, now_ms)
        for e in events:  # recorded before acting, so the history never lags the rule state readers see
            self.events.append(e)
            labels = {k: v for k, v in e.alert.labels if k != "alertname"}
            log.info("alert state changed", state=e.kind, alertname=e.rule, group=e.group, labels=labels,
                     value=e.alert.value, summary=e.alert.annotations.get("summary", ""))
        await self.act.observe(group, events, now_ms)
        await self._flush_written(now_ms)

    def _note_written(self, kind: str, samples: list[Sample]) -> None:
        if self.remote_write is not None and kind in self.remote_write.kinds:
            self._written.setdefault(kind, []).extend(samples)

    async def _flush_written(self, now_ms: int) -> None:
        """Queue for remote write what was written since the last flush (persisted on the writer thread)."""
        if self.remote_write is not None and self._written:
            written, self._written = self._written, {}
            await self.remote_write.enqueue(written, now_ms)

    async def evaluate_all(self) -> None:
        for g in self.rules.groups:
            await self.evaluate(g)

    # APScheduler runs plain functions in a thread pool; these coroutine wrappers keep rule
    # evaluation and retention on the event loop, where scrapes write: the store and the
    # engine's caches are single-threaded by design.
    async def _evaluate_job(self, group: Group, aligned: bool = True) -> None:
        """Evaluate at the group's grid point (``agent.rules.timing``); ``aligned`` False (the first run in
        embedded mode, which must not evaluate before the first scrape landed) evaluates at now."""
        now_ms = int(self._clock() * 1000)
        at_ms = eval_at_ms(group, now_ms) if aligned else now_ms
        if at_ms <= group.last_eval_ms or id(group) in self._evaluating:
            log.debug("evaluation skipped: this grid point was evaluated", group=group.spec.name)
            return
        self._evaluating.add(id(group))
        try:
            await self.evaluate(group, at_ms)
        except asyncio.CancelledError:  # shutdown while the writer thread had it: it finishes there
            log.debug("evaluation cancelled by shutdown", group=group.spec.name)
        finally:
            self._evaluating.discard(id(group))

    async def _scrape_job(self) -> None:
        try:
            await self.scrape_cycle()
        except asyncio.CancelledError:  # shutdown while a cycle was in flight: nothing to report
            log.debug("scrape cycle cancelled by shutdown")

    async def _gc_job(self) -> None:
        self.gc()
        now_ms = int(self._clock() * 1000)
        if now_ms - self._pruned_ms >= _PRUNE_INTERVAL_S * 1000:  # the state database's history, hourly
            self._pruned_ms = now_ms
            try:
                await self.act.db.run(self.act.db.prune, now_ms=now_ms, keep_ms=int(self.config.state.keep * 1000))
            except StateError as exc:
                log.warning("state database not pruned; trying again in an hour", error=str(exc))

    async def _dispatch_job(self) -> None:
        try:
            await self.act.tick()
        except asyncio.CancelledError:  # shutdown mid-round: the outbox keeps what was not sent
            log.debug("dispatch round cancelled by shutdown")

    async def _logs_job(self) -> None:
        await self.diagnostics.poll_logs_async()  # file reads and matching in a worker thread

    async def _nccl_job(self) -> None:
        self.diagnostics.request_nccl(reason="schedule")

    def gc(self) -> None:
        dropped = self.store.gc(int(self._clock() * 1000))
        if dropped:
            log.debug("retention applied", samples_dropped=dropped)

    async def collect_once(self) -> None:
        """One scrape cycle, one NVML poll, then one evaluation of every rule (``run --once``)."""
        await asyncio.gather(self.scrape_cycle(), self.poll_nvml())
        await self.evaluate_all()

    # -- lifecycle -------------------------------------------------------------------
    async def start(self, *, serve_http: bool = True) -> None:
        cfg = self.config
        before, after = raise_open_file_limit()
        if after != before:
            log.info("open-file limit raised to the hard limit", soft_before=before, soft=after)
        if serve_http:
            app = build_app(self, cfg.server, self.http_guard)
            self._http = await serve(app, cfg.server, self._accept_log)
            self.port = self._http.port
            log.info("serving", listen=f"{cfg.server.host}:{self.port}", tls=cfg.server.tls is not None,
                     auth="bearer" if cfg.server.auth.bearer_token is not None else "none",
                     max_connections=cfg.server.max_connections)
            for warning in self.server_warnings():
                log.warning("check the HTTP endpoint settings", problem=warning)
        if not cfg.server.external_url and any(r.kind == "slack" for r in cfg.receivers):
            log.info("server.external_url is not set: Slack messages will not link the incident's triage report")
        if cfg.scrape.shards is not None:
            log.info("scraping one shard of the targets (Prometheus hashmod of __address__)",
                     shard=cfg.scrape.shards.index, shards=cfg.scrape.shards.total)
        sched, w = AsyncIOScheduler(), self._wall
        first = datetime.now(UTC)  # run immediately, then every interval
        sched.add_job(self._scrape_job, "interval", seconds=cfg.scrape.interval * w, id="scrape",
                      max_instances=1, coalesce=True, next_run_time=first)
        if self.nvml is not None:
            sched.add_job(self.poll_nvml, "interval", seconds=cfg.nvml.interval * w, id="nvml",
                          max_instances=1, coalesce=True, next_run_time=first)
        first_eval = first + timedelta(seconds=cfg.scrape.interval * w)  # once the first scrapes have landed
        first_model_ms = int((self._clock() + cfg.scrape.interval) * 1000)  # the same moment on the clock
        add_group_jobs(sched, self.rules.groups, self._evaluate_job, first_eval=first_eval,  # agent.app.groupjobs
                       first_model_ms=first_model_ms, wall=w, remote=self.source is not None)
        sched.add_job(self._gc_job, "interval", seconds=_GC_INTERVAL_S * w, id="retention", coalesce=True)
        await self.act.start()
        if self.leadership is not None:
            self._elector = start_elector(cfg, self.leadership)
        if self.remote_write is not None:
            self.remote_write.start()
        sched.add_job(self._dispatch_job, "interval", seconds=cfg.notify.dispatch_interval * w, id="dispatch",
                      max_instances=1, coalesce=True, next_run_time=first)
        diag = cfg.diagnostics
        if diag.oom.enabled and diag.oom.log_files:
            sched.add_job(self._logs_job, "interval", seconds=_LOG_POLL_S, id="oom-logs", max_instances=1,
                          coalesce=True, next_run_time=first)
        if diag.nccl.enabled and diag.nccl.schedule:
            sched.add_job(self._nccl_job, CronTrigger.from_crontab(diag.nccl.schedule), id="nccl",
                          max_instances=1, coalesce=True)
        sched.start()
        self._scheduler = sched
        log.info("agent started", targets=len(cfg.targets), file_sd=len(cfg.file_sd),
                 scrape_interval=cfg.scrape.interval, nvml=cfg.nvml.mode,
                 rule_groups=len(self.rules.groups), rules=sum(len(g.rules) for g in self.rules.groups))

    async def stop(self) -> None:
        if self._elector is not None:
            self._elector.stop()
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=False)
            self._scheduler = None
        await self.scraper.close()
        if self.source is not None:
            await self.source.close()
        await self.diagnostics.stop()
        self.reports.pool.close()  # reports' own threads (agent.app.workpool); their queries end by their deadlines
        if self.remote_write is not None:
            await self.remote_write.stop()
        await self.act.stop()
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self.nvml is not None:
            await asyncio.to_thread(self.nvml.shutdown)
        log.info("agent stopped")

    async def run_until(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()
