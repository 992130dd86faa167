"""Processes the whole-system benches start and watch: the agent as shipped, its peers, and hanging targets.

Every process is real and measured from outside, the same way for all: CPU seconds from
``/proc/<pid>/stat`` (utime + stime, children not included), RSS from ``/proc/<pid>/status``,
their own ``/metrics`` over HTTP on 127.0.0.1. Used by ``bench/whole.py`` (``python -m bench``).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import IO

import yaml
from fleet import free_port  # type: ignore[import-not-found]

from agent.collect.discovery import instance_of
from agent.config import bundled_rules_dir

ROOT = Path(__file__).resolve().parents[1]


def get(url: str, timeout: float = 30.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def metric_values(text: str, name: str) -> list[tuple[str, float]]:
    """(labels text, value) of every sample of ``name`` in an exposition text."""
    out = []
    for line in text.splitlines():
        if line.startswith((name + " ", name + "{")):
            head, value = line.rsplit(" ", 1)
            out.append((head[len(name):], float(value)))
    return out


@contextmanager
def process(args: list[str], ready_url: str, what: str, cwd: Path | None = None) -> Iterator[int]:
    """A child process, once ``ready_url`` answers; yields its pid, SIGTERM on exit."""
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=err, cwd=cwd)
        try:
            _ready(proc, ready_url, what, err)
            yield proc.pid
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _ready(proc: subprocess.Popen[bytes], url: str, what: str, err: IO[bytes]) -> None:
    """Wait for ``url``; if the process dies or never answers, stop with the end of its stderr."""
    deadline = time.monotonic() + 90
    while True:
        try:
            get(url, timeout=2)
            return
        except OSError as exc:
            if proc.poll() is not None or time.monotonic() > deadline:
                err.seek(0)
                tail = err.read().decode(errors="replace")[-2000:]
                raise SystemExit(f"{what} did not start ({url}): {tail}") from exc
            time.sleep(0.2)


def ms(seconds: float) -> str:
    """A duration both the agent and Prometheus read: whole milliseconds."""
    return f"{round(seconds * 1000)}ms"


def rule_copies(directory: Path, group_interval: float | None = None, keep_firing: bool = True) -> list[str]:
    """The bundled rule files, copied into ``directory``: with every group's interval set to ``group_interval``
    (a short run evaluates more often than the groups' own 15 s), without ``keep_firing_for`` unless
    ``keep_firing`` (vmalert 1.79 cannot read it)."""
    out = []
    for path in sorted(bundled_rules_dir().glob("*.rules.yaml")):
        data = yaml.safe_load(path.read_text())
        for g in data["groups"]:
            if group_interval is not None:
                g["interval"] = ms(group_interval)
            for r in g["rules"] if not keep_firing else []:
                r.pop("keep_firing_for", None)
        copy = directory / path.name
        copy.write_text(yaml.safe_dump(data, sort_keys=False))
        out.append(str(copy))
    return out


def agent_config(urls: list[str], interval: float, timeout: float, *, port: int, state: Path,
                 rules: list[str]) -> dict[str, object]:
    """``sre-agent run``'s config for the bench: the fleet, the rules, no NVML."""
    return {
        "targets": [{"url": u} for u in urls],
        "scrape": {"interval": ms(interval), "timeout": ms(timeout), "concurrency": 256},
        "rules": {"files": rules},
        "nvml": {"enabled": "false"},
        "server": {"listen": f"127.0.0.1:{port}"},
        "state": {"path": str(state)},
    }


@contextmanager
def running_agent(urls: list[str], interval: float, timeout: float, rules: list[str], work: Path
                  ) -> Iterator[tuple[int, int]]:
    """The real ``sre-agent run`` process (``python -m agent run``) over ``urls``; yields (port, pid)."""
    port = free_port()
    cfg = work / "agent.json"  # JSON is YAML
    cfg.write_text(json.dumps(agent_config(urls, interval, timeout, port=port, state=work / "agent.db", rules=rules)))
    with process([sys.executable, "-m", "agent", "run", "--config", str(cfg), "--log-level", "error"], f"http://127.0.0.1:{port}/healthz",
                 "sre-agent run", cwd=ROOT) as pid:
        yield port, pid


def prometheus_config(urls: list[str], interval: float, timeout: float, rule_files: list[str]) -> str:
    targets = ", ".join(f"'{instance_of(u)}'" for u in urls)
    rules = ", ".join(f"'{f}'" for f in rule_files)
    return (f"global: {{scrape_interval: {ms(interval)}, scrape_timeout: {ms(timeout)}, "
            f"evaluation_interval: {ms(interval)}}}\nrule_files: [{rules}]\n"
            f"scrape_configs:\n- job_name: vllm\n  static_configs:\n  - targets: [{targets}]\n")


@contextmanager
def running_prometheus(binary: str, urls: list[str], interval: float, timeout: float, *, rules: list[str],
                       work: Path) -> Iterator[tuple[int, int]]:
    """Prometheus scraping ``urls`` and evaluating ``rules``; yields (port, pid)."""
    port = free_port()
    cfg = work / "prometheus.yml"
    cfg.write_text(prometheus_config(urls, interval, timeout, rules))
    with process([binary, f"--config.file={cfg}", f"--storage.tsdb.path={work}/prom",
                  f"--web.listen-address=127.0.0.1:{port}", "--log.level=error"],
                 f"http://127.0.0.1:{port}/-/ready", "Prometheus") as pid:
        yield port, pid


@contextmanager
def running_vm_stack(urls: list[str], interval: float, timeout: float, rules: list[str], work: Path
                     ) -> Iterator[dict[str, tuple[int, int]]]:
    """victoria-metrics + vmagent (scraping ``urls``) + vmalert (evaluating ``rules``, recording rules written
    back); yields {name: (port, pid)}. No Alertmanager behind vmalert: its notifier's failed sends are cheap."""
    vm, va, al, am = free_port(), free_port(), free_port(), free_port()
    scrape = {"global": {"scrape_interval": ms(interval), "scrape_timeout": ms(timeout)},
              "scrape_configs": [{"job_name": "vllm", "static_configs": [{"targets": [instance_of(u) for u in urls]}]}]}
    (work / "vmagent.yml").write_text(json.dumps(scrape))
    vm_url = f"http://127.0.0.1:{vm}"
    out: dict[str, tuple[int, int]] = {}
    with ExitStack() as stack:
        out["victoria-metrics"] = vm, stack.enter_context(process(
            ["victoria-metrics", f"-httpListenAddr=127.0.0.1:{vm}", f"-storageDataPath={work}/vm",
             "-search.latencyOffset=1s", "-loggerLevel=ERROR"], f"{vm_url}/health", "VictoriaMetrics"))
        out["vmagent"] = va, stack.enter_context(process(
            ["vmagent", f"-httpListenAddr=127.0.0.1:{va}", f"-promscrape.config={work}/vmagent.yml",
             f"-remoteWrite.url={vm_url}/api/v1/write", f"-remoteWrite.tmpDataPath={work}/vmagent",
             "-loggerLevel=ERROR"], f"http://127.0.0.1:{va}/health", "vmagent"))
        out["vmalert"] = al, stack.enter_context(process(
            ["vmalert", f"-httpListenAddr=127.0.0.1:{al}", f"-datasource.url={vm_url}", f"-remoteWrite.url={vm_url}",
             f"-evaluationInterval={interval:g}s", f"-notifier.url=http://127.0.0.1:{am}", "-loggerLevel=ERROR",
             *(f"-rule={r}" for r in rules)], f"http://127.0.0.1:{al}/health", "vmalert"))
        yield out


HANG_SERVER = """
import asyncio, sys
async def hang(reader, writer):
    try:
        await reader.read(65536)
        await asyncio.sleep(3600)
    finally:
        writer.close()
async def main(n):
    servers = [await asyncio.start_server(hang, "127.0.0.1", 0) for _ in range(n)]
    for s in servers:
        print(f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}/metrics", flush=True)
    await asyncio.Event().wait()
asyncio.run(main(int(sys.argv[1])))
"""


@contextmanager
def hanging_targets(n: int) -> Iterator[list[str]]:
    """``n`` targets (in their own process) that accept the connection, read the request, and never answer."""
    proc = subprocess.Popen([sys.executable, "-c", HANG_SERVER, str(n)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        urls = [proc.stdout.readline().strip() for _ in range(n)]
        if not all(u.startswith("http://") for u in urls):
            raise SystemExit(f"hanging targets did not start: {urls[:3]}")
        yield urls
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
