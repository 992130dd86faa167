"""What the NVML poller reads from each GPU, under dcgm-exporter's names, labels and units.

Why a module of its own: this is the mapping the project's rules and dashboards depend on
(DESIGN.md decision 6): which NVML call feeds which ``DCGM_FI_DEV_*`` series, in DCGM's units
(MiB of framebuffer, W, KB/s of PCIe, DCGM's NVLink "MB/s" rate), with dcgm-exporter's labels;
and the ``sre_agent_gpu_*`` series for what dcgm-exporter has no name for (per-process memory,
NVLink state, XID counts). :mod:`agent.collect.nvml` owns NVML's lifecycle and its error policy; it
hands :class:`GpuReadings` the pynvml module object (this module never imports pynvml) and the
two callbacks that apply that policy, so a reading here only says what to call and how to
name the answer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from structlog.typing import FilteringBoundLogger

from agent.series import Observation, labels_from

__all__ = ["Gpu", "GpuReadings", "NvmlCall", "dcgm_labels"]

_MIB = 1024 * 1024
#: NVML's scope id for "all NVLinks of the GPU", as DCGM passes it for its bandwidth total.
_ALL_LINKS = 0xFFFFFFFF
#: Simple readings: (metric, field key, pynvml function, argument constant names, scale).
#: Keys name a reading in logs and in ``sre_agent_nvml_errors_total{field}``.
_SCALARS: tuple[tuple[str, str, str, tuple[str, ...], float], ...] = (
    ("DCGM_FI_DEV_GPU_TEMP", "temperature", "nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), 1.0),
    ("DCGM_FI_DEV_POWER_USAGE", "power_usage", "nvmlDeviceGetPowerUsage", (), 0.001),  # mW -> W
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit", "nvmlDeviceGetPowerManagementLimit", (), 0.001),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), 1.0),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock", "nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), 1.0),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_volatile", "nvmlDeviceGetTotalEccErrors",
     ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"), 1.0),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_volatile", "nvmlDeviceGetTotalEccErrors",
     ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"), 1.0),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_sbe_aggregate", "nvmlDeviceGetTotalEccErrors",
     ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"), 1.0),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_dbe_aggregate", "nvmlDeviceGetTotalEccErrors",
     ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"), 1.0),
    # KB/s over NVML's 20 ms sample window (each call blocks that long), as DCGM's fields 200/201.
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "pcie_tx", "nvmlDeviceGetPcieThroughput",
     ("NVML_PCIE_UTIL_TX_BYTES",), 1.0),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "pcie_rx", "nvmlDeviceGetPcieThroughput",
     ("NVML_PCIE_UTIL_RX_BYTES",), 1.0),
)
_ROW_REMAP = (
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_PENDING",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)


@dataclass(eq=False)
class Gpu:
    """One GPU as the source found it at start, and what polling has learnt about it since."""

    index: int
    handle: Any
    uuid: str
    name: str
    pci_bus_id: str
    labels: dict[str, str]
    log: FilteringBoundLogger
    lost: bool = False
    skip: set[str] = field(default_factory=set)  # field keys NVML does not support here
    nvlinks: list[int] | None = None  # discovered on the first poll
    nvlink_prev: tuple[int, int] | None = None  # (KiB tx+rx, NVML timestamp in us)
    last_xid: int = 0
    xids: Counter[int] = field(default_factory=Counter)


def dcgm_labels(index: int, uuid: str, name: str, bus: str, *, hostname: str, hostname_label: str,
                driver: str) -> dict[str, str]:
    """dcgm-exporter's labels for one GPU (``hostname_label``: released versions say ``Hostname``,
    its main branch ``hostname``); an unknown hostname or driver version is left out."""
    labels = {"gpu": str(index), "UUID": uuid, "pci_bus_id": bus, "device": f"nvidia{index}",
              "modelName": name}
    if hostname:
        labels[hostname_label] = hostname
    if driver:
        labels["DCGM_FI_DRIVER_VERSION"] = driver
    return labels


class NvmlCall(Protocol):
    """One NVML call for one GPU under the source's error policy: the result, or None when the
    reading is unsupported there or failed (counted); raises when the GPU is lost."""

    def __call__(self, gpu: Gpu, key: str, func: str, *args: Any, **kwargs: Any) -> Any: ...


class GpuReadings:
    """Reads every series of one GPU per poll; built by the source once NVML is up."""

    def __init__(
        self,
        nvml: Any,
        *,
        call: NvmlCall,
        on_error: Callable[[Gpu, str, BaseException], None],
        no_link: tuple[type[BaseException], ...],
        proc_root: Path,
        max_processes: int,
    ) -> None:
        # on_error: the source's reaction to an NVML error it did not catch itself (skip the
        # reading, count it, or raise for a lost GPU); no_link: what probing past the last
        # NVLink raises.
        self._nvml = nvml
        self._call = call
        self._on_error = on_error
        self._no_link = no_link
        self._proc_root = proc_root
        self._max_processes = max_processes
        # The scalar readings this pynvml can name (an older one may lack an argument constant).
        self._scalars: list[tuple[str, str, str, tuple[Any, ...], float]] = [
            (metric, key, func, tuple(getattr(nvml, a) for a in args), scale)
            for metric, key, func, args, scale in _SCALARS
            if all(hasattr(nvml, a) for a in args)
        ]

    def poll(self, gpu: Gpu, now_ms: int, *, xids: bool) -> list[Observation]:
        """One GPU's series; a reading NVML refuses is left out (``call`` reports it)."""
        out: list[Observation] = []

        def put(metric: str, value: float, extra: dict[str, str] | None = None) -> None:
            labels = {**gpu.labels, **extra} if extra else gpu.labels
            out.append(Observation(labels_from(metric, labels), float(value), now_ms))

        nvml = self._nvml
        mem = None
        if hasattr(nvml, "nvmlMemory_v2"):
            mem = self._call(gpu, "memory_v2", "nvmlDeviceGetMemoryInfo", version=nvml.nvmlMemory_v2)
        if mem is None:
            mem = self._call(gpu, "memory", "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            put("DCGM_FI_DEV_FB_TOTAL", mem.total // _MIB)
            put("DCGM_FI_DEV_FB_FREE", mem.free // _MIB)
            put("DCGM_FI_DEV_FB_USED", mem.used // _MIB)
            if getattr(mem, "reserved", None) is not None:
                put("DCGM_FI_DEV_FB_RESERVED", mem.reserved // _MIB)
        util = self._call(gpu, "utilization", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            put("DCGM_FI_DEV_GPU_UTIL", util.gpu)
            put("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory)
        for metric, key, func, args, scale in self._scalars:
            value = self._call(gpu, key, func, *args)
            if value is not None:
                put(metric, value * scale)
        # DCGM 3.3 renamed the field and NVML the call; the bitmask is the same.
        reasons = self._call(gpu, "clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None and "clocks_event_reasons" in gpu.skip:
            reasons = self._call(gpu, "clocks_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        if reasons is not None:
            put("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", reasons)
        rows = self._call(gpu, "remapped_rows", "nvmlDeviceGetRemappedRows")
        if rows is not None:
            for metric, value in zip(_ROW_REMAP, rows, strict=True):
                put(metric, value)
        if xids and "xid_events" not in gpu.skip:
            put("DCGM_FI_DEV_XID_ERRORS", gpu.last_xid)
            for xid, n in sorted(gpu.xids.items()):
                put("sre_agent_gpu_xid_errors_total", n, {"xid": str(xid)})
        self._nvlink(gpu, put, now_ms)
        self._processes(gpu, put)
        return out

    def _nvlink(self, gpu: Gpu, put: Callable[..., None], now_ms: int) -> None:
        nvml = self._nvml
        probing = gpu.nvlinks is None  # try every possible link until one poll answers cleanly
        if "nvlink_state" not in gpu.skip:
            found: list[int] = []
            for link in range(nvml.NVML_NVLINK_MAX_LINKS) if gpu.nvlinks is None else gpu.nvlinks:
                try:
                    state = nvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
                except Exception as exc:
                    if probing and isinstance(exc, self._no_link):
                        continue  # no such link on this GPU
                    self._on_error(gpu, "nvlink_state", exc)
                    probing = False  # an error is not an answer: probe again next poll
                    continue
                up = 1.0 if state == nvml.NVML_FEATURE_ENABLED else 0.0
                put("sre_agent_gpu_nvlink_up", up, {"link": str(link)})
                found.append(link)
            if probing:
                gpu.nvlinks = found
                gpu.log.debug("nvml_nvlinks", links=len(found))
        if not gpu.nvlinks or "nvlink_bandwidth" in gpu.skip:
            return
        ids = [(nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_LINKS),
               (nvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_LINKS)]
        values = self._call(gpu, "nvlink_bandwidth", "nvmlDeviceGetFieldValues", ids)
        if values is None:
            return
        total, stamp = 0, 0
        for fv in values:
            if fv.nvmlReturn != nvml.NVML_SUCCESS:
                self._on_error(gpu, "nvlink_bandwidth", nvml.NVMLError(fv.nvmlReturn))
                return
            total += int(fv.value.ullVal)
            stamp = max(stamp, int(fv.timestamp))
        stamp = stamp or now_ms * 1000
        prev, gpu.nvlink_prev = gpu.nvlink_prev, (total, stamp)
        rate = 0.0  # DCGM's rule: first reading 0, then KiB delta / seconds / 1000 ("MB/s")
        if prev is not None and stamp > prev[1] and total >= prev[0]:
            rate = (total - prev[0]) / ((stamp - prev[1]) / 1e6) / 1000.0
        put("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", rate)

    def _processes(self, gpu: Gpu, put: Callable[..., None]) -> None:
        procs = self._call(gpu, "processes", "nvmlDeviceGetComputeRunningProcesses")
        if procs is None:
            return
        put("sre_agent_gpu_processes", len(procs))
        known = [p for p in procs if p.usedGpuMemory is not None]  # None: not visible (MIG, WDDM)
        for proc in sorted(known, key=lambda p: int(p.usedGpuMemory), reverse=True)[: self._max_processes]:
            labels = {"pid": str(proc.pid), "process_name": self._comm(int(proc.pid))}
            put("sre_agent_gpu_process_memory_bytes", int(proc.usedGpuMemory), labels)

    def _comm(self, pid: int) -> str:
        try:
            name = (self._proc_root / str(pid) / "comm").read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "unknown"
        return name.strip() or "unknown"
