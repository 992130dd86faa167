"""A discrete-time queueing model of one vLLM replica, cheap enough to run 1,000 of them.

The demo, the integration tests and the benchmarks need ``/metrics`` whose numbers move
together the way a real engine's do: KV-cache usage rises with running sequences,
waiting grows when blocks or seats run out, decode preempts (recompute) when a sequence
needs a block and none is free, latency histograms stretch with batch size. This model
produces that from first principles (Poisson arrivals, a block pool, continuous
batching) at one aggregate computation per step instead of per token:

* every running sequence gains the same number of tokens per step (continuous batching),
  so one *decode clock* ``D`` (tokens per sequence since start) orders all finishes; a
  heap keyed by "``D`` at which this sequence is done" pops exactly the finished ones;
* tokens held in the KV cache are ``S + n * D`` with ``S`` the sum of per-sequence
  offsets, so block usage is O(1) per step;
* per-request work happens only on arrival, admission, preemption and finish.

Nothing here reads a clock: :meth:`ReplicaModel.step` is given the model time and step
length, and randomness comes from a seeded :class:`random.Random`, so a run is exact
given its seed.
"""

from __future__ import annotations

import heapq
import math
import random
from bisect import bisect_left
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from agent.errors import SimulatorError

__all__ = ["FINISH_REASONS", "Hist", "Load", "ReplicaModel", "ReplicaParams"]

FINISH_REASONS = ("stop", "length", "abort")
#: Histograms every replica keeps; the renderer maps them to family names per generation.
HIST_KEYS = ("ttft", "itl", "tpot", "e2e", "queue", "inference", "prefill", "decode", "prompt_tokens",
             "generation_tokens", "max_tokens", "n", "iteration_tokens", "cached_tokens",
             "hit_ratio")  # fmt: skip


@dataclass(frozen=True, slots=True)
class ReplicaParams:
    """Engine shape and speed. Defaults: Llama-3.1-8B in BF16 on one 40 GB A100 class GPU
    with ``--gpu-memory-utilization 0.9`` (about 8,200 blocks of 16 tokens)."""

    num_gpu_blocks: int = 8192
    block_size: int = 16
    max_num_seqs: int = 256
    max_model_len: int = 8192
    prefill_tokens_per_s: float = 16_000.0
    decode_base_s: float = 0.011  # weights read once per iteration
    decode_per_seq_s: float = 0.00006  # sampling and per-sequence kernels
    decode_per_ktoken_s: float = 0.00004  # attention: KV read per 1,000 context tokens in the batch
    max_prefill_share: float = 0.5  # chunked prefill never takes more of a step than this
    watermark: float = 0.01  # fraction of blocks admission leaves free (vLLM's watermark)
    client_timeout_s: float = 600.0  # clients give up on a request still waiting after this
    gpu_total_gib: float = 39.4
    gpu_memory_utilization: float = 0.9

    def __post_init__(self) -> None:
        if self.num_gpu_blocks * self.block_size < self.max_model_len:
            raise SimulatorError("num_gpu_blocks * block_size must hold one max_model_len sequence")


@dataclass(frozen=True, slots=True)
class Load:
    """What a scenario asks of one replica during a step."""

    arrival_rate: float  # requests per second
    prompt_median: float = 900.0
    prompt_sigma: float = 0.7
    gen_median: float = 200.0
    gen_sigma: float = 0.6
    max_tokens: int = 1024
    prefix_hit_ratio: float = 0.95  # share of prompt tokens the prefix cache serves when KV is not full
    tp_efficiency: float = 1.0  # below 1 the interconnect stretches every iteration by 1/x


