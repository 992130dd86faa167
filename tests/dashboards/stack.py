"""A whole monitoring stack on 127.0.0.1, for running every dashboard query against real backends.

:class:`Stack` starts, in the test's event loop and as subprocesses:

* two simulated fleets (:mod:`agent.simulate`): fleet A runs vLLM V1 (two replicas, tensor
  parallel 2, so NVLink carries all-reduce traffic) and one LMDeploy replica through the
  ``surge`` scenario; fleet B runs vLLM V0 (two replicas, another model) through ``oom``, so a
  replica fills its GPU and dies. Both serve their GPUs on a simulated dcgm-exporter port, as
  two hosts (fleet B listens on 127.0.0.2, so its GPUs' ``Hostname`` is its own).
  One GPU gets an injected XID 63 (a row-remapping event) and one a down NVLink;
* the agent (``python -m agent run``) scraping all of that, evaluating the bundled rules
  with every ``for`` shortened to :data:`FOR_S` (dashboards read no alert timing; the agent's
  own series must exist), scaling fleet A through ``POST /scale``, notifying a webhook that
  answers 200 and one that answers 503 (given up on after :data:`GIVE_UP_S`), and running
  the nccl-tests check with ``tests/fake_all_reduce_perf.py`` (wrong results) when the
  always-firing ``Watchdog`` alert fires;
* Prometheus 2.42 scraping the fleets (HTTP service discovery from the control port, so
  replicas the agent adds are scraped), the GPU exporters and the agent every second,
  evaluating ``rules/*.rules.yaml`` every second;
* VictoriaMetrics (single node) fed by ``vmagent`` scraping the same targets with the same
  configuration, and ``vmalert`` evaluating the same recording rules against it and writing
  the results back. vmalert 1.79 refuses the whole file set over ``keep_firing_for`` (it
  learnt the field in a later release), so it gets the recording rules only: the dashboards
  read recorded series, never ``ALERTS``.

:meth:`Stack.query` runs an instant query on either backend. Waiting is always polling with a
deadline.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp

from agent.gocompat import yamlv3
from agent.simulate.server import Fleet, FleetConfig
from tests.conftest import REPO
from tests.e2e import AgentProcess
from tests.prometheus import Prometheus
from tests.receivers import RecordingServer, reply
from tests.victoriametrics import VictoriaMetrics, VMAgent, VMAlert

__all__ = ["BACKENDS", "FOR_S", "MODEL_A", "MODEL_B", "QueryError", "Stack"]

BACKENDS = ("prometheus", "victoriametrics")
FOR_S = 2.0  # every alert's `for` in the agent's copy of the rules
GIVE_UP_S = 4.0  # notify.give_up_after: the failing receiver's notifications are given up on this soon
SPEED = 10.0  # model seconds per wall second: surge's onset at 6 s, oom's death at 9 s
MODEL_A = "meta-llama/Llama-3.1-8B-Instruct"
MODEL_B = "Qwen/Qwen2.5-7B-Instruct"
HOST_B = "127.0.0.2"  # fleet B is another host: its GPUs' Hostname, and where the agent finds their OOM evidence
FAKE_NCCL = REPO / "tests" / "fake_all_reduce_perf.py"
RULES = sorted((REPO / "rules").glob("*.rules.yaml"))


def agent_rules(directory: Path) -> list[Path]:
    """The bundled rules with every ``for`` at :data:`FOR_S` and no ``keep_firing_for``."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for path in RULES:
        doc = yamlv3.load_file(path)
        for group in doc["groups"]:
            for rule in group["rules"]:
                rule.pop("keep_firing_for", None)
                if "for" in rule:
                    rule["for"] = f"{FOR_S:g}s"
        out.append(directory / path.name)
        out[-1].write_text(json.dumps(doc, indent=1))  # JSON is YAML
    return out


def recording_rules(directory: Path) -> list[Path]:
    """The bundled rules' recording rules only (vmalert 1.79 cannot read ``keep_firing_for``)."""
    directory.mkdir(parents=True, exist_ok=True)
    out = []
    for path in RULES:
        doc = yamlv3.load_file(path)
        groups = [{**g, "rules": [r for r in g["rules"] if "record" in r]} for g in doc["groups"]]
        groups = [g for g in groups if g["rules"]]
        if groups:
            out.append(directory / path.name)
            out[-1].write_text(json.dumps({"groups": groups}, indent=1))
    return out


