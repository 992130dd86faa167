"""NVML poller: local NVIDIA GPUs exported under dcgm-exporter's metric names and labels.

Why: the project's rules and dashboards are written against dcgm-exporter
(``DCGM_FI_DEV_FB_USED`` in MiB, ``DCGM_FI_DEV_POWER_USAGE`` in W, labels ``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
``DCGM_FI_DRIVER_VERSION``). A node that runs only this agent feeds them the same series,
so one rule set serves both setups (DESIGN.md decision 6). Readings dcgm-exporter has no
name for carry the ``sre_agent_`` prefix.

This is the only module that touches ``pynvml`` (nvidia-ml-py), imported lazily in
:meth:`NvmlSource.start`; tests pass ``tests/fake_pynvml.py`` instead.

Degradation follows NVML's documented errors:

* library missing, driver not loaded, pynvml not importable: the source is *unavailable*
  (``reason`` says why, one warning) and a poll yields only ``sre_agent_nvml_up 0``;
* ``NotSupported`` (or a function the driver lacks): that reading is skipped on that GPU
  from then on, one debug line;
* ``GpuIsLost``: the GPU is marked lost (``sre_agent_gpu_lost 1``, one warning) and skipped;
* anything else: ``sre_agent_nvml_errors_total{field,error}`` goes up and the poll goes on.

:meth:`NvmlSource.poll` never raises. Process names come from ``<proc_root>/<pid>/comm``;
NVML reports host PIDs, so in a container give the host's ``/proc`` (or use hostPID).
"""

from __future__ import annotations

import ctypes
import importlib
import threading
import time
import types
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

from agent.series import Sample, labels_from

__all__ = ["NvmlSource"]

_MIB = 1024 * 1024
#: NVML's scope id for "all NVLinks of the GPU", as DCGM passes it for its bandwidth total.
_ALL_LINKS = 0xFFFFFFFF
#: Events drained per poll; a storm beyond this waits for the next poll instead of stalling it.
_MAX_EVENTS_PER_POLL = 256

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


class _Lost(Exception):
    """NVML said GPU_IS_LOST while polling one GPU; unwinds that GPU's poll only."""


@dataclass(frozen=True)
class _Errors:
    """The pynvml error classes this module reacts to (an older pynvml may lack one)."""

    lost: tuple[type[BaseException], ...] = ()
    absent: tuple[type[BaseException], ...] = ()  # unsupported here: skip, do not retry
    no_link: tuple[type[BaseException], ...] = ()  # what probing past the last NVLink raises
    timeout: tuple[type[BaseException], ...] = ()

    @classmethod
    def of(cls, nvml: Any) -> _Errors:
        absent = _classes(nvml, "NVMLError_NotSupported", "NVMLError_FunctionNotFound",
                          "NVMLLibraryMismatchError")
        return cls(lost=_classes(nvml, "NVMLError_GpuIsLost"), absent=absent,
                   no_link=absent + _classes(nvml, "NVMLError_InvalidArgument"),
                   timeout=_classes(nvml, "NVMLError_Timeout"))


@dataclass(eq=False)
class _Gpu:
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


