"""Simulated GPUs under dcgm-exporter's names: what a node's exporter would show for the fleet.

Each simulated replica holds ``tensor_parallel`` GPUs of one simulated host, and those GPUs
read what the replica model does:

* framebuffer: vLLM allocates ``gpu_memory_utilization`` of the GPU's CUDA-visible memory at
  start and keeps it (the KV cache is preallocated, so usage does not follow KV-cache usage);
  LMDeploy takes the weights plus ``cache_max_entry_count`` of what is left. NVML reports its own
  reserve apart (``FB_RESERVED``), so ``FB_USED + FB_FREE`` is the CUDA total the OOM message
  names. A replica whose scenario kills it with a CUDA OOM grows towards full memory between
  the incident's onset and its death, as the PyTorch caching allocator does before the failing
  allocation; a dead or removed replica's GPUs drop to idle;
* utilization: the share of time a kernel runs, 0 when nothing runs, otherwise the engine
  iteration over the iteration plus the host-side gap between iterations (so larger batches,
  with longer iterations, read higher);
* power from utilization and batch occupancy (capped at the power limit, which lowers the SM
  clock and sets the software power-cap event reason), temperature as a first-order lag
  towards ambient plus a thermal resistance times power;
* NVLink traffic from the tensor-parallel all-reduces (two per layer per token computed);
  in the ``slow_interconnect`` scenario the links are down and the same traffic crosses PCIe.

No scenario raises an XID: a CUDA OOM is an allocation the application fails, not a fault the
driver reports (XIDs 13/31/43 are kernel exceptions, 48 double-bit ECC, 63/64 row-remapping
events, 79 a GPU off the bus), so ``DCGM_FI_DEV_XID_ERRORS`` stays 0 as on a real node, and ECC
counts and row remaps stay 0 (healthy HBM). Hardware faults are injected instead
(:meth:`GpuBank.fault`, the control port's ``POST /gpu_fault``): an XID as NVML's event would
report it (63 also records a correctable row remap, 48 a double-bit error), or one NVLink down.

The readings go through the agent's own dcgm-exporter mapping (:mod:`agent.collect.dcgm`): this
module answers the NVML calls :class:`~agent.collect.dcgm.GpuReadings` makes, in NVML's units
(bytes, mW, KiB counters with microsecond stamps), so names, labels and unit conversions are
exactly those the agent exports from real GPUs.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Final

import structlog
from prometheus_client.utils import floatToGoString

from agent.collect.dcgm import Gpu, GpuReadings, dcgm_labels
from agent.errors import SimulatorError
from agent.series import METRIC_NAME
from agent.simulate.model import Load, ReplicaModel, ReplicaParams

__all__ = ["DCGM_HELP", "GpuBank", "GpuParams", "SimGpu"]

_MIB: Final = 1 << 20
#: NVML's clock-event reason bits (nvml.h ``nvmlClocksEventReason*``).
_GPU_IDLE: Final = 0x1
_SW_POWER_CAP: Final = 0x4
#: dcgm-exporter's metric types and HELP texts (its default counters' wording where it has one);
#: a name missing here is a gauge with a generic text.
DCGM_HELP: Final[dict[str, tuple[str, str]]] = {
    "DCGM_FI_DEV_FB_TOTAL": ("gauge", "Framebuffer memory total (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_RESERVED": ("gauge", "Framebuffer memory reserved (in MiB)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("gauge", "Power management limit (in W)."),
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz)."),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("gauge", "Current clock event reasons (bitmask)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("counter", "Total number of single-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("counter", "Total number of single-bit persistent ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", "Total number of double-bit persistent ECC errors."),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for correctable errors"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors"),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "Whether remapping of rows is pending"),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("counter", "Total number of NVLink bandwidth counters for all lanes."),
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT": ("gauge", "PCIe TX throughput (in KB/s)."),
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT": ("gauge", "PCIe RX throughput (in KB/s)."),
    "sre_agent_gpu_nvlink_up": ("gauge", "Whether an NVLink is up (1) or down (0), from NVML."),
    "sre_agent_gpu_processes": ("gauge", "Compute processes on the GPU, from NVML."),
    "sre_agent_gpu_xid_errors_total": ("counter", "XID errors seen per XID since start, from NVML events."),
}


@dataclass(frozen=True, slots=True)
class GpuParams:
    """One simulated GPU model. Defaults: an A100-SXM4-40GB (400 W, 12 NVLinks) serving
    Llama-3.1-8B (32 layers, hidden size 4,096, 14.96 GiB of BF16 weights)."""

    name: str = "NVIDIA A100-SXM4-40GB"
    reserved_mib: int = 614  # NVML's reserve beside the CUDA-visible total (40,960 MiB in all)
    power_idle_w: float = 58.0
    power_limit_w: float = 400.0
    sm_clock_max_mhz: int = 1410
    sm_clock_idle_mhz: int = 210
    mem_clock_mhz: int = 1215
    nvlinks: int = 12
    ambient_c: float = 27.0
    c_per_w: float = 0.105  # steady-state temperature rise per watt
    thermal_tau_s: float = 40.0
    host_gap_s: float = 0.0018  # per engine iteration, scheduling and sampling on the CPU: no kernel runs
    hidden_size: int = 4096
    num_layers: int = 32
    weights_gib: float = 14.96
    lmdeploy_cache_max_entry_count: float = 0.8  # LMDeploy's default share of free memory for KV
    oom_peak: float = 0.995  # share of the CUDA total a replica that dies of OOM reaches


@dataclass(eq=False)
class SimGpu:
    """One simulated GPU's state; the NVML answers below read it."""

    index: int
    uuid: str
    bus_id: str
    owner: str = ""  # the replica's name; empty while idle
    flavor: str = ""
    used_bytes: int = 0
    util: float = 0.0
    power_w: float = 0.0
    temp_c: float = 0.0
    sm_clock: int = 0
    reasons: int = _GPU_IDLE
    nvlink_kib: int = 0  # tx + rx since start, as NVML's NVLink throughput counters
    links_up: bool = True
    pcie_tx_kbs: float = 0.0
    pcie_rx_kbs: float = 0.0
    stamp_us: int = 0
    seen_tokens: float = 0.0  # the owner's computed tokens at the last step
    links_down: set[int] = field(default_factory=set)  # links a fault took down
    dbe: int = 0
    remapped_correctable: int = 0
    labels: dict[str, str] = field(default_factory=dict)