class Hist:
    """A classic histogram with weighted observations (one bisect per call)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, weight: int = 1) -> None:
        if weight > 0:
            self.counts[bisect_left(self.bounds, value)] += weight
            self.sum += value * weight
            self.count += weight

    def cumulative(self) -> list[int]:
        """Counts per bound, cumulative, ``+Inf`` last (what ``_bucket`` series show)."""
        return list(accumulate(self.counts))


@dataclass(slots=True, eq=False)
class _Request:
    arrival: float
    prompt: int
    target: int  # output tokens this request will produce
    reason: str
    max_tokens: int
    done: int = 0  # output tokens produced so far
    cached: int = 0
    admitted: float = -1.0
    first_token: float = -1.0
    d0: float = 0.0  # decode clock when its current residency began
    key: float = 0.0  # decode clock at which it finishes
    seq: int = 0
    preemptions: int = 0


@dataclass(slots=True)
class ReplicaModel:
    """One replica's engine state, advanced by :meth:`step`."""

    params: ReplicaParams
    bounds: Mapping[str, Sequence[float]]
    seed: int = 0
    alive: bool = True
    steps: int = 0
    now: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    preemptions: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    success: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))
    hists: dict[str, Hist] = field(init=False)
    waiting: deque[_Request] = field(default_factory=deque)
    running: dict[int, _Request] = field(default_factory=dict)
    last_iteration_s: float = 0.0
    last_gen_rate: float = 0.0
    recent_hit_rate: float = 0.0
    _rng: random.Random = field(init=False)
    _heap: list[tuple[float, int, _Request]] = field(default_factory=list)
    _clock: float = 0.0  # decode clock D
    _offsets: float = 0.0  # S = sum(prompt + done - d0) over running
    _seq: int = 0
    _prefill_free_at: float = 0.0
    _last_busy: float = 0.0  # prefill time taken last step (decode gets the rest)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)  # noqa: S311 - a simulation, not cryptography
        self.hists = {k: Hist(self.bounds[k]) for k in HIST_KEYS}

    # -- derived gauges ----------------------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def tokens_held(self, clock: float | None = None) -> float:
        return self._offsets + len(self.running) * (self._clock if clock is None else clock)

    def blocks_used(self, clock: float | None = None) -> float:
        """Blocks held: every sequence rounds its last block up, half a block on average."""
        n, size = len(self.running), self.params.block_size
        return 0.0 if n == 0 else (self.tokens_held(clock) + n * (size - 1) / 2) / size

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.blocks_used() / self.params.num_gpu_blocks)

    # -- the step -----------------------------------------------------------------------------
    def step(self, now: float, dt: float, load: Load, extra: Load | None = None) -> None:
        """Advance from model time ``now`` by ``dt`` seconds under ``load``: decode what runs
        (finishing and preempting), then admit from the queue into the blocks that freed.
        ``extra`` is a second arrival stream with its own request shape (a tenant pinned to this
        replica); the engine's behaviour (prefix hits, interconnect) follows ``load``."""
        self.steps += 1
        self.now = now + dt
        if not self.alive or dt <= 0:
            return
        arrivals = self._arrivals(now, dt, load)
        if extra is not None:
            arrivals = sorted((*arrivals, *self._arrivals(now, dt, extra)), key=lambda r: r.arrival)
        self.waiting.extend(arrivals)
        self._expire(now)
        p, clock0, n = self.params, self._clock, len(self.running)
        k = t_iter = progress = 0.0
        if n:
            attention = p.decode_per_ktoken_s * self.tokens_held() / 1000
            t_iter = (p.decode_base_s + p.decode_per_seq_s * n + attention) / max(load.tp_efficiency, 1e-3)
            k = max(dt - self._last_busy, dt * (1 - p.max_prefill_share)) / t_iter
            self._clock = clock0 + k
            progress = n * k - self._finish(now, dt, clock0, self._clock)
            progress -= self._preempt(clock0, self._clock)
        busy, admitted, prefill_tokens = self._admit(now, dt, load)
        stalled = n if busy > 0 else 0
        self.hists["itl"].observe(t_iter, round(progress) - stalled)
        self.hists["itl"].observe(t_iter + busy, stalled)
        for req, frac in admitted:
            self._place(req, clock0 + frac * k)
            progress += min(self._clock, req.key) - req.d0
        self.generation_tokens += max(progress, 0.0)
        self.last_gen_rate = (max(progress, 0.0) + len(admitted)) / dt
        self.last_iteration_s, self._last_busy = t_iter, busy
        if k:
            self.hists["iteration_tokens"].observe(n + prefill_tokens / max(k, 1.0), round(k))

    def _arrivals(self, now: float, dt: float, load: Load) -> list[_Request]:
        """The requests that arrive within ``[now, now + dt)``, in arrival order."""
        rng, p = self._rng, self.params
        mean = load.arrival_rate * dt
        if mean <= 0:
            return []
        if mean < 30:  # Knuth's method; a normal approximation above
            count, limit, prod = 0, math.exp(-mean), rng.random()
            while prod > limit:
                count += 1
                prod *= rng.random()
        else:
            count = max(0, round(rng.gauss(mean, math.sqrt(mean))))
        out = []
        for at in sorted(now + rng.random() * dt for _ in range(count)):
            gen = max(1, round(rng.lognormvariate(math.log(load.gen_median), load.gen_sigma)))
            reason = "length" if gen >= load.max_tokens else "stop"
            gen = min(gen, load.max_tokens)
            prompt = round(rng.lognormvariate(math.log(load.prompt_median), load.prompt_sigma))
            prompt = min(max(prompt, 8), p.max_model_len - gen)
            out.append(_Request(at, prompt, gen, reason, load.max_tokens))
        return out

    def _expire(self, now: float) -> None:
        """Clients give up on requests that waited ``client_timeout_s`` and never started. Preempted
        requests go back to the head of the queue (they started, so their clients keep waiting); the
        ones that never started follow in arrival order, so the oldest of them is the first after
        that preempted prefix."""
        limit, waiting = now - self.params.client_timeout_s, self.waiting
        head = 0
        while head < len(waiting) and waiting[head].admitted >= 0:
            head += 1
        while head < len(waiting) and waiting[head].arrival < limit:
            del waiting[head]
            self.success["abort"] += 1

    def _admit(self, now: float, dt: float, load: Load) -> tuple[float, list[tuple[_Request, float]], float]:
        """Take requests from the head of the queue (FIFO, preempted ones first) while seats,
        free blocks beyond the watermark and the prefill budget allow. Returns the prefill busy
        time, the admitted requests with the fraction of the step at which their first token
        came out, and the prompt tokens computed (prefix-cache hits are not computed)."""
        p, rng, end = self.params, self._rng, now + dt
        busy = tokens = 0.0
        admitted: list[tuple[_Request, float]] = []
        cursor = max(now, self._prefill_free_at)
        rate = p.prefill_tokens_per_s * max(load.tp_efficiency, 1e-3)
        free = p.num_gpu_blocks * (1 - p.watermark) - self.blocks_used()
        pressure = min(1.0, max(0.0, (self.kv_usage - 0.8) / 0.2))  # a full cache evicts prefixes
        hit_ratio = load.prefix_hit_ratio * (1 - 0.6 * pressure)
        while self.waiting and busy < dt * p.max_prefill_share:
            req = self.waiting[0]
            start = max(cursor, req.arrival)
            held = req.prompt + req.done
            need = math.ceil((held + 1) / p.block_size)
            if start >= end or need > free or len(self.running) + len(admitted) >= p.max_num_seqs:
                break
            self.waiting.popleft()
            free -= need
            fresh = req.admitted < 0
            if fresh:
                share = min(0.98, hit_ratio * rng.uniform(0.85, 1.1))
                req.cached = int(req.prompt * share) // p.block_size * p.block_size
                req.admitted = start
                self.prompt_tokens += req.prompt
                self.prefix_queries += req.prompt
                self.prefix_hits += req.cached
                self.recent_hit_rate += 0.05 * (req.cached / req.prompt - self.recent_hit_rate)
            compute = held - (req.cached if fresh else 0)
            cursor = start + compute / rate
            busy += compute / rate
            tokens += compute
            if fresh:
                req.first_token = cursor
                self.hists["ttft"].observe(cursor - req.arrival)
            req.done += 1  # the prefill pass emits one token
            self.generation_tokens += 1
            admitted.append((req, min(1.0, max(0.0, (cursor - now) / dt))))
        self._prefill_free_at = cursor
        return busy, admitted, tokens

    def _place(self, req: _Request, d0: float) -> None:
        """Start a residency on the decode clock at ``d0``."""
        self._seq += 1
        req.seq, req.d0, req.key = self._seq, d0, d0 + (req.target - req.done)
        self.running[req.seq] = req
        self._offsets += req.prompt + req.done - req.d0
        heapq.heappush(self._heap, (req.key, req.seq, req))

    def _leave(self, req: _Request, clock: float) -> None:
        del self.running[req.seq]
        self._offsets -= req.prompt + req.done - req.d0
        req.done += max(0, int(min(clock, req.key) - req.d0))

    def _finish(self, now: float, dt: float, clock0: float, clock1: float) -> float:
        """Retire sequences whose key the clock passed; returns tokens not generated by them."""
        unused, span = 0.0, max(clock1 - clock0, 1e-9)
        while self._heap and self._heap[0][0] <= clock1:
            key, seq, req = heapq.heappop(self._heap)
            if self.running.get(seq) is not req:
                continue  # preempted earlier; its entry is stale
            unused += clock1 - max(key, clock0)
            self._leave(req, key)
            req.done = req.target
            end = max(req.first_token, now + (max(key, clock0) - clock0) / span * dt)
            self._observe_finished(req, end)
        return unused

    def _preempt(self, clock0: float, clock1: float) -> float:
        """Recompute-preempt the newest sequences until the cache holds the rest at ``clock1``."""
        unused = 0.0
        while len(self.running) > 1 and self.blocks_used(clock1) > self.params.num_gpu_blocks:
            req = self.running[next(reversed(self.running))]
            unused += clock1 - max(clock0, req.d0)
            self._leave(req, clock0)
            req.preemptions += 1
            self.preemptions += 1
            self.waiting.appendleft(req)
        return unused

    def _observe_finished(self, req: _Request, end: float) -> None:
        h = self.hists
        self.success[req.reason] += 1
        ttft, e2e = req.first_token - req.arrival, end - req.arrival
        h["e2e"].observe(e2e)
        h["queue"].observe(req.admitted - req.arrival)
        h["inference"].observe(end - req.admitted)
        h["prefill"].observe(req.first_token - req.admitted)
        h["decode"].observe(end - req.first_token)
        h["tpot"].observe((e2e - ttft) / (req.target - 1) if req.target > 1 else 0.0)
        h["prompt_tokens"].observe(req.prompt)
        h["generation_tokens"].observe(req.target)
        h["max_tokens"].observe(req.max_tokens)
        h["n"].observe(1)
        h["cached_tokens"].observe(req.cached)
        h["hit_ratio"].observe(req.cached / req.prompt)

    def state(self) -> dict[str, object]:
        """A JSON-ready summary for ``GET /state`` and logs."""
        return {
            "alive": self.alive, "time": round(self.now, 3), "running": self.num_running,
            "waiting": self.num_waiting, "kv_cache_usage": round(self.kv_usage, 4),
            "preemptions": self.preemptions, "prompt_tokens": int(self.prompt_tokens),
            "generation_tokens": int(self.generation_tokens),
            "generation_tokens_per_s": round(self.last_gen_rate, 1),
            "iteration_ms": round(self.last_iteration_s * 1000, 2), "finished": dict(self.success),
        }  # fmt: skip
