"""NVML poller: local NVIDIA GPUs exported under dcgm-exporter's metric names and labels.

Why: the project's rules and dashboards are written against dcgm-exporter
(``DCGM_FI_DEV_FB_USED`` in MiB, ``DCGM_FI_DEV_POWER_USAGE`` in W, labels ``gpu``,
``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
``DCGM_FI_DRIVER_VERSION``). A node that runs only this agent feeds them the same series,
so one rule set serves both setups (DESIGN.md decision 6). Readings dcgm-exporter has no
name for carry the ``sre_agent_`` prefix.

This module owns NVML's lifecycle (init, GPU enumeration, XID events, shutdown) and the error
policy below; :mod:`agent.collect.dcgm` holds what is read from each GPU and under which
dcgm-exporter name. This is the only module that touches ``pynvml`` (nvidia-ml-py), imported
lazily in :meth:`NvmlSource.start`, and hands the module object on; tests pass
``tests/fake_pynvml.py`` instead.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from structlog.typing import FilteringBoundLogger

from agent.collect.dcgm import Gpu, GpuReadings, dcgm_labels
from agent.series import Observation, labels_from

__all__ = ["NvmlSource"]

#: Events drained per poll; a storm beyond this waits for the next poll instead of stalling it.
_MAX_EVENTS_PER_POLL = 256


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
        self._gpus: list[Gpu] = []
        self._by_handle: dict[object, Gpu] = {}
        self._readings: GpuReadings | None = None
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
                self._readings = GpuReadings(nvml, call=self._read, on_error=self._failed, no_link=self._err.no_link,
                                             proc_root=self._proc_root, max_processes=self._max_processes)
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

    def poll(self, now_ms: int) -> list[Observation]:
        """Read every GPU once. Never raises; failures become self-metrics."""
        with self._lock:
            readings = self._readings
            if not self._available or readings is None:
                return [Observation(labels_from("sre_agent_nvml_up"), 0.0, now_ms)]
            started = time.perf_counter()
            out: list[Observation] = []
            try:
                self._drain_events()
                for gpu in self._gpus:
                    if not gpu.lost:
                        try:
                            out.extend(readings.poll(gpu, now_ms, xids=self._event_set is not None))
                        except _Lost:
                            self._mark_lost(gpu)
                    out.append(Observation(labels_from("sre_agent_gpu_lost", gpu.labels), float(gpu.lost), now_ms))
            except Exception as exc:  # a bug here must cost one poll, never the daemon
                self._count("poll", exc)
                if type(exc).__name__ not in self._logged_failures:
                    self._logged_failures.add(type(exc).__name__)
                    self._log.exception("nvml_poll_failed")
            out.append(Observation(labels_from("sre_agent_nvml_up"), 1.0, now_ms))
            for (key, error), n in sorted(self._errors.items()):
                labels = {"field": key, "error": error}
                out.append(Observation(labels_from("sre_agent_nvml_errors_total", labels), float(n), now_ms))
            elapsed = time.perf_counter() - started
            out.append(Observation(labels_from("sre_agent_nvml_poll_duration_seconds"), elapsed, now_ms))
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
        labels = dcgm_labels(index, uuid, name, bus, hostname=self._hostname, hostname_label=self._hostname_label,
                             driver=driver)
        gpu = Gpu(index, handle, uuid, name, bus, labels, log.bind(uuid=uuid))
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

    def _read(self, gpu: Gpu, key: str, func: str, *args: Any, **kwargs: Any) -> Any:
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

    def _failed(self, gpu: Gpu, key: str, exc: BaseException) -> None:
        if isinstance(exc, self._err.lost):
            raise _Lost from exc
        if isinstance(exc, self._err.absent):
            self._skip(gpu, key, _error_name(exc))
        else:
            self._count(key, exc)

    def _mark_lost(self, gpu: Gpu) -> None:
        gpu.lost = True
        gpu.log.warning("gpu_lost", action="skipped until the agent restarts; check dmesg for XID 79")

    def _skip(self, gpu: Gpu, key: str, why: str) -> None:
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