class _NoSuchLink(Exception):
    """What NVML raises for a link index past the GPU's last NVLink."""


class _Nvml:
    """The pynvml calls :class:`GpuReadings` makes, answered from :class:`SimGpu` state (the
    device handle is the :class:`SimGpu` itself)."""

    NVML_SUCCESS = 0
    NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
    NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES = 0, 1
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 138, 139
    nvmlMemory_v2 = 0x02000028

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self, params: GpuParams, total_bytes: int) -> None:
        self.params, self.total = params, total_bytes

    def nvmlDeviceGetMemoryInfo(self, gpu: SimGpu, version: int = 0) -> SimpleNamespace:
        reserved = self.params.reserved_mib * _MIB
        return SimpleNamespace(total=self.total + reserved, reserved=reserved, used=gpu.used_bytes,
                               free=self.total - gpu.used_bytes)  # fmt: skip

    def nvmlDeviceGetUtilizationRates(self, gpu: SimGpu) -> SimpleNamespace:
        # decode reads the weights and the KV cache every iteration: memory is busy about as often as SMs
        return SimpleNamespace(gpu=round(gpu.util), memory=round(gpu.util * 0.6))

    def nvmlDeviceGetTemperature(self, gpu: SimGpu, sensor: int) -> int:
        return round(gpu.temp_c)

    def nvmlDeviceGetPowerUsage(self, gpu: SimGpu) -> int:
        return round(gpu.power_w * 1000)

    def nvmlDeviceGetPowerManagementLimit(self, gpu: SimGpu) -> int:
        return round(self.params.power_limit_w * 1000)

    def nvmlDeviceGetClockInfo(self, gpu: SimGpu, clock: int) -> int:
        return gpu.sm_clock if clock == self.NVML_CLOCK_SM else self.params.mem_clock_mhz

    def nvmlDeviceGetTotalEccErrors(self, gpu: SimGpu, kind: int, counter: int) -> int:
        return gpu.dbe if kind == self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED else 0

    def nvmlDeviceGetPcieThroughput(self, gpu: SimGpu, counter: int) -> int:
        return round(gpu.pcie_tx_kbs if counter == self.NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kbs)

    def nvmlDeviceGetCurrentClocksEventReasons(self, gpu: SimGpu) -> int:
        return gpu.reasons

    def nvmlDeviceGetRemappedRows(self, gpu: SimGpu) -> tuple[int, int, int, int]:
        return (gpu.remapped_correctable, 0, 0, 0)

    def nvmlDeviceGetNvLinkState(self, gpu: SimGpu, link: int) -> int:
        if link >= self.params.nvlinks:
            raise _NoSuchLink(link)
        up = gpu.links_up and link not in gpu.links_down
        return self.NVML_FEATURE_ENABLED if up else self.NVML_FEATURE_DISABLED

    def nvmlDeviceGetFieldValues(self, gpu: SimGpu, ids: list[tuple[int, int]]) -> list[SimpleNamespace]:
        half = gpu.nvlink_kib // 2
        return [SimpleNamespace(nvmlReturn=self.NVML_SUCCESS, value=SimpleNamespace(ullVal=half),
                                timestamp=gpu.stamp_us) for _ in ids]  # fmt: skip

    def nvmlDeviceGetComputeRunningProcesses(self, gpu: SimGpu) -> list[SimpleNamespace]:
        # one engine process per busy GPU; its memory is not visible from the exporter's container
        return [SimpleNamespace(pid=0, usedGpuMemory=None)] if gpu.owner else []


