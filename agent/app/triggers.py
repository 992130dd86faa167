"""The daemon's diagnostic triggers: when to run the OOM diagnosis and the nccl-tests check.

The diagnoses themselves live in ``agent/diagnose/``; this module decides when they
run inside the agent and where their findings go (the alert's receivers, in the Slack
thread of its message, and the incident log):

* **a tailed log file shows OOM evidence** (``diagnostics.oom.log_files``): the new
  lines, after the engine's start-up lines seen earlier in that file (the API server's
  arguments, the engine's config line, the memory profile: they hold the
  ``--gpu-memory-utilization``, model and parallelism the advice depends on), go through
  :func:`~agent.diagnose.oom.verdict.diagnose_oom` (the files and their start-up lines are
  :class:`~agent.app.logwatch.LogWatch`'s, read in a worker thread);
* **a target goes down after its GPU memory was near full**: the last 5 minutes of
  ``DCGM_FI_DEV_FB_USED`` / ``FB_FREE`` on the target's host peaked above
  ``diagnostics.oom.gpu_memory_near_full`` — the runtime OOM signature, even with no
  log line to read;
* **an alert routed to a ``diagnose`` action fires** (one the agent's rules raised, or one an
  Alertmanager posted to its webhook, :mod:`agent.act.intake`): GPU memory alerts
  (:data:`~agent.config.GPU_MEMORY_ALERTS`: ``GPUMemoryNearFull`` and OOM-looking names) get the memory
  picture of the GPU the alert names (its ``Hostname`` and ``UUID``/``gpu`` labels) and
  the runtime-OOM advice; the KV-saturation and scale-out alerts
  (:data:`~agent.diagnose.plan.fleet.CAPACITY_ALERTS`) get each named replica's live capacity
  advice (:func:`~agent.diagnose.plan.fleet.capacity_advice`: its ``vllm:cache_config_info``, the
  last 15 minutes of KV usage, running, waiting and preemptions, and the ``max_model_len`` its
  ``/v1/models`` serves, :mod:`agent.app.served`); the alerts in ``diagnostics.nccl.on_alerts``
  (throughput far below expectation) start an nccl-tests run, at most once per ``diagnostics.nccl.cooldown``;
* **the nccl schedule** (a cron expression) runs nccl-tests regularly; the last
  result is exported on ``/metrics``.

The same finding is not posted twice within 10 minutes, so a log that repeats an OOM
line, or a target that flaps, does not flood a channel.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from dataclasses import replace
from typing import Any

import structlog
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.act.notification import AlertSnapshot
from agent.app.logwatch import LogWatch
from agent.app.served import ServedLengths, served_lengths, with_served_length
from agent.config import GPU_MEMORY_ALERTS, Config
from agent.diagnose.findings import Finding, runbook_url
from agent.diagnose.logtail import LogTailer
from agent.diagnose.nccl import judge
from agent.diagnose.nccl.interconnects import check_configured
from agent.diagnose.nccl.run import command_from_config, run_nccl
from agent.diagnose.oom.context import HISTORY_MS
from agent.diagnose.oom.verdict import (
    DEFAULT_UTILIZATION,
    OomContext,
    context_from_store,
    diagnose_oom,
    headroom_utilization,
)
from agent.diagnose.plan.fleet import CAPACITY_ALERTS, WINDOW_MS, capacity_advice, replicas_from_store
from agent.errors import DiagnosisError, SourceError
from agent.promql.history import RemoteHistory
from agent.store import Store

__all__ = ["Diagnostics", "DiagnosticsCollector"]

log = structlog.get_logger(__name__)

Post = Callable[[Finding, AlertSnapshot | None], None]
_DEDUP_MS = 10 * 60_000
_DOWN_LOOKBACK_MS = 5 * 60_000
_GPU_MEMORY_ALERTS = re.compile(GPU_MEMORY_ALERTS)  # the default diagnose action's names, fullmatch


def _match(alert: AlertSnapshot) -> dict[str, str]:
    return {k: v for k in ("instance", "job", "model_name") if (v := alert.labels.get(k))}


class Diagnostics:
    """The daemon's diagnostic triggers (see the module docstring). Findings go to ``post``
    (the act layer's :meth:`~agent.act.ActLayer.post_finding`); ``clock`` and the nccl-tests
    ``runner`` (:func:`~agent.diagnose.nccl.run.run_nccl`'s signature) are injectable."""

    def __init__(self, config: Config, store: Store, post: Post, *, clock: Callable[[], float] = time.time,
                 runner: Callable[..., Any] = run_nccl, history: RemoteHistory | None = None,
                 served: ServedLengths | None = None) -> None:
        check_configured(config.diagnostics.nccl.interconnect)
        self._cfg = config.diagnostics
        self._store = store
        self._history = history  # Prometheus mode: the fleet's series are in the server, not in the store
        self._history_tasks: set[asyncio.Task[None]] = set()
        self._served = served  # asks replicas their max_model_len (/v1/models) for the capacity advice
        self._post = post
        self._clock = clock
        self._runner = runner
        oom = self._cfg.oom
        self._logs = LogWatch(oom.log_files) if oom.enabled and oom.log_files else None
        self._health: dict[str, str] = {}
        self._posted: dict[tuple[str, str, str, str], int] = {}
        self.findings_total: dict[str, int] = {}
        self.nccl_last: tuple[judge.NcclResult, str, int] | None = None
        self._nccl_last_start_ms: int | None = None
        self._nccl_task: asyncio.Task[tuple[str, list[Finding]]] | None = None

    # -- posting -----------------------------------------------------------------------------
    def _emit(self, finding: Finding, alert: AlertSnapshot | None, now_ms: int) -> bool:
        where = alert.fingerprint if alert is not None else ""
        about = ",".join(f"{k}={v}" for k, v in sorted(finding.labels.items()))  # e.g. which log file
        key = (finding.kind, where, about, "\n".join(finding.evidence)[:2000])
        if now_ms - self._posted.get(key, -_DEDUP_MS - 1) <= _DEDUP_MS:
            return False
        self._posted = {k: t for k, t in self._posted.items() if now_ms - t <= _DEDUP_MS}
        self._posted[key] = now_ms
        self.findings_total[finding.kind] = self.findings_total.get(finding.kind, 0) + 1
        log.warning("diagnosis finding", kind=finding.kind, summary=finding.summary, setting=finding.setting,
                    suggested_value=finding.suggested_value, runbook=finding.runbook_url,
                    alertname=alert.labels.get("alertname", "") if alert is not None else "")
        self._post(finding, alert)
        return True

    # -- OOM from tailed logs --------------------------------------------------------------------
    def poll_logs(self) -> list[Finding]:
        """Read what the tailed logs gained; diagnose it if it holds OOM evidence (here, blocking:
        the daemon awaits :meth:`poll_logs_async`)."""
        if self._logs is None:
            return []
        now_ms = int(self._clock() * 1000)
        found = self._diagnose_logs(self._logs.scan(), self._local_context(now_ms))
        return self._post_log_findings(found, now_ms)

    @property
    def tailer(self) -> LogTailer | None:
        """The tailer of ``diagnostics.oom.log_files`` (None when there are none)."""
        return self._logs.tailer if self._logs is not None else None

    async def poll_logs_async(self) -> list[Finding]:
        """:meth:`poll_logs` for the event loop: reading the files and matching the lines (a long
        backlog, megabytes of request log) run in a worker thread; the store is read and the findings
        are posted on the loop."""
        if self._logs is None:
            return []
        now_ms = int(self._clock() * 1000)
        evidence = await asyncio.to_thread(self._logs.scan)
        if not evidence:  # the usual poll: stats lines, nothing to diagnose
            return []
        found = await asyncio.to_thread(self._diagnose_logs, evidence, self._local_context(now_ms))
        return self._post_log_findings(found, now_ms)

    def _diagnose_logs(self, evidence: dict[str, list[str]], context: OomContext) -> list[Finding]:
        """Blocking: the findings of each file's evidence, labelled with the file."""
        return [replace(found, labels={**found.labels, "log_file": path}) for path, lines in evidence.items()
                for found in diagnose_oom(lines, context=context, runbook_base=self._cfg.runbook_base_url)]

    def _post_log_findings(self, found: list[Finding], now_ms: int) -> list[Finding]:
        return [f for f in found if self._emit(f, None, now_ms)]

    def _local_context(self, now_ms: int) -> OomContext:
        """GPU memory history of the agent's own host (its NVML poller), no engine config."""
        return context_from_store(self._store, "", now_ms)

    # -- a target went down after GPU memory was near full -------------------------------------------
    def check_targets(self, targets: Iterable[tuple[str, str]]) -> list[Finding]:
        """``(instance, health)`` after a scrape cycle; an up → down change is examined."""
        now_ms = int(self._clock() * 1000)
        out = []
        for instance, health in targets:
            before, self._health[instance] = self._health.get(instance), health
            if before != "up" or health != "down":
                continue
            ctx = context_from_store(self._store, instance, now_ms)
            recent = [(t, u, total) for t, u, total in ctx.gpu_memory_history if now_ms - t <= _DOWN_LOOKBACK_MS]
            if not recent:
                continue
            t_peak, used, total = max(recent, key=lambda r: r[1] / r[2])
            if used / total < self._cfg.oom.gpu_memory_near_full:
                continue
            f = self._runtime_finding(instance, ctx, used, total, t_peak, went_down=True)
            if self._emit(f, None, now_ms):
                out.append(f)
        return out

    def _runtime_finding(self, instance: str, ctx: OomContext, used: int, total: int, t_ms: int, *,
                         went_down: bool) -> Finding:
        # The advice diagnose_oom gives a runtime OOM whose request size is unknown: give oom.STEP of
        # the GPU back to activations. (The planner's --max-num-seqs, what fits the KV cache at
        # full length, answers KV-cache pressure; vLLM preallocates the KV cache, so it is not
        # what runs out here.)
        util = ctx.gpu_memory_utilization or DEFAULT_UTILIZATION
        setting, value = "--gpu-memory-utilization", headroom_utilization(util)
        where = instance or "this host"
        if went_down:
            summary = (f"{where} went down after GPU memory reached {used / total:.0%}: a runtime CUDA OOM is the "
                       "likely cause; leave more headroom for activations.")
        else:
            summary = (f"GPU memory on {where} reached {used / total:.0%}: the next activation spike ends in a "
                       "runtime CUDA OOM; leave more headroom for activations.")
        evidence = [f"{instance or 'this host'}: GPU memory peaked at {used / total:.1%} "
                    f"({used / 2**30:.1f} of {total / 2**30:.1f} GiB) at "
                    f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(t_ms / 1000))}Z"]
        if went_down:
            evidence.append(f"{instance}: scrape failed right after (target down)")
        return Finding(
            kind="gpu-oom-runtime", severity="critical" if went_down else "warning", summary=summary,
            evidence=evidence, setting=setting, suggested_value=value,
            details={"gpu_memory_used_bytes": used, "gpu_memory_total_bytes": total,
                     "gpu_memory_utilization": util,
                     "gpu_memory_utilization_assumed": ctx.gpu_memory_utilization is None, "model": ctx.model},
            runbook_url=runbook_url("diagnosis-gpu-oom-runtime", self._cfg.runbook_base_url),
            labels={"instance": instance} if instance else {},
        )

    # -- alert-triggered (the "diagnose" action) -------------------------------------------------------
    def on_alert(self, alert: AlertSnapshot) -> None:
        """The ``diagnose`` action: called once when a routed alert starts firing."""
        name = alert.labels.get("alertname", "")
        now_ms = int(self._clock() * 1000)
        if name in self._cfg.nccl.on_alerts:
            self.request_nccl(reason=f"{name} fired", alert=alert)
        elif name in CAPACITY_ALERTS:
            if self._history is not None or self._served is not None:
                self._spawn(self._capacity_remote(alert, now_ms))
                return
            self._capacity_findings(alert, self._store, now_ms, {})  # nobody to ask for max_model_len
        elif _GPU_MEMORY_ALERTS.fullmatch(name):
            # The alert is about one GPU: dcgm-exporter (and the agent's NVML poller) name its node in
            # Hostname and the GPU in UUID/gpu; `instance` is the exporter's address, not the node.
            lab = alert.labels
            host = lab.get("Hostname") or lab.get("hostname") or lab.get("instance", "")
            gpu = lab.get("UUID") or lab.get("gpu") or None
            if self._history is not None:
                self._spawn(self._gpu_memory_remote(alert, host, gpu, now_ms))
                return
            self._gpu_memory_finding(alert, context_from_store(self._store, host, now_ms, gpu=gpu), host, now_ms)
        else:
            log.debug("no diagnosis for this alert", alertname=name)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._history_tasks.add(task)
        task.add_done_callback(self._history_tasks.discard)

    def _capacity_findings(self, alert: AlertSnapshot, store: Store, now_ms: int,
                           lengths: Mapping[str, tuple[int, str]]) -> None:
        """One capacity finding per replica the alert names (its ``instance``, or every replica of its
        ``job``/``model_name`` for the scale-out alert), with its served ``max_model_len`` where known."""
        replicas = [with_served_length(r, lengths) for r in replicas_from_store(store, now_ms, match=_match(alert))]
        if not replicas:
            log.info("no vllm:cache_config_info for the alert's replicas; no capacity advice",
                     alertname=alert.labels.get("alertname", ""), **_match(alert))
        for r in replicas:
            self._emit(capacity_advice(r, runbook_base=self._cfg.runbook_base_url), alert, now_ms)

    async def _capacity_remote(self, alert: AlertSnapshot, now_ms: int) -> None:
        """Cache config and usage (from the server in Prometheus mode), the served max_model_len, the findings."""
        if (store := self._store if self._history is None else await self._remote_store(alert, now_ms)) is not None:
            replicas = replicas_from_store(store, now_ms, match=_match(alert))
            lengths = await served_lengths(self._served, replicas) if self._served is not None else {}
            self._capacity_findings(alert, store, now_ms, lengths)

    async def _remote_store(self, alert: AlertSnapshot, now_ms: int) -> Store | None:
        assert self._history is not None
        names = ("cache_config_info|kv_cache_usage_perc|gpu_cache_usage_perc|num_requests_running|"
                 "num_requests_waiting|num_preemptions_total")
        where = "".join(f",{k}={json.dumps(v)}" for k in ("instance", "job") if (v := alert.labels.get(k)))
        selector = f'{{__name__=~"vllm:({names})"{where}}}'
        try:
            return await asyncio.to_thread(self._history.fetch, [selector], now_ms - WINDOW_MS, now_ms)
        except SourceError as exc:
            log.warning("no replica history from the source; capacity advice skipped", error=str(exc))
            return None

    def _gpu_memory_finding(self, alert: AlertSnapshot, ctx: OomContext, host: str, now_ms: int) -> None:
        if ctx.gpu_memory_history:
            t_ms, used, total = max(ctx.gpu_memory_history, key=lambda r: r[1] / r[2])
            self._emit(self._runtime_finding(host, ctx, used, total, t_ms, went_down=False), alert, now_ms)

    async def _gpu_memory_remote(self, alert: AlertSnapshot, host: str, gpu: str | None, now_ms: int) -> None:
        """The GPU's memory history from the server (a range query in a worker thread), then the same
        finding as from the embedded store."""
        assert self._history is not None
        selectors = [f"{name}{{{label}={json.dumps(host)}}}" for name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
                     for label in ("Hostname", "hostname")]
        try:
            store = await asyncio.to_thread(self._history.fetch, selectors, now_ms - HISTORY_MS, now_ms)
        except SourceError as exc:
            log.warning("no GPU memory history from the source; diagnosis skipped", host=host, error=str(exc))
            return
        self._gpu_memory_finding(alert, context_from_store(store, host, now_ms, gpu=gpu), host, now_ms)

    # -- nccl-tests -------------------------------------------------------------------------------------
    def request_nccl(self, *, reason: str, alert: AlertSnapshot | None = None) -> bool:
        """Start an nccl-tests run unless disabled, one is running, or the cooldown holds."""
        cfg = self._cfg.nccl
        now_ms = int(self._clock() * 1000)
        if not cfg.enabled:
            log.info("nccl-tests check not run: diagnostics.nccl.enabled is false", reason=reason)
            return False
        if self._nccl_task is not None and not self._nccl_task.done():
            return False
        last = self._nccl_last_start_ms
        if alert is not None and last is not None and now_ms - last < cfg.cooldown * 1000:
            log.info("nccl-tests check not run: cooldown", reason=reason, cooldown_s=cfg.cooldown)
            return False
        self._nccl_last_start_ms = now_ms
        self._nccl_task = asyncio.get_running_loop().create_task(self.run_nccl_now(reason=reason, alert=alert))
        return True

    async def run_nccl_now(self, *, reason: str, alert: AlertSnapshot | None = None) -> tuple[str, list[Finding]]:
        cfg = self._cfg.nccl
        cmd = command_from_config(cfg)
        log.info("nccl-tests check started", reason=reason, command=cmd)
        try:
            rc, text = await self._runner(cmd, timeout_s=cfg.timeout)
        except DiagnosisError as exc:
            text, rc = f"[sre-agent] could not start nccl-tests: {exc}", 127
        result = judge.parse_nccl(text, exit_code=rc, command=cmd)
        # diagnostics.nccl.interconnect was checked against the table when the config loaded
        verdict, findings = judge.check(result, expected_gbps=cfg.expected_gbps,
                                       interconnect=cfg.interconnect or None, runbook_base=self._cfg.runbook_base_url)
        now_ms = int(self._clock() * 1000)
        self.nccl_last = (result, verdict, now_ms)
        log.info("nccl-tests check done", verdict=verdict, peak_busbw_gbps=result.peak_busbw_gbps,
                 exit_code=rc)
        for f in findings:
            if not f.ok or alert is not None:  # an alert's thread also hears "bandwidth is fine"
                self._emit(f, alert, now_ms)
        return verdict, findings

    async def stop(self) -> None:
        if self._nccl_task is not None and not self._nccl_task.done():
            self._nccl_task.cancel()
        for task in list(self._history_tasks):
            task.cancel()
        if self._logs is not None:
            await asyncio.to_thread(self._logs.close)  # after a scan in flight, not under it


class DiagnosticsCollector(Collector):
    """Findings by kind, tailed log lines cut to the line bound, and the last nccl-tests result,
    on the agent's /metrics."""

    def __init__(self, diagnostics: Diagnostics) -> None:
        self._d = diagnostics

    def collect(self) -> Iterator[Metric]:
        found = CounterMetricFamily("sre_agent_findings", "Diagnosis findings posted, by kind.", labels=["kind"])
        for kind, n in sorted(self._d.findings_total.items()):
            found.add_metric([kind], n)
        yield found
        if (tailer := self._d.tailer) is not None:
            yield CounterMetricFamily("sre_agent_oom_log_lines_cut", "Tailed log lines longer than the line bound, "
                                      "read only to it for OOM evidence.", value=tailer.lines_cut)
        if self._d.nccl_last is None:
            return
        result, verdict, at_ms = self._d.nccl_last
        families: dict[str, GaugeMetricFamily] = {}
        for name, labels, value in judge.nccl_samples(result, verdict, at_ms, {}):
            fam = families.get(name)
            if fam is None:
                fam = families[name] = GaugeMetricFamily(name, f"{name} (last nccl-tests run).",
                                                         labels=sorted(labels))
            fam.add_metric([labels[k] for k in sorted(labels)], value)
        yield from families.values()
