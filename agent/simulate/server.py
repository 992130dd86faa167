"""A simulated vLLM/LMDeploy fleet on localhost: one HTTP port per replica plus a control port.

The demo, every integration test and the benchmarks point the agent at this fleet
instead of GPUs. Each replica answers ``GET /metrics`` (always text format 0.0.4, as
vLLM does for a client that does not ask for OpenMetrics), ``GET /health`` and
``GET /version``; a replica killed by its scenario first answers ``/health`` with
503 (500 on V0), then closes its port so scrapes get *connection refused*, exactly the
sequence CATALOG §6 describes. The control port takes ``POST /scale`` (``{"replicas":
N}`` or ``{"delta": 1}``, keyed by an ``Idempotency-Key`` header or an ``idempotency_key``
field: a key seen in the last hour is not applied again, the answer is the remembered result
with ``"applied": false``, as a user's scaler should do for the agent's HA pair) and ``POST /gpu_fault``
(``{"gpu": 3, "xid": 63}`` or ``{"gpu": 3, "nvlink_down": 5}``), shares the scenario's
demand among the live replicas so a scale-out relieves them, and serves ``GET /state``
and ``GET /targets`` (Prometheus HTTP service discovery JSON).

The replicas' GPUs (:mod:`.gpu`, ``tensor_parallel`` per replica, on one simulated host named
after ``host``) are served under dcgm-exporter's names on one more port, the *GPU exporter*
(``dcgm_port``; None turns it off), at ``GET /metrics``, as one node's dcgm-exporter would.

Models step in one background task every ``step_s`` of wall time, each step worth
``step_s * speed`` seconds of model time (in sub-steps of at most a second), and a
replica renders its ``/metrics`` at most once per step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import structlog
from aiohttp import web

from agent.errors import SimulatorError
from agent.simulate.balance import BALANCERS, shares
from agent.simulate.gpu import GpuBank, GpuParams, SimGpu
from agent.simulate.model import Load, ReplicaModel, ReplicaParams
from agent.simulate.render import VERSIONS, Renderer, bounds_for
from agent.simulate.scenarios import Scenario, cuda_oom_lines, get_scenario, log_stamp, preemption_line, stats_line

__all__ = ["CONTENT_TYPE", "Fleet", "FleetConfig"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_MODEL_DT = 1.0  # longest model step; faster speeds take several per tick
_WATCHDOG_S = 5.0  # vLLM's watchdog notices a dead engine within 5 s and shuts the server down
_STATS_EVERY_S = 10.0  # vLLM logs engine stats about this often
_KEYS_KEPT = 1024  # idempotency keys remembered, at most
_KEY_TTL_S = 3600.0  # and for at most this long: far longer than two HA replicas can be apart
_IDEMPOTENCY_HEADER = "Idempotency-Key"

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """What to simulate. ``control_port`` None means ``base_port - 1`` (or a free port when
    ``base_port`` is 0); 0 means pick a free port. ``generation`` is ``"v1"`` or ``"v0"``.
    ``dcgm_port`` is the GPU exporter's port (0: a free one, None: no GPU exporter);
    ``tensor_parallel`` GPUs serve each replica."""

    replicas: int = 3
    host: str = "127.0.0.1"
    base_port: int = 8000
    control_port: int | None = None
    scenario: str = "steady"
    generation: str = "v1"
    lmdeploy_replicas: int = 0
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    seed: int = 0
    speed: float = 1.0
    step_s: float = 1.0
    log_dir: Path | None = None
    max_replicas: int = 1024
    params: ReplicaParams = field(default_factory=ReplicaParams)
    dcgm_port: int | None = 0
    tensor_parallel: int = 1
    gpu: GpuParams = field(default_factory=GpuParams)
    balance: str = "even"  # how the load balancer shares demand: agent.simulate.balance.BALANCERS

    def __post_init__(self) -> None:
        get_scenario(self.scenario)
        if self.generation not in ("v1", "v0"):
            raise SimulatorError(f"generation must be 'v1' or 'v0', not {self.generation!r}")
        if not 0 <= self.replicas <= self.max_replicas or self.lmdeploy_replicas < 0:
            raise SimulatorError(f"replicas must be within 0..{self.max_replicas}")
        if self.speed <= 0 or self.step_s <= 0:
            raise SimulatorError("speed and step_s must be positive")
        if self.balance not in BALANCERS:
            raise SimulatorError(f"balance must be one of {', '.join(BALANCERS)}, not {self.balance!r}")
        if not 1 <= self.tensor_parallel <= 64:
            raise SimulatorError(f"tensor_parallel must be within 1..64, not {self.tensor_parallel}")


@dataclass(eq=False)
class _Replica:
    name: str
    index: int  # position among replicas of its kind; scenarios address vLLM replicas by it
    flavor: str  # "v1" | "v0" | "lmdeploy"
    model: ReplicaModel
    renderer: Renderer
    log_path: Path | None
    host: str
    port: int = 0
    status: str = "up"  # up -> dying (health fails) -> dead (port closed)
    died_at: float = 0.0
    rate: float = 0.0
    runner: web.ServerRunner | None = None
    logged_at: float = 0.0
    logged_prompt: float = 0.0
    logged_preemptions: int = 0
    gpus: list[SimGpu] = field(default_factory=list)
    served_model: str = ""

    @property
    def address(self) -> str:
        """``host:port``, as a ``file_sd`` target names it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The replica's ``/metrics`` URL."""
        return f"http://{self.address}/metrics"

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method != "GET":
            return web.Response(status=405)
        path = request.path.rstrip("/")
        if path == "/metrics":
            return web.Response(body=self.renderer.render(), headers={"Content-Type": CONTENT_TYPE})
        if path == "/health":
            if self.flavor == "lmdeploy":
                ok = self.status == "up"
                body = {"status": "healthy" if ok else "unhealthy", "message": "" if ok else "engine is dead"}
                return web.json_response(body, status=200 if ok else 503)
            return web.Response(status=200 if self.status == "up" else 500 if self.flavor == "v0" else 503)
        if path == "/version":
            return web.json_response({"version": VERSIONS[self.flavor]})
        if path == "/v1/models":
            return web.json_response(self._models())
        return web.Response(status=404)

    def _models(self) -> dict[str, object]:
        """The OpenAI-compatible model list: vLLM's model card carries ``max_model_len``; LMDeploy's
        carries none (its ``--session-len`` is not served)."""
        card: dict[str, object] = {"id": self.served_model, "object": "model",
                                   "owned_by": "lmdeploy" if self.flavor == "lmdeploy" else "vllm",
                                   "root": self.served_model, "parent": None}
        if self.flavor != "lmdeploy":
            card["max_model_len"] = self.model.params.max_model_len
        return {"object": "list", "data": [card]}


