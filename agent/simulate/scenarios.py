"""Named incidents for the simulated fleet: what the load does over time, and what a dying
replica writes to its log.

Each scenario is a healthy phase followed, at ``onset_s`` of model time, by the incident
the agent's rules exist for: ``surge`` (waiting outgrows running, KEDA/the guide's
scale-out rule), ``kv_pressure`` (KV cache above 95 % with preemptions), ``oom`` (a
replica dies with a CUDA out-of-memory error, its endpoint refuses connections),
``slow_interconnect`` (tensor-parallel all-reduce over a link with a tenth of NVLink's
bandwidth: generation throughput collapses while load stays). Demand is given for the
whole fleet and shared among live replicas, so a scale-out really relieves the others.

The log lines follow the exact wording of vLLM's and PyTorch's messages (see
``fixtures/logs/``), generated from the replica's numbers rather than copied.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import datetime

from agent.errors import SimulatorError
from agent.simulate.model import Load, ReplicaModel

__all__ = ["SCENARIOS", "Scenario", "cuda_oom_lines", "get_scenario", "log_stamp", "preemption_line", "stats_line"]


_HEALTHY = Load(arrival_rate=0.0)


@dataclass(frozen=True, slots=True)
class Scenario:
    """A load profile in model time. ``rate_per_replica`` is the healthy demand per initial
    replica; after ``onset_s`` (ramped over ``ramp_s``) demand is multiplied by ``surge``,
    requests take the ``incident`` shape, and ``kill_replica`` dies at ``kill_at_s``."""

    name: str
    description: str
    rate_per_replica: float = 11.0
    healthy: Load = _HEALTHY
    incident: Load | None = None
    surge: float = 1.0
    onset_s: float = 60.0
    ramp_s: float = 30.0
    kill_replica: int | None = None
    kill_at_s: float = 90.0
    patience_s: float | None = None  # clients abandon a request that waited this long (None: the replica's own)
    tenant: Load | None = None  # an extra stream pinned to one replica (session affinity), from tenant_from_s
    tenant_replica: int = 1
    tenant_from_s: float = 0.0

    def demand(self, t: float) -> float:
        """The demand multiplier at model time ``t`` (1 before the onset)."""
        if t < self.onset_s or self.surge == 1.0:
            return 1.0
        ramp = 1.0 if self.ramp_s <= 0 else min(1.0, (t - self.onset_s) / self.ramp_s)
        return 1.0 + (self.surge - 1.0) * ramp

    def load(self, t: float, arrival_rate: float) -> Load:
        """The per-replica load at ``t`` for a replica whose share of demand is ``arrival_rate``."""
        shape = self.incident if self.incident is not None and t >= self.onset_s else self.healthy
        return replace(shape, arrival_rate=arrival_rate)

    def tenant_load(self, t: float, replica: int) -> Load | None:
        """The pinned tenant's stream on vLLM replica number ``replica`` at ``t``, if it has one."""
        if self.tenant is None or replica != self.tenant_replica or t < self.tenant_from_s:
            return None
        return self.tenant

    def dies(self, t: float, replica: int) -> bool:
        """Whether replica number ``replica`` (vLLM replicas count from 0) is dead at ``t``."""
        return replica == self.kill_replica and t >= self.kill_at_s


#: Calibrated on the default :class:`ReplicaParams` (8B model, ~8,200 KV blocks): one replica
#: saturates its KV cache near 13 requests/s of the healthy shape.
SCENARIOS: dict[str, Scenario] = {
    "steady": Scenario(
        "steady", "healthy: KV cache 40-70 %, queue near empty, TTFT p99 well under a second"
    ),
    "surge": Scenario(
        "surge",
        "demand triples after a minute: waiting passes 2x running and grows until the fleet scales out",
        surge=3.0,
    ),
    "kv_pressure": Scenario(
        "kv_pressure",
        "long prompts and generations: KV cache above 95 %, recompute preemptions, prefix hits fall",
        # Prompts of 1,800 tokens (sigma 0.4) and generations capped at 2,048 keep nearly every request's
        # blocks under the 5 % of the cache between the watermark and the alert's 95 %, so one waiting at
        # the queue's head for a finish to free blocks seldom empties the cache below 95 %: dips at 0.2 %
        # of evaluations, against 3-5 % with the old 2,600 / 4,096, where each restarted the alert's
        # 10-minute `for` and made the scenario test flaky.
        incident=Load(0.0, prompt_median=1800, prompt_sigma=0.4, gen_median=1400, gen_sigma=0.4, max_tokens=2048,
                      prefix_hit_ratio=0.5),
        surge=0.32, onset_s=30.0, ramp_s=0.0,
    ),
    "oom": Scenario(
        "oom",
        "prompts grow, then replica 0 dies of a CUDA OOM: connection refused, its traffic moves on",
        incident=Load(0.0, prompt_median=1300, prefix_hit_ratio=0.85), onset_s=30.0,
        kill_replica=0, kill_at_s=90.0,
    ),
    "slow_interconnect": Scenario(
        "slow_interconnect",
        "tensor-parallel all-reduce falls back to a link with 1/10 of NVLink's bandwidth: generation "
        "throughput collapses to about a tenth while load stays",
        incident=Load(0.0, tp_efficiency=0.1),
    ),
    "story": Scenario(
        "story",
        "the demo's incident from start to end: demand rises 60 % after a minute and the queue outgrows twice "
        "the running requests until a scale-out adds replicas (clients give up after 30 s in the queue); from "
        "2 minutes a busy tenant pinned to replica 1 by session affinity keeps its KV cache above 95 %; at 15 "
        "minutes replica 0 dies of a CUDA OOM",
        surge=1.6, onset_s=60.0, ramp_s=30.0, patience_s=30.0,
        tenant=Load(12.0, prompt_median=600, gen_median=250), tenant_replica=1, tenant_from_s=120.0,
        kill_replica=0, kill_at_s=900.0,
    ),
}  # fmt: skip


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; a :class:`SimulatorError` lists the valid names."""
    try:
        return SCENARIOS[name]
    except KeyError:
        raise SimulatorError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None


# -- log lines -----------------------------------------------------------------------------------
def log_stamp(when: datetime) -> str:
    """The time stamp vLLM's log lines start with (local time, no year)."""
    return when.strftime("%m-%d %H:%M:%S")