@dataclass
class Stack:
    """Everything above, entered with ``async with Stack(tmp) as stack``; stopped on the way out."""

    workdir: Path
    speed: float = SPEED
    fleet_a: Fleet = field(init=False)
    fleet_b: Fleet = field(init=False)
    prometheus: Prometheus = field(init=False)
    victoria: VictoriaMetrics = field(init=False)
    started: float = 0.0
    _stack: list[Any] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None
    agent: AgentProcess | None = None

    async def __aenter__(self) -> Self:
        self.started = time.time()
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            await self._start()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        for item in reversed(self._stack):
            try:
                if isinstance(item, AgentProcess):
                    await item.close()
                elif isinstance(item, Fleet | RecordingServer):
                    await item.stop()
                else:
                    await item.__aexit__(None, None, None)
            except Exception as exc:  # stop the rest whatever one of them does
                print(f"stopping {type(item).__name__} failed: {exc!r}", file=sys.stderr)
        self._stack.clear()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- start-up -----------------------------------------------------------------------------------------
    async def _start(self) -> None:
        wd, step = self.workdir, 0.5
        self.fleet_a = Fleet(FleetConfig(replicas=2, lmdeploy_replicas=1, base_port=0, control_port=0,
                                         scenario="surge", speed=self.speed, step_s=step, tensor_parallel=2,
                                         model=MODEL_A, seed=1))  # fmt: skip
        self.fleet_b = Fleet(FleetConfig(replicas=2, host=HOST_B, base_port=0, control_port=0, scenario="oom",
                                         generation="v0",
                                         speed=self.speed, step_s=step, model=MODEL_B, seed=2,
                                         log_dir=wd / "logs"))  # fmt: skip
        hook, flaky = RecordingServer(), RecordingServer(responder=reply(503))
        for thing in (self.fleet_a, self.fleet_b, hook, flaky):
            await thing.start()
            self._stack.append(thing)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))
        for body in ({"gpu": 1, "xid": 63}, {"gpu": 2, "nvlink_down": 4}):
            async with self._session.post(f"{self.fleet_a.control_url}/gpu_fault", json=body) as r:
                r.raise_for_status()
        config = self._agent_config(hook.url("/hook"), flaky.url("/flaky"))
        self.agent = AgentProcess(config, wd / "agent.log")
        self._stack.append(self.agent)
        self.victoria = VictoriaMetrics(wd)
        self._stack.append(self.victoria)
        await asyncio.gather(self.agent.ready(), self.victoria.__aenter__())
        scrape = self._scrape_configs(f"127.0.0.1:{self.agent.port}")
        self.prometheus = Prometheus(wd, RULES, scrape_configs=scrape)
        vmagent = VMAgent(wd, self._scrape_configs(f"127.0.0.1:{self.agent.port}", vmagent=True),
                          f"{self.victoria.url}/api/v1/write")
        vmalert = VMAlert(wd, recording_rules(wd / "vmalert-rules"), self.victoria.url)
        self._stack += [self.prometheus, vmagent, vmalert]
        await asyncio.gather(self.prometheus.__aenter__(), vmagent.__aenter__(), vmalert.__aenter__())

    def _agent_config(self, hook: str, flaky: str) -> Path:
        wd, a, b = self.workdir, self.fleet_a, self.fleet_b
        targets = [{"url": u, "job": "lmdeploy" if "lmdeploy" in str(s["name"]) else "vllm"}
                   for fleet in (a, b) for u, s in zip(fleet.targets, fleet.state(), strict=True)]
        targets += [{"url": str(fleet.dcgm_url), "job": "dcgm"} for fleet in (a, b)]
        config = {
            "targets": targets,
            "scrape": {"interval": "1s", "timeout": "1s"},
            "server": {"listen": "127.0.0.1:0"},
            "rules": {"files": [str(p) for p in agent_rules(wd / "agent-rules")], "evaluation_interval": "1s"},
            "state": {"path": str(wd / "state.db")},
            "receivers": [{"name": "hook", "webhook": {"url": hook}}, {"name": "flaky", "webhook": {"url": flaky}}],
            "route": {"receiver": "hook", "group_by": ["alertname"], "group_wait": "1s", "group_interval": "1s",
                      "repeat_interval": "1h", "routes": [{"receiver": "hook", "continue": True},
                                                          {"receiver": "flaky", "continue": True}]},
            "actions": [{"type": "scale_out", "matchers": ['action="scale_out"']},
                        {"type": "diagnose", "matchers": ['alertname=~"Watchdog|GPUMemoryNearFull"']}],
            "scaling": {"services": [{"name": "llama", "matchers": [f'model_name="{MODEL_A}"'],
                                      "webhook": {"url": f"{a.control_url}/scale"}, "min_replicas": 2,
                                      "max_replicas": 4, "initial_replicas": 2, "scale_out_cooldown": "5s"}]},
            "notify": {"dispatch_interval": "500ms", "retry_initial": "200ms", "retry_max": "1s",
                       "give_up_after": f"{GIVE_UP_S:g}s"},
            "diagnostics": {
                "nccl": {"enabled": True, "launcher": [sys.executable], "binary": str(FAKE_NCCL),
                         "args": ["-b", "1M", "-e", "8G", "-f", "2", "--fake-mode", "wrong"], "gpus": 8,
                         "expected_gbps": 230, "timeout": "60s", "on_alerts": ["Watchdog"]},
                "oom": {"log_files": [str(wd / "logs" / "vllm-*.log")]},
            },
            "log": {"format": "json", "level": "info"},
        }
        path = wd / "agent.yaml"
        path.write_text(json.dumps(config, indent=1))
        return path

    def _scrape_configs(self, agent: str, *, vmagent: bool = False) -> list[dict[str, Any]]:
        """The same scrape configuration for Prometheus and vmagent: replicas by HTTP service
        discovery (so scale-outs are followed), split into the vllm and lmdeploy jobs. vmagent
        1.79 has no per-config ``refresh_interval`` (its -promscrape.httpSDCheckInterval is the one)."""
        refresh = {} if vmagent else {"refresh_interval": "1s"}
        sd = [{"url": f"{f.control_url}/targets", **refresh} for f in (self.fleet_a, self.fleet_b)]
        clean = {"action": "labeldrop", "regex": "replica|generation"}
        return [
            {"job_name": "vllm", "http_sd_configs": sd,
             "relabel_configs": [{"source_labels": ["generation"], "regex": "lmdeploy", "action": "drop"}, clean]},
            {"job_name": "lmdeploy", "http_sd_configs": sd,
             "relabel_configs": [{"source_labels": ["generation"], "regex": "lmdeploy", "action": "keep"}, clean]},
            {"job_name": "dcgm", "static_configs": [{"targets": [str(f.dcgm_url).split("/")[2]
                                                                 for f in (self.fleet_a, self.fleet_b)]}]},
            {"job_name": "sre-agent", "static_configs": [{"targets": [agent]}]},
        ]

    # -- queries ------------------------------------------------------------------------------------------
    def base(self, backend: str) -> str:
        return self.prometheus.url if backend == "prometheus" else self.victoria.url

    async def query(self, backend: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (``status: error`` raises with the backend's message)."""
        assert self._session is not None
        params = {"query": expr, "time": f"{time.time() if at is None else at:.3f}"}
        async with self._session.post(f"{self.base(backend)}/api/v1/query", data=params) as r:
            body = await r.json(content_type=None)
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType', r.status)}: {body.get('error', body)}")
        result = body["data"]["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    async def query_range(self, backend: str, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """A range query's matrix."""
        assert self._session is not None
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        async with self._session.post(f"{self.base(backend)}/api/v1/query_range", data=params) as r:
            body = await r.json(content_type=None)
        if body.get("status") != "success":
            raise QueryError(f"{body.get('errorType', r.status)}: {body.get('error', body)}")
        return list(body["data"]["result"])

    def logs(self) -> str:
        """The tails of every process log, for a failure message."""
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-15:]
            parts.append(f"--- {path.name} ---\n" + "\n".join(lines))
        return "\n".join(parts)


class QueryError(Exception):
    """A backend answered a query with an error."""