class Fleet:
    """N simulated replicas on consecutive localhost ports plus a control port."""

    def __init__(
        self, config: FleetConfig, *, clock: Callable[[], float] = time.monotonic,
        wallclock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        self.config = config
        self.scenario: Scenario = get_scenario(config.scenario)
        self._clock, self._wallclock = clock, wallclock
        self._vllm: list[_Replica] = []
        self._lmdeploy: list[_Replica] = []
        self._next_port = config.base_port
        self._created = 0
        self._time = 0.0  # model seconds since start
        self._task: asyncio.Task[None] | None = None
        self._control: web.AppRunner | None = None
        self._control_port = 0
        self._lock = asyncio.Lock()
        self._keys: dict[str, tuple[float, dict[str, object]]] = {}  # key -> (when applied, result)
        self.scale_log: list[dict[str, object]] = []  # every POST /scale: key, replicas, applied, at
        self.gpus = GpuBank(config.params, config.gpu, hostname=config.host, seed=config.seed,
                            tensor_parallel=config.tensor_parallel)  # fmt: skip
        self._dcgm: web.ServerRunner | None = None
        self._dcgm_port = 0
        self._load = Load(arrival_rate=0.0)

    # -- public API ---------------------------------------------------------------------------
    @property
    def targets(self) -> list[str]:
        """``/metrics`` URLs of every replica slot, live or dead, vLLM then LMDeploy."""
        return [r.url for r in (*self._vllm, *self._lmdeploy)]

    @property
    def control_url(self) -> str:
        return f"http://{self.config.host}:{self._control_port}"

    @property
    def dcgm_url(self) -> str | None:
        """The GPU exporter's ``/metrics`` URL (None when ``dcgm_port`` is None)."""
        return f"http://{self.config.host}:{self._dcgm_port}/metrics" if self._dcgm_port else None

    def state(self) -> list[dict[str, object]]:
        """Every replica's status and engine state, for ``GET /state``."""
        return [
            {"name": r.name, "kind": "lmdeploy" if r.flavor == "lmdeploy" else "vllm", "generation": r.flavor,
             "url": r.url, "status": r.status,
             "arrival_rate": round(r.rate, 3), **r.model.state()}
            for r in (*self._vllm, *self._lmdeploy)
        ]  # fmt: skip

    async def start(self) -> None:
        """Bind every replica and the control port, then start stepping. If a port cannot be
        bound, whatever was started is closed again and :class:`SimulatorError` says which."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        cfg = self.config
        for _ in range(cfg.replicas):
            self._vllm.append(await self._spawn(cfg.generation, len(self._vllm)))
        for _ in range(cfg.lmdeploy_replicas):
            self._lmdeploy.append(await self._spawn("lmdeploy", len(self._lmdeploy)))
        self._rebalance()
        app = web.Application()
        app.router.add_post("/scale", self._post_scale)
        app.router.add_get("/state", self._get_state)
        app.router.add_get("/targets", self._get_targets)
        app.router.add_post("/gpu_fault", self._post_gpu_fault)
        self._control = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._control.setup()
        port = cfg.control_port if cfg.control_port is not None else max(cfg.base_port - 1, 0)
        self._control_port = await self._bind(self._control, port)
        if cfg.dcgm_port is not None:
            self._dcgm = web.ServerRunner(web.Server(self._handle_dcgm, access_log=None), shutdown_timeout=0.5)
            await self._dcgm.setup()
            self._dcgm_port = await self._bind(self._dcgm, cfg.dcgm_port)
        self._task = asyncio.create_task(self._run(), name="simulate-fleet")
        log.info("simulate.fleet_started", replicas=cfg.replicas, lmdeploy=cfg.lmdeploy_replicas,
                 scenario=cfg.scenario, generation=cfg.generation, control=self.control_url,
                 gpus=self.dcgm_url)  # fmt: skip

    async def stop(self) -> None:
        """Stop stepping and close every port (idempotent)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for replica in (*self._vllm, *self._lmdeploy):
            await self._close(replica)
        if self._control is not None:
            await self._control.cleanup()
            self._control = None
        if self._dcgm is not None:
            await self._dcgm.cleanup()
            self._dcgm = None
        log.info("simulate.fleet_stopped")

    async def scale_to(self, replicas: int) -> None:
        """Start or stop vLLM replicas (newest first) and share demand among the live ones."""
        async with self._lock:
            await self._scale(replicas)

    async def _scale(self, replicas: int) -> None:
        if not 0 <= replicas <= self.config.max_replicas:
            raise SimulatorError(f"replicas must be within 0..{self.config.max_replicas}, not {replicas}")
        before = len(self._vllm)
        while len(self._vllm) < replicas:
            self._vllm.append(await self._spawn(self.config.generation, len(self._vllm)))
        while len(self._vllm) > replicas:
            gone = self._vllm.pop()
            await self._close(gone)
            self.gpus.release(gone.gpus)
        self._rebalance()
        log.info("simulate.scaled", before=before, after=replicas)

    # -- replicas -----------------------------------------------------------------------------
    async def _spawn(self, flavor: str, index: int) -> _Replica:
        cfg = self.config
        kind = "lmdeploy" if flavor == "lmdeploy" else "vllm"
        seed = cfg.seed * 1_000_003 + self._created * 7919 + (1 if kind == "lmdeploy" else 0)
        self._created += 1
        patience = self.scenario.patience_s
        params = cfg.params if patience is None else replace(cfg.params, client_timeout_s=patience)
        model = ReplicaModel(params, bounds_for(flavor, cfg.params.max_model_len), seed, now=self._time)
        renderer = Renderer(model, flavor, cfg.model, created=self._wallclock())
        log_path = cfg.log_dir / f"{kind}-{index}.log" if cfg.log_dir is not None else None
        replica = _Replica(f"{kind}-{index}", index, flavor, model, renderer, log_path, cfg.host,
                           served_model=cfg.model)
        replica.gpus = self.gpus.allocate(replica.name, flavor)
        replica.runner = web.ServerRunner(web.Server(replica.handle, access_log=None), shutdown_timeout=0.5)
        await replica.runner.setup()
        replica.port = await self._bind(replica.runner, self._next_port)
        if self._next_port:
            self._next_port = replica.port + 1
        replica.logged_at = self._time
        url = f"http://{replica.address}"
        if kind == "lmdeploy":
            self._write(replica, [f"INFO:     Uvicorn running on {url} (Press CTRL+C to quit)"])
        else:
            head = f"INFO {log_stamp(self._now())} [api_server.py:1880]"
            self._write(replica, [f"{head} vLLM API server version {VERSIONS[flavor]}",
                                  f"{head} Starting vLLM API server 0 on {url}"])
        return replica  # fmt: skip

    async def _bind(self, runner: web.BaseRunner, port: int) -> int:
        site = web.TCPSite(runner, self.config.host, port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise SimulatorError(f"cannot listen on {self.config.host}:{port}: {exc}") from exc
        return int(runner.addresses[-1][1])

    async def _close(self, replica: _Replica) -> None:
        if replica.runner is not None:
            await replica.runner.cleanup()
            replica.runner = None

    def _rebalance(self) -> None:
        """Share the scenario's demand at the current model time among live replicas."""
        sc, cfg = self.scenario, self.config
        demand = sc.rate_per_replica * sc.demand(self._time)  # per initial replica
        live = [r for r in self._vllm if r.status == "up"]
        outstanding = [r.model.num_running + r.model.num_waiting for r in live]
        for r, share in zip(live, shares(cfg.balance, outstanding), strict=True):
            r.rate = demand * max(cfg.replicas, 1) * share
        for r in self._lmdeploy:
            r.rate = demand if r.status == "up" else 0.0

    # -- stepping -----------------------------------------------------------------------------
    async def _run(self) -> None:
        step_s = self.config.step_s
        deadline = self._clock()
        while True:
            deadline += step_s
            delay = deadline - self._clock()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay > 5 * step_s:  # far behind (a stalled loop): skip ahead instead of bursting
                deadline = self._clock()
            try:
                await self._tick()
            except Exception:  # one bad tick must not end the simulation
                log.exception("simulate.tick_failed")

    async def _tick(self) -> None:
        total = self.config.step_s * self.config.speed
        subs = max(1, math.ceil(total / _MAX_MODEL_DT - 1e-9))
        dt = total / subs
        for _ in range(subs):
            self._kill_due()
            self._rebalance()
            shape = self.scenario.load(self._time, 0.0)
            for i, replica in enumerate((*self._vllm, *self._lmdeploy)):
                # V0 runs without prefix caching (its default before V1)
                hits = 0.0 if replica.flavor == "v0" else shape.prefix_hit_ratio
                load = replace(shape, arrival_rate=replica.rate, prefix_hit_ratio=hits)
                tenant = None if replica.flavor == "lmdeploy" else self.scenario.tenant_load(self._time, replica.index)
                replica.model.step(self._time, dt, load, tenant)
                if i % 200 == 199:
                    await asyncio.sleep(0)  # let scrapes in between chunks of a large fleet
            self._time += dt
            self._load = shape
        self._step_gpus(total)
        for replica in (*self._vllm, *self._lmdeploy):
            if replica.status == "dying" and self._time >= replica.died_at + _WATCHDOG_S:
                replica.status = "dead"
                await self._close(replica)
                log.info("simulate.replica_closed", replica=replica.name, port=replica.port)
            elif replica.status == "up" and self._time - replica.logged_at >= _STATS_EVERY_S:
                self._log_stats(replica)

    def _step_gpus(self, dt: float) -> None:
        sc = self.scenario
        owned: set[int] = set()
        for replica in (*self._vllm, *self._lmdeploy):
            oom = None
            if replica.flavor != "lmdeploy" and sc.kill_replica == replica.index and sc.onset_s < sc.kill_at_s:
                oom = (self._time - sc.onset_s) / (sc.kill_at_s - sc.onset_s) if self._time >= sc.onset_s else 0.0
            self.gpus.step(replica.gpus, replica.model, self._load, now=self._time, dt=dt, oom_progress=oom)
            owned.update(id(g) for g in replica.gpus)
        idle = [g for g in self.gpus.gpus if id(g) not in owned]
        if idle:
            self.gpus.step(idle, None, self._load, now=self._time, dt=dt)

    def _kill_due(self) -> None:
        for replica in self._vllm:
            if replica.status == "up" and self.scenario.dies(self._time, replica.index):
                replica.status, replica.died_at = "dying", self._time
                replica.model.alive = False
                pid = 1000 + (self.config.seed * 7919 + replica.index) % 60000
                self._write(replica, cuda_oom_lines(self._now(), replica.model, gpu=0, pid=pid,
                                                    seed=self.config.seed + replica.index))  # fmt: skip
                log.warning("simulate.replica_died", replica=replica.name, cause="cuda_oom",
                            model_time=round(self._time, 1))  # fmt: skip

    def _log_stats(self, replica: _Replica) -> None:
        if replica.log_path is None:
            return
        m = replica.model
        span = max(self._time - replica.logged_at, 1e-9)
        prompt_rate = (m.prompt_tokens - replica.logged_prompt) / span
        lines = [stats_line(self._now(), m, prompt_rate, replica.flavor)]
        if replica.flavor == "v0" and m.preemptions // 50 > replica.logged_preemptions // 50:
            lines.append(preemption_line(self._now(), m.steps, m.preemptions))  # V0 warns every 50th
        replica.logged_at, replica.logged_prompt = self._time, m.prompt_tokens
        replica.logged_preemptions = m.preemptions
        self._write(replica, lines)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._wallclock())  # vLLM logs local time

    def _write(self, replica: _Replica, lines: list[str]) -> None:
        if replica.log_path is None:
            return
        replica.log_path.parent.mkdir(parents=True, exist_ok=True)
        with replica.log_path.open("a", encoding="utf-8") as fh:
            fh.write("".join(line + "\n" for line in lines))

    # -- control port -------------------------------------------------------------------------
    async def _post_scale(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "body must be JSON"}, status=400)
        if not isinstance(body, dict):
            return web.json_response({"error": "body must be a JSON object"}, status=400)
        key = request.headers.get(_IDEMPOTENCY_HEADER) or body.get("idempotency_key")
        target, delta = body.get("replicas"), body.get("delta")
        async with self._lock:  # check, apply and remember the key as one step
            self._forget_keys()
            if isinstance(key, str) and key in self._keys:
                remembered = self._keys[key][1]
                self._note_scale(key, remembered, applied=False)
                return web.json_response({**remembered, "applied": False})
            if isinstance(delta, int) and not isinstance(delta, bool) and target is None:
                target = len(self._vllm) + delta
            if not isinstance(target, int) or isinstance(target, bool):
                return web.json_response({"error": "give an integer 'replicas' or 'delta'"}, status=400)
            try:
                await self._scale(target)
            except SimulatorError as exc:
                return web.json_response({"error": str(exc)}, status=400)
            result: dict[str, object] = {"replicas": len(self._vllm), "targets": self.targets}
            if isinstance(key, str):
                self._keys[key] = (self._clock(), result)
                while len(self._keys) > _KEYS_KEPT:
                    del self._keys[next(iter(self._keys))]
            self._note_scale(key, result, applied=True)
        return web.json_response({**result, "applied": True})

    def _forget_keys(self) -> None:
        """Drop keys older than the TTL (insertion order is age order)."""
        horizon = self._clock() - _KEY_TTL_S
        while self._keys and next(iter(self._keys.values()))[0] < horizon:
            del self._keys[next(iter(self._keys))]

    def _note_scale(self, key: object, result: dict[str, object], *, applied: bool) -> None:
        self.scale_log.append({"key": key if isinstance(key, str) else None, "replicas": result["replicas"],
                               "applied": applied, "at": round(self._wallclock(), 3)})
        del self.scale_log[:-_KEYS_KEPT]

    async def _post_gpu_fault(self, request: web.Request) -> web.Response:
        """``{"gpu": 3, "xid": 63}`` or ``{"gpu": 3, "nvlink_down": 5}``: inject a hardware fault."""
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"error": "body must be JSON"}, status=400)
        ints = {k: body.get(k) for k in ("gpu", "xid", "nvlink_down")} if isinstance(body, dict) else {}
        if not ints or any(v is not None and (not isinstance(v, int) or isinstance(v, bool)) for v in ints.values()) \
                or ints["gpu"] is None or (ints["xid"] is None and ints["nvlink_down"] is None):
            return web.json_response({"error": "give an integer 'gpu' and an integer 'xid' or 'nvlink_down'"},
                                     status=400)
        try:
            self.gpus.fault(ints["gpu"], xid=ints["xid"], nvlink_down=ints["nvlink_down"])
        except SimulatorError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        log.warning("simulate.gpu_fault", **{k: v for k, v in ints.items() if v is not None})
        return web.json_response({"applied": True, **ints})

    async def _get_state(self, request: web.Request) -> web.Response:
        return web.json_response({"model_time": round(self._time, 3), "scenario": self.config.scenario,
                                  "replicas": self.state(), "gpu_exporter": self.dcgm_url,
                                  "gpus": self.gpus.state(), "scale_requests": self.scale_log})  # fmt: skip

    async def _handle_dcgm(self, request: web.BaseRequest) -> web.StreamResponse:
        if request.method != "GET":
            return web.Response(status=405)
        if request.path.rstrip("/") != "/metrics":
            return web.Response(status=404)
        return web.Response(body=self.gpus.render(self._time), headers={"Content-Type": CONTENT_TYPE})

    async def _get_targets(self, request: web.Request) -> web.Response:
        groups = [{"targets": [r.address],
                   "labels": {"replica": r.name, "generation": r.flavor}}
                  for r in (*self._vllm, *self._lmdeploy)]  # fmt: skip
        return web.json_response(groups)