def stats_line(when: datetime, model: ReplicaModel, prompt_rate: float, generation: str) -> str:
    """vLLM's periodic engine-stats log line (V1 ``loggers.py``, V0 ``metrics.py`` wording)."""
    hit = 100 * model.prefix_hits / model.prefix_queries if model.prefix_queries else 0.0
    rates = (f"Avg prompt throughput: {prompt_rate:.1f} tokens/s, Avg generation throughput: "
             f"{model.last_gen_rate:.1f} tokens/s, Running: {model.num_running} reqs")
    kv = f"GPU KV cache usage: {100 * model.kv_usage:.1f}%"
    if generation == "v0":
        return (f"INFO {log_stamp(when)} metrics.py:455] {rates}, Swapped: 0 reqs, Pending: {model.num_waiting} "
                f"reqs, {kv}, CPU KV cache usage: 0.0%.")
    return (f"INFO {log_stamp(when)} [loggers.py:123] Engine 000: {rates}, Waiting: {model.num_waiting} reqs, "
            f"{kv}, Prefix cache hit rate: {hit:.1f}%")


def preemption_line(when: datetime, group: int, total: int) -> str:
    """The V0 scheduler's recompute-preemption warning (logged every 50th preemption)."""
    return (f"WARNING {log_stamp(when)} scheduler.py:1560] Sequence group {group} is preempted by "
            "PreemptionMode.RECOMPUTE mode because there is not enough KV cache space. This can affect the "
            "end-to-end performance. Increase gpu_memory_utilization or tensor_parallel_size to provide more "
            f"KV cache memory. total_num_cumulative_preemption={total}")  # fmt: skip


def cuda_oom_lines(when: datetime, model: ReplicaModel, *, gpu: int, pid: int, seed: int) -> list[str]:
    """The lines a V1 worker and API server log when a forward pass runs out of GPU memory:
    PyTorch's ``torch.OutOfMemoryError`` message with this GPU's numbers, then the engine's
    death and the server shutting down."""
    rng = random.Random(seed)  # noqa: S311 - only picks plausible byte counts
    total = model.params.gpu_total_gib
    free_mib = rng.uniform(20.0, 300.0)
    in_use = total - free_mib / 1024
    reserved_mib = rng.uniform(8.0, 120.0)
    allocated = in_use - rng.uniform(0.25, 0.6)
    want_mib = rng.choice((128.0, 224.0, 270.0, 512.0, 1024.0)) + free_mib
    stamp = log_stamp(when)
    head = f"(VllmWorker rank={gpu} pid={pid}) ERROR {stamp} [multiproc_executor.py:527]"
    return [
        f"{head} WorkerProc hit an exception.",
        f"{head} torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {want_mib:.2f} MiB. "
        f"GPU {gpu} has a total capacity of {total:.2f} GiB of which {free_mib:.2f} MiB is free. "
        f"Including non-PyTorch memory, this process has {in_use:.2f} GiB memory in use. "
        f"Of the allocated memory {allocated:.2f} GiB is allocated by PyTorch, and {reserved_mib:.2f} MiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        f"ERROR {stamp} [core.py:700] EngineCore encountered a fatal error.",
        f"ERROR {stamp} [async_llm.py:430] AsyncLLM output_handler failed.",
        f"ERROR {stamp} [async_llm.py:430] vllm.v1.engine.exceptions.EngineDeadError: EngineCore "
        "encountered an issue. See stack trace (above) for the root cause.",
        f"INFO {stamp} [launcher.py:80] Shutting down FastAPI HTTP server.",
    ]
