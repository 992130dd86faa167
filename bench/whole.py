"""The whole agent against its peers: the real ``sre-agent run`` process, Prometheus 2.42 and the
VictoriaMetrics stack, one after the other, doing the same job on the same simulated fleet.

Each ``measure_*`` starts its process(es), lets them warm up (start-up, series creation, the first
rule evaluations out of the window), then reads CPU seconds from ``/proc/<pid>/stat`` at the start and
the end of a window of the same length for all, and their own ``/metrics`` once per scrape interval
in between (every 15 s, as a Prometheus scraping them would): for the agent ``sre_agent_scrape_cycles``,
``sre_agent_scrape_cycle_duration_seconds`` and ``sre_agent_rule_group_last_duration_seconds``, for
Prometheus ``prometheus_rule_group_last_duration_seconds`` and its missed rule-group iterations.

A tick is on time when the scrape cycle that started it finished within the interval and the next one
started: late = cycles sampled with a duration over the interval; missed = the ticks the window should
hold (window / interval, less one for the edges) that never ran (APScheduler skips a tick while the
previous cycle still runs).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from fleet import proc_cpu_s as cpu_s  # type: ignore[import-not-found]
from fleet import rss_mib  # type: ignore[import-not-found]
from procs import (  # type: ignore[import-not-found]
    get,
    metric_values,
    rule_copies,
    running_agent,
    running_prometheus,
    running_vm_stack,
)


@dataclass
class Window:
    """What one process (or stack) did over the measured window."""

    cpu_s: float = math.nan  # CPU seconds over the window, all processes together
    intervals: float = math.nan  # window length in scrape intervals
    rss_mib: float = math.nan  # at the end of the window, all processes together
    eval_s: float = math.nan  # mean wall time of one evaluation of the whole rule set
    cycles: float = math.nan  # scrape cycles run in the window
    expected: float = math.nan  # scrape cycles the window should hold
    late: float = math.nan  # sampled cycles that took longer than the interval
    max_cycle_s: float = math.nan
    missed_evals: float = math.nan  # rule-group iterations missed (Prometheus' own counter)
    up: float = math.nan  # targets whose last scrape succeeded, at the window's end
    # (alertname, instance) of the agent's active alerts (pending or firing): in every poll of the window, in any
    always: set[tuple[str, str]] = field(default_factory=set)
    ever: set[tuple[str, str]] = field(default_factory=set)

    @property
    def cpu_per_interval_s(self) -> float:
        return self.cpu_s / self.intervals

    @property
    def missed(self) -> float:
        return max(0.0, self.expected - self.cycles)


@dataclass(frozen=True)
class Job:
    """What every contender does: scrape ``urls`` every ``interval`` (``timeout`` each) and evaluate the bundled
    rules every ``group_interval`` (None: the groups' own 15 s); measured for ``window_s`` after ``warmup_s``."""

    urls: list[str]
    interval: float
    timeout: float
    group_interval: float | None
    warmup_s: float
    window_s: float


def _sum(text: str, name: str) -> float:
    return sum(v for _, v in metric_values(text, name))


#: Seconds between reads of a contender's own endpoints in the window: a Prometheus' default scrape interval.
#: The agent's /metrics has a series per target per family, about 60 ms of its CPU per read at 200 targets:
#: read every 5 s at 1,000 targets it would add about 6 % of a core that no deployment pays.
POLL_S = 15.0


def _watch(pids: list[int], urls: list[str], job: Job) -> tuple[float, float, float, list[list[str]]]:
    """Warm up, then GET ``urls`` every ``POLL_S`` (at least once per interval) for ``window_s``. Returns
    (CPU seconds over the window, RSS MiB at its end, window seconds, the bodies of every poll)."""
    interval, window_s = max(job.interval, POLL_S), job.window_s
    time.sleep(job.warmup_s)
    c0, t0 = sum(cpu_s(p) for p in pids), time.monotonic()
    polls = [[get(u) for u in urls]]
    end = t0 + window_s
    while (now := time.monotonic()) < end:
        time.sleep(min(interval, end - now))
        polls.append([get(u) for u in urls])
    c1, t1 = sum(cpu_s(p) for p in pids), time.monotonic()
    return c1 - c0, sum(rss_mib(p) for p in pids), t1 - t0, polls


def _sum_of_up(base: str) -> float:
    """``sum(up)`` from a Prometheus-compatible query API at ``base`` (Prometheus, VictoriaMetrics)."""
    body = json.loads(get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": "sum(up)"})))
    result = body["data"]["result"]
    return float(result[0]["value"][1]) if result else 0.0


def _active(body: str) -> set[tuple[str, str]]:
    alerts = json.loads(body)["data"]["alerts"]
    return {(a["labels"].get("alertname", ""), a["labels"].get("instance", "")) for a in alerts}


def measure_agent(job: Job) -> Window:
    """The real ``sre-agent run`` over the job's targets with the bundled rules."""
    interval = job.interval
    with tempfile.TemporaryDirectory(prefix="sre-agent-bench-") as tmp, \
            running_agent(job.urls, interval, job.timeout, rule_copies(Path(tmp), job.group_interval),
                          Path(tmp)) as (port, pid):
        base = f"http://127.0.0.1:{port}"
        cpu, rss, secs, polls = _watch([pid], [f"{base}/metrics", f"{base}/api/v1/alerts"], job)
    texts = [m for m, _ in polls]
    durations = [_sum(t, "sre_agent_scrape_cycle_duration_seconds") for t in texts]
    evals = [_sum(t, "sre_agent_rule_group_last_duration_seconds") for t in texts]
    cycles = _sum(texts[-1], "sre_agent_scrape_cycles_total") or _sum(texts[-1], "sre_agent_scrape_cycles")
    cycles0 = _sum(texts[0], "sre_agent_scrape_cycles_total") or _sum(texts[0], "sre_agent_scrape_cycles")
    active = [_active(a) for _, a in polls]
    return Window(cpu_s=cpu, intervals=secs / interval, rss_mib=rss, eval_s=statistics.mean(evals),
                  cycles=cycles - cycles0, expected=math.floor(secs / interval) - 1,
                  late=sum(d > interval for d in durations), max_cycle_s=max(durations),
                  up=_sum(texts[-1], "sre_agent_target_up"),
                  # always: from the second poll, 15 s into the window (a rate over a fresh store needs a
                  # few scrapes and a recording-rule round before an alert can be pending)
                  always=set.intersection(*(active[1:] or active)), ever=set.union(*active))


def measure_prometheus(binary: str, job: Job) -> Window:
    """Prometheus (``binary``) scraping the same targets and evaluating the same rules."""
    interval = job.interval
    with tempfile.TemporaryDirectory(prefix="sre-agent-bench-") as tmp, \
            running_prometheus(binary, job.urls, interval, job.timeout,
                               rules=rule_copies(Path(tmp), job.group_interval), work=Path(tmp)) as (port, pid):
        cpu, rss, secs, polls = _watch([pid], [f"http://127.0.0.1:{port}/metrics"], job)
        up = _sum_of_up(f"http://127.0.0.1:{port}")
    texts = [m for (m,) in polls]
    evals = [_sum(t, "prometheus_rule_group_last_duration_seconds") for t in texts]
    missed = (_sum(texts[-1], "prometheus_rule_group_iterations_missed_total")
              - _sum(texts[0], "prometheus_rule_group_iterations_missed_total"))
    return Window(cpu_s=cpu, intervals=secs / interval, rss_mib=rss, eval_s=statistics.mean(evals),
                  missed_evals=missed, up=up)


def measure_vm_stack(job: Job) -> Window:
    """vmagent + victoria-metrics + vmalert doing the same job: CPU and RSS of the three together."""
    interval = job.interval
    with tempfile.TemporaryDirectory(prefix="sre-agent-bench-") as tmp:
        work = Path(tmp)
        rules = rule_copies(work, job.group_interval, keep_firing=False)
        with running_vm_stack(job.urls, interval, job.timeout, rules, work) as stack:
            pids = [pid for _, pid in stack.values()]
            cpu, rss, secs, _ = _watch(pids, [f"http://127.0.0.1:{stack['vmalert'][0]}/metrics"], job)
            up = _sum_of_up(f"http://127.0.0.1:{stack['victoria-metrics'][0]}")
    return Window(cpu_s=cpu, intervals=secs / interval, rss_mib=rss, up=up)