class GpuBank:
    """The simulated host's GPUs: allocated to replicas as they start, stepped with them, and
    rendered as dcgm-exporter text. Freed GPUs stay (hardware does not leave with a replica)
    and are reused first."""

    def __init__(self, replica: ReplicaParams, params: GpuParams | None = None, *, hostname: str,
                 seed: int = 0, tensor_parallel: int = 1) -> None:  # fmt: skip
        self.replica, self.params = replica, params if params is not None else GpuParams()
        self.hostname, self.tensor_parallel = hostname, tensor_parallel
        self.total_bytes = round(replica.gpu_total_gib * 1024) * _MIB
        self.gpus: list[SimGpu] = []
        self._rng = random.Random(seed)  # noqa: S311 - a simulation, not cryptography
        self._nvml = _Nvml(self.params, self.total_bytes)
        self._state: dict[int, Gpu] = {}
        self._readings = GpuReadings(self._nvml, call=self._call, on_error=self._on_error, no_link=(_NoSuchLink,),
                                     proc_root=Path("/proc"), max_processes=0)  # fmt: skip
        self._body, self._rendered_at = b"", -1.0

    # -- allocation ---------------------------------------------------------------------------
    def allocate(self, owner: str, flavor: str) -> list[SimGpu]:
        """``tensor_parallel`` idle GPUs for ``owner`` (new ones when none is idle)."""
        out: list[SimGpu] = []
        for gpu in self.gpus:
            if len(out) == self.tensor_parallel:
                break
            if not gpu.owner:
                out.append(gpu)
        while len(out) < self.tensor_parallel:
            out.append(self._add())
        for gpu in out:
            gpu.owner, gpu.flavor, gpu.seen_tokens = owner, flavor, 0.0
        return out

    def release(self, gpus: Iterable[SimGpu]) -> None:
        """The owner is gone: its memory is freed, its GPUs idle."""
        for gpu in gpus:
            gpu.owner, gpu.flavor, gpu.used_bytes = "", "", 0

    def _add(self) -> SimGpu:
        index = len(self.gpus)
        gid = uuid.UUID(int=self._rng.getrandbits(128), version=4)
        gpu = SimGpu(index, f"GPU-{gid}", f"00000000:{0x07 + 0x10 * index:02X}:00.0")
        gpu.temp_c = self.params.ambient_c + self.params.c_per_w * self.params.power_idle_w
        gpu.power_w, gpu.sm_clock = self.params.power_idle_w, self.params.sm_clock_idle_mhz
        gpu.labels = dcgm_labels(index, gpu.uuid, self.params.name, gpu.bus_id, hostname=self.hostname,
                                 hostname_label="Hostname", driver="550.90.07")  # fmt: skip
        self.gpus.append(gpu)
        log = structlog.get_logger(__name__).bind(gpu=index)
        self._state[index] = Gpu(index, gpu, gpu.uuid, self.params.name, gpu.bus_id, gpu.labels, log)
        return gpu

    def fault(self, index: int, *, xid: int | None = None, nvlink_down: int | None = None) -> None:
        """Inject a hardware fault on GPU ``index``: an XID event, or one NVLink going down."""
        if not 0 <= index < len(self.gpus):
            raise SimulatorError(f"no GPU {index}; the simulated host has {len(self.gpus)}")
        gpu = self.gpus[index]
        if nvlink_down is not None:
            if not 0 <= nvlink_down < self.params.nvlinks:
                raise SimulatorError(f"no NVLink {nvlink_down}; a {self.params.name} has {self.params.nvlinks}")
            gpu.links_down.add(nvlink_down)
        if xid is not None:
            if xid <= 0:
                raise SimulatorError(f"an XID is a positive number, not {xid}")
            state = self._state[index]
            state.last_xid = xid
            state.xids[xid] += 1
            if xid == 63:  # row-remapping recording event (A100 and later)
                gpu.remapped_correctable += 1
            elif xid == 48:  # double-bit ECC error
                gpu.dbe += 1

    # -- stepping -----------------------------------------------------------------------------
    def step(self, gpus: list[SimGpu], model: ReplicaModel | None, load: Load, *, now: float, dt: float,
             oom_progress: float | None = None) -> None:  # fmt: skip
        """Advance ``gpus`` (one replica's, or idle ones with ``model`` None) by ``dt`` model
        seconds ending at ``now``. ``oom_progress`` (0..1) is how far a replica its scenario
        kills with an OOM has come from the onset to its death."""
        p = self.params
        alive = model is not None and model.alive
        tokens = 0.0
        if model is not None:
            tokens = model.prompt_tokens - model.prefix_hits + model.generation_tokens
        for gpu in gpus:
            computed, gpu.seen_tokens = max(0.0, tokens - gpu.seen_tokens), tokens
            gpu.stamp_us = round(now * 1e6)
            gpu.links_up = load.tp_efficiency >= 1.0
            if model is None or not alive:
                if model is not None:  # the engine died: its process and memory are gone
                    gpu.used_bytes = 0
                self._idle(gpu, dt)
                continue
            gpu.used_bytes = self._used(gpu.flavor, oom_progress)
            busy = model.num_running > 0 or model.num_waiting > 0
            if busy:
                t_iter = max(model.last_iteration_s, 1e-4)
                gpu.util = min(100.0, 100.0 * t_iter / (t_iter + p.host_gap_s))
            else:
                gpu.util = 0.0
            occupancy = min(1.0, model.num_running / 96)
            # a full batch draws past the limit: the firmware caps power by lowering the SM clock
            draw = p.power_idle_w + (p.power_limit_w - p.power_idle_w) * gpu.util / 100 * (0.45 + 0.7 * occupancy)
            draw += self._rng.uniform(-2.0, 2.0)
            gpu.reasons, gpu.sm_clock = (0, p.sm_clock_max_mhz) if busy else (_GPU_IDLE, p.sm_clock_idle_mhz)
            if draw > p.power_limit_w * 0.98:
                gpu.reasons |= _SW_POWER_CAP
                gpu.sm_clock = round(p.sm_clock_max_mhz * p.power_limit_w * 0.98 / draw)
                draw = p.power_limit_w * 0.98
            gpu.power_w = draw
            self._heat(gpu, dt)
            # tensor parallel: two all-reduces per layer per computed token, ring traffic 2(n-1)/n each way
            n = self.tensor_parallel
            ring = 2 * (n - 1) / n if n > 1 else 0.0
            kib = computed * 2 * p.num_layers * p.hidden_size * 2 * ring * 2 / 1024  # tx + rx
            host = 0.05 * computed / max(dt, 1e-9)  # token ids in, logits' argmax out: a trickle
            if gpu.links_up:
                gpu.nvlink_kib += round(kib)
                gpu.pcie_tx_kbs = gpu.pcie_rx_kbs = host
            else:  # NCCL fell back to PCIe: the all-reduce traffic moves there
                gpu.pcie_tx_kbs = gpu.pcie_rx_kbs = host + kib / 2 / max(dt, 1e-9)

    def _used(self, flavor: str, oom_progress: float | None) -> int:
        p, total = self.params, self.total_bytes
        if flavor == "lmdeploy":
            weights = p.weights_gib * (1 << 30)
            used = weights + p.lmdeploy_cache_max_entry_count * (total - weights)
        else:
            used = self.replica.gpu_memory_utilization * total
        if oom_progress is not None:
            used += (p.oom_peak * total - used) * min(1.0, max(0.0, oom_progress))
        return int(used) // _MIB * _MIB

    def _idle(self, gpu: SimGpu, dt: float) -> None:
        p = self.params
        gpu.util, gpu.reasons, gpu.sm_clock = 0.0, _GPU_IDLE, p.sm_clock_idle_mhz
        gpu.power_w = p.power_idle_w + self._rng.uniform(-1.0, 1.0)
        gpu.pcie_tx_kbs = gpu.pcie_rx_kbs = 0.0
        self._heat(gpu, dt)

    def _heat(self, gpu: SimGpu, dt: float) -> None:
        p = self.params
        target = p.ambient_c + p.c_per_w * gpu.power_w
        gpu.temp_c += (target - gpu.temp_c) * min(1.0, dt / p.thermal_tau_s)

    # -- exposition ---------------------------------------------------------------------------
    def render(self, now: float) -> bytes:
        """dcgm-exporter's text format for every GPU at model time ``now`` (cached per ``now``)."""
        if now == self._rendered_at and self._body:
            return self._body
        families: dict[str, list[str]] = {}
        now_ms = round(now * 1000)
        for gpu in self.gpus:
            for obs in self._readings.poll(self._state[gpu.index], now_ms, xids=True):
                labels = dict(obs.labels)
                name = labels.pop(METRIC_NAME)
                text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
                families.setdefault(name, []).append(f"{name}{{{text}}} {floatToGoString(obs.value)}")  # type: ignore[no-untyped-call]
        lines: list[str] = []
        for name, samples in families.items():
            kind, doc = DCGM_HELP.get(name, ("gauge", f"{name} (simulated)."))
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}", *samples]
        self._body, self._rendered_at = ("\n".join(lines) + "\n").encode(), now
        return self._body

    def _call(self, gpu: Gpu, key: str, func: str, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(self._nvml, func, None)
        return None if fn is None else fn(gpu.handle, *args, **kwargs)

    def _on_error(self, gpu: Gpu, key: str, exc: BaseException) -> None:
        """Nothing to degrade: the simulated NVML answers every call it has."""

    def state(self) -> list[dict[str, object]]:
        """Every GPU's headline numbers, for ``GET /state``."""
        return [{"gpu": g.index, "uuid": g.uuid, "owner": g.owner, "fb_used_mib": g.used_bytes // _MIB,
                 "util": round(g.util, 1), "power_w": round(g.power_w, 1), "temp_c": round(g.temp_c, 1),
                 "nvlinks_up": g.links_up} for g in self.gpus]  # fmt: skip


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