class NvmlSource:
    """Polls NVML for every local GPU; blocking, so the daemon runs :meth:`poll` in a thread."""

    def __init__(
        self,
        *,
        nvml: types.ModuleType | None = None,
        hostname: str,
        proc_root: Path = Path("/proc"),
        logger: FilteringBoundLogger | None = None,
        hostname_label: str = "Hostname",
        max_processes: int = 16,
    ) -> None:
        # hostname_label: released dcgm-exporters say "Hostname", its main branch "hostname".
        # max_processes: per GPU, largest first; every PID is a new series.
        self._module = nvml
        self._nvml: Any = None
        self._hostname = hostname
        self._hostname_label = hostname_label
        self._proc_root = proc_root
        self._max_processes = max_processes
        self._log: FilteringBoundLogger = logger if logger is not None else structlog.get_logger(__name__)
        self._lock = threading.Lock()
        self._gpus: list[_Gpu] = []
        self._by_handle: dict[object, _Gpu] = {}
        self._scalars: list[tuple[str, str, str, tuple[Any, ...], float]] = []
        self._event_set: Any = None
        self._xid_mask = 0
        self._initialized = False
        self._available = False
        self._reason = "not started"
        self._warned_reason = ""
        self._errors: Counter[tuple[str, str]] = Counter()
        self._logged_failures: set[str] = set()
        self._err = _Errors()

    @property
    def available(self) -> bool:
        return self._available

    @property
    def reason(self) -> str:
        """Why the source is unavailable (empty while available), for /api and logs."""
        return self._reason

    def start(self) -> bool:
        """Initialise NVML, enumerate GPUs, watch XIDs. False (with :attr:`reason`) if unavailable."""
        with self._lock:
            if self._available:
                return True
            try:
                nvml = self._module if self._module is not None else importlib.import_module("pynvml")
            except ImportError as exc:
                return self._unavailable("pynvml (nvidia-ml-py) is not importable", exc)
            self._nvml = nvml
            self._err = _Errors.of(nvml)
            try:
                nvml.nvmlInit()
            except Exception as exc:
                if isinstance(exc, _classes(nvml, "NVMLError_LibraryNotFound")):
                    why = "NVML library (libnvidia-ml.so.1) not found; no NVIDIA driver on this host"
                elif isinstance(exc, _classes(nvml, "NVMLError_DriverNotLoaded")):
                    why = "NVIDIA kernel driver not loaded"
                else:
                    why = "nvmlInit failed"
                return self._unavailable(why, exc)
            self._initialized = True
            try:
                count = int(nvml.nvmlDeviceGetCount())
                driver = _text(_quiet(nvml.nvmlSystemGetDriverVersion))
                self._scalars = [
                    (metric, key, func, tuple(getattr(nvml, a) for a in args), scale)
                    for metric, key, func, args, scale in _SCALARS
                    if all(hasattr(nvml, a) for a in args)
                ]
                self._gpus, self._by_handle = [], {}
                for index in range(count):
                    self._enumerate(index, driver)
                self._watch_xids()
            except Exception as exc:
                self._close()
                return self._unavailable("enumerating GPUs failed", exc)
            self._available, self._reason = True, ""
            self._log.info("nvml_started", gpus=len(self._gpus), driver=driver)
            return True

    def poll(self, now_ms: int) -> list[Sample]:
        """Read every GPU once. Never raises; failures become self-metrics."""
        with self._lock:
            if not self._available:
                return [Sample(labels_from("sre_agent_nvml_up"), 0.0, now_ms)]
            started = time.perf_counter()
            out: list[Sample] = []
            try:
                self._drain_events()
                for gpu in self._gpus:
                    if not gpu.lost:
                        try:
                            out.extend(self._poll_gpu(gpu, now_ms))
                        except _Lost:
                            self._mark_lost(gpu)
                    out.append(Sample(labels_from("sre_agent_gpu_lost", gpu.labels), float(gpu.lost), now_ms))
            except Exception as exc:  # a bug here must cost one poll, never the daemon
                self._count("poll", exc)
                if type(exc).__name__ not in self._logged_failures:
                    self._logged_failures.add(type(exc).__name__)
                    self._log.exception("nvml_poll_failed")
            out.append(Sample(labels_from("sre_agent_nvml_up"), 1.0, now_ms))
            for (key, error), n in sorted(self._errors.items()):
                labels = {"field": key, "error": error}
                out.append(Sample(labels_from("sre_agent_nvml_errors_total", labels), float(n), now_ms))
            elapsed = time.perf_counter() - started
            out.append(Sample(labels_from("sre_agent_nvml_poll_duration_seconds"), elapsed, now_ms))
            return out

    def shutdown(self) -> None:
        """Free the event set and shut NVML down; safe twice or when never started."""
        with self._lock:
            self._close()
            if self._available:
                self._available, self._reason = False, "shut down"

    def gpus(self) -> list[dict[str, str]]:
        """The GPUs found at start, for /api and diagnostics."""
        return [
            {"index": str(g.index), "uuid": g.uuid, "name": g.name, "pci_bus_id": g.pci_bus_id,
             "lost": "true" if g.lost else "false"}
            for g in self._gpus
        ]

    # -- start-up -----------------------------------------------------------------------

    def _unavailable(self, why: str, exc: BaseException) -> bool:
        self._available = False
        self._reason = f"{why}: {exc}"
        if self._reason != self._warned_reason:
            self._warned_reason = self._reason
            self._log.warning("nvml_unavailable", reason=why, error=str(exc), error_type=type(exc).__name__)
        return False

    def _enumerate(self, index: int, driver: str) -> None:
        nvml = self._nvml
        log = self._log.bind(gpu=index)
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            if not isinstance(exc, self._err.lost):
                self._count("handle", exc)
                log.warning("gpu_not_accessible", error=str(exc))
                return
            handle = None
        uuid = name = bus = ""
        if handle is not None:  # identity is best effort: a poll finds out whether the GPU works
            uuid = _text(_quiet(nvml.nvmlDeviceGetUUID, handle))
            name = _text(_quiet(nvml.nvmlDeviceGetName, handle))
            bus = _text(getattr(_quiet(nvml.nvmlDeviceGetPciInfo, handle), "busId", ""))
        labels = {"gpu": str(index), "UUID": uuid, "pci_bus_id": bus, "device": f"nvidia{index}",
                  "modelName": name}
        if self._hostname:
            labels[self._hostname_label] = self._hostname
        if driver:
            labels["DCGM_FI_DRIVER_VERSION"] = driver
        gpu = _Gpu(index, handle, uuid, name, bus, labels, log.bind(uuid=uuid))
        if handle is None:
            self._mark_lost(gpu)
        else:
            self._by_handle[_handle_key(handle)] = gpu
        self._gpus.append(gpu)

    def _watch_xids(self) -> None:
        nvml = self._nvml
        self._xid_mask = int(getattr(nvml, "nvmlEventTypeXidCriticalError", 0))
        try:
            self._event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            self._count("xid_events", exc)
            self._log.warning("nvml_xid_events_unavailable", error=str(exc))
            return
        for gpu in (g for g in self._gpus if not g.lost):
            try:
                if not int(nvml.nvmlDeviceGetSupportedEventTypes(gpu.handle)) & self._xid_mask:
                    self._skip(gpu, "xid_events", "XID event type not supported")
                    continue
                nvml.nvmlDeviceRegisterEvents(gpu.handle, self._xid_mask, self._event_set)
            except Exception as exc:
                gpu.skip.add("xid_events")  # not watched: no XID gauge rather than a false 0
                try:
                    self._failed(gpu, "xid_events", exc)
                except _Lost:
                    self._mark_lost(gpu)

    def _close(self) -> None:
        nvml = self._nvml
        if self._event_set is not None:
            _quiet(nvml.nvmlEventSetFree, self._event_set)
            self._event_set = None
        if self._initialized:
            self._initialized = False
            try:
                nvml.nvmlShutdown()
            except Exception as exc:
                self._log.debug("nvml_shutdown_failed", error=str(exc))

    # -- polling ------------------------------------------------------------------------

    def _read(self, gpu: _Gpu, key: str, func: str, *args: Any, **kwargs: Any) -> Any:
        """One NVML call for one GPU; None when unsupported or failed. Raises _Lost."""
        if key in gpu.skip:
            return None
        fn = getattr(self._nvml, func, None)
        if fn is None:
            self._skip(gpu, key, f"{func} missing from pynvml")
            return None
        try:
            return fn(gpu.handle, *args, **kwargs)
        except Exception as exc:
            self._failed(gpu, key, exc)
            return None

    def _failed(self, gpu: _Gpu, key: str, exc: BaseException) -> None:
        if isinstance(exc, self._err.lost):
            raise _Lost from exc
        if isinstance(exc, self._err.absent):
            self._skip(gpu, key, _error_name(exc))
        else:
            self._count(key, exc)

    def _mark_lost(self, gpu: _Gpu) -> None:
        gpu.lost = True
        gpu.log.warning("gpu_lost", action="skipped until the agent restarts; check dmesg for XID 79")

    def _skip(self, gpu: _Gpu, key: str, why: str) -> None:
        gpu.skip.add(key)
        gpu.log.debug("nvml_field_unsupported", field=key, why=why)

    def _count(self, key: str, exc: BaseException) -> None:
        self._errors[(key, _error_name(exc))] += 1

    def _drain_events(self) -> None:
        """Take pending XID events without waiting (timeout 0 -> NVML_ERROR_TIMEOUT if none)."""
        if self._event_set is None:
            return
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                data = self._nvml.nvmlEventSetWait(self._event_set, 0)
            except self._err.timeout:
                return
            except Exception as exc:
                self._count("xid_events", exc)
                return
            gpu = self._by_handle.get(_handle_key(data.device))
            if gpu is not None and int(data.eventType) & self._xid_mask:
                xid = int(data.eventData)
                gpu.last_xid = xid
                gpu.xids[xid] += 1
                gpu.log.warning("gpu_xid_error", xid=xid)

    def _poll_gpu(self, gpu: _Gpu, now_ms: int) -> list[Sample]:
        out: list[Sample] = []

        def put(metric: str, value: float, extra: dict[str, str] | None = None) -> None:
            labels = {**gpu.labels, **extra} if extra else gpu.labels
            out.append(Sample(labels_from(metric, labels), float(value), now_ms))

        nvml = self._nvml
        mem = None
        if hasattr(nvml, "nvmlMemory_v2"):
            mem = self._read(gpu, "memory_v2", "nvmlDeviceGetMemoryInfo", version=nvml.nvmlMemory_v2)
        if mem is None:
            mem = self._read(gpu, "memory", "nvmlDeviceGetMemoryInfo")
        if mem is not None:
            put("DCGM_FI_DEV_FB_TOTAL", mem.total // _MIB)
            put("DCGM_FI_DEV_FB_FREE", mem.free // _MIB)
            put("DCGM_FI_DEV_FB_USED", mem.used // _MIB)
            if getattr(mem, "reserved", None) is not None:
                put("DCGM_FI_DEV_FB_RESERVED", mem.reserved // _MIB)
        util = self._read(gpu, "utilization", "nvmlDeviceGetUtilizationRates")
        if util is not None:
            put("DCGM_FI_DEV_GPU_UTIL", util.gpu)
            put("DCGM_FI_DEV_MEM_COPY_UTIL", util.memory)
        for metric, key, func, args, scale in self._scalars:
            value = self._read(gpu, key, func, *args)
            if value is not None:
                put(metric, value * scale)
        # DCGM 3.3 renamed the field and NVML the call; the bitmask is the same.
        reasons = self._read(gpu, "clocks_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons")
        if reasons is None and "clocks_event_reasons" in gpu.skip:
            reasons = self._read(gpu, "clocks_throttle_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
        if reasons is not None:
            put("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", reasons)
        rows = self._read(gpu, "remapped_rows", "nvmlDeviceGetRemappedRows")
        if rows is not None:
            for metric, value in zip(_ROW_REMAP, rows, strict=True):
                put(metric, value)
        if self._event_set is not None and "xid_events" not in gpu.skip:
            put("DCGM_FI_DEV_XID_ERRORS", gpu.last_xid)
            for xid, n in sorted(gpu.xids.items()):
                put("sre_agent_gpu_xid_errors_total", n, {"xid": str(xid)})
        self._poll_nvlink(gpu, put, now_ms)
        self._poll_processes(gpu, put)
        return out

    def _poll_nvlink(self, gpu: _Gpu, put: Callable[..., None], now_ms: int) -> None:
        nvml = self._nvml
        probing = gpu.nvlinks is None  # try every possible link until one poll answers cleanly
        if "nvlink_state" not in gpu.skip:
            found: list[int] = []
            for link in range(nvml.NVML_NVLINK_MAX_LINKS) if gpu.nvlinks is None else gpu.nvlinks:
                try:
                    state = nvml.nvmlDeviceGetNvLinkState(gpu.handle, link)
                except Exception as exc:
                    if probing and isinstance(exc, self._err.no_link):
                        continue  # no such link on this GPU
                    self._failed(gpu, "nvlink_state", exc)
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
        values = self._read(gpu, "nvlink_bandwidth", "nvmlDeviceGetFieldValues", ids)
        if values is None:
            return
        total, stamp = 0, 0
        for fv in values:
            if fv.nvmlReturn != nvml.NVML_SUCCESS:
                self._failed(gpu, "nvlink_bandwidth", nvml.NVMLError(fv.nvmlReturn))
                return
            total += int(fv.value.ullVal)
            stamp = max(stamp, int(fv.timestamp))
        stamp = stamp or now_ms * 1000
        prev, gpu.nvlink_prev = gpu.nvlink_prev, (total, stamp)
        rate = 0.0  # DCGM's rule: first reading 0, then KiB delta / seconds / 1000 ("MB/s")
        if prev is not None and stamp > prev[1] and total >= prev[0]:
            rate = (total - prev[0]) / ((stamp - prev[1]) / 1e6) / 1000.0
        put("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", rate)

    def _poll_processes(self, gpu: _Gpu, put: Callable[..., None]) -> None:
        procs = self._read(gpu, "processes", "nvmlDeviceGetComputeRunningProcesses")
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


def _classes(nvml: Any, *names: str) -> tuple[type[BaseException], ...]:
    """The named error classes the module defines (an older pynvml may lack one)."""
    found = (getattr(nvml, n, None) for n in names)
    return tuple(c for c in found if isinstance(c, type) and issubclass(c, BaseException))


def _quiet(fn: Callable[..., Any], *args: Any) -> Any:
    """Call for optional identity data at start-up; None on any failure."""
    try:
        return fn(*args)
    except Exception:
        return None


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _error_name(exc: BaseException) -> str:
    """``NVMLError_Unknown`` -> ``Unknown``; the label value of the errors counter."""
    name = type(exc).__name__
    if name == "NVMLError":
        return f"code_{getattr(exc, 'value', 'unknown')}"
    return name.removeprefix("NVMLError_")


def _handle_key(handle: Any) -> object:
    """A device handle's identity: pynvml returns a new pointer object per call."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
