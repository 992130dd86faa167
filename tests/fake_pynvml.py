"""A stand-in for nvidia-ml-py's ``pynvml`` module, so the NVML poller is tested without a GPU.

It has the real module's function names and parameter names, constants, ctypes structures
and error classes (``NVMLError`` with ``.value``, one ``NVMLError_<Name>`` subclass per
``NVML_ERROR_*`` code, ``NVMLError(code)`` returning the subclass). ``test_nvml.py`` checks
every public name here against the installed ``pynvml``, so the fake cannot drift.

It reproduces NVML's documented behaviour: a call before ``nvmlInit`` (or after the last
``nvmlShutdown``) raises ``NVMLError_Uninitialized``; ``nvmlEventSetWait`` with nothing
pending raises ``NVMLError_Timeout`` (the fake never sleeps; it records the timeout asked
for); an unsupported reading raises ``NVMLError_NotSupported``; a lost GPU raises
``NVMLError_GpuIsLost`` on every call; ``nvmlInit`` raises ``NVMLError_LibraryNotFound``
or ``NVMLError_DriverNotLoaded`` on a host without the library or the driver.

Use::

    fake = FakeNvml([FakeGpu(), FakeGpu(name="NVIDIA A100-SXM4-80GB")])
    source = NvmlSource(nvml=fake.module, hostname="node-1")
"""

from __future__ import annotations

import ctypes
import inspect
import sys
import types
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

# -- constants (names and values as in nvml.h / pynvml) ---------------------------------

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX = 138  # KiB, cumulative
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX = 139
NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE = 32
NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE = 16
nvmlMemory_v2 = 0x02000028
nvmlEventTypeNone = 0
nvmlEventTypeSingleBitEccError = 0x1
nvmlEventTypeDoubleBitEccError = 0x2
nvmlEventTypeXidCriticalError = 0x8
nvmlClocksEventReasonGpuIdle = 0x1
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonHwSlowdown = 0x8
nvmlClocksEventReasonSwThermalSlowdown = 0x20


# -- errors -------------------------------------------------------------------------------

class NVMLError(Exception):
    """Base of every NVML error; ``NVMLError(code)`` returns the subclass for that code."""

    _code = NVML_ERROR_UNKNOWN
    value: int

    def __new__(cls, value: int | None = None) -> NVMLError:
        if cls is NVMLError and value in _ERROR_CLASSES:
            cls = _ERROR_CLASSES[value]
        err = Exception.__new__(cls)
        err.value = cls._code if cls is not NVMLError or value is None else value
        return err

    def __init__(self, value: int | None = None) -> None:
        super().__init__(self.value)

    def __str__(self) -> str:
        return f"NVML error {self.value} ({type(self).__name__})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


class NVMLLibraryMismatchError(Exception):
    """pynvml raises this when an unversioned function is missing from the driver's library."""


_ERROR_CLASSES: dict[int, type[NVMLError]] = {}


def _error_class_name(constant: str) -> str:
    """``NVML_ERROR_GPU_IS_LOST`` -> ``NVMLError_GpuIsLost`` (pynvml's naming rule)."""
    words = constant.removeprefix("NVML_ERROR_").split("_")
    return "NVMLError_" + "".join(w.capitalize() for w in words)


for _name, _value in list(globals().items()):
    if _name.startswith("NVML_ERROR_"):
        _cls = type(_error_class_name(_name), (NVMLError,), {"_code": _value, "__module__": __name__})
        _ERROR_CLASSES[_value] = _cls
        globals()[_cls.__name__] = _cls


def _err(code: int) -> NVMLError:
    return NVMLError(code)


# -- structures (same field names and C types as pynvml's) --------------------------------

class struct_c_nvmlDevice_t(ctypes.Structure):  # opaque, like the real handle
    pass


c_nvmlDevice_t = ctypes.POINTER(struct_c_nvmlDevice_t)


class struct_c_nvmlEventSet_t(ctypes.Structure):
    pass


c_nvmlEventSet_t = ctypes.POINTER(struct_c_nvmlEventSet_t)


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class c_nvmlMemory_v2_t(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("total", ctypes.c_ulonglong),
        ("reserved", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


class c_nvmlUtilization_t(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [
        ("busIdLegacy", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE),
        ("domain", ctypes.c_uint),
        ("bus", ctypes.c_uint),
        ("device", ctypes.c_uint),
        ("pciDeviceId", ctypes.c_uint),
        ("pciSubSystemId", ctypes.c_uint),
        ("busId", ctypes.c_char * NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE),
    ]


class c_nvmlValue_t(ctypes.Union):
    _fields_ = [
        ("dVal", ctypes.c_double),
        ("uiVal", ctypes.c_uint),
        ("ulVal", ctypes.c_ulong),
        ("ullVal", ctypes.c_ulonglong),
        ("sllVal", ctypes.c_longlong),
        ("siVal", ctypes.c_int),
        ("usVal", ctypes.c_ushort),
    ]


class c_nvmlFieldValue_t(ctypes.Structure):
    _fields_ = [
        ("fieldId", ctypes.c_uint32),
        ("scopeId", ctypes.c_uint32),
        ("timestamp", ctypes.c_int64),
        ("latencyUsec", ctypes.c_int64),
        ("valueType", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", c_nvmlValue_t),
    ]


class c_nvmlEventData_t(ctypes.Structure):
    _fields_ = [
        ("device", c_nvmlDevice_t),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class nvmlFriendlyObject:
    """What pynvml returns for process lists: a plain object with the struct's fields."""

    def __init__(self, dictionary: dict[str, Any]) -> None:
        for key, value in dictionary.items():
            setattr(self, key, value)


# -- the configurable fake ----------------------------------------------------------------

GIB = 1024**3
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId outside MIG


@dataclass
class FakeGpu:
    """One simulated GPU. Raw NVML units: bytes, mW, MHz, C, %, KB/s, KiB."""

    name: str = "NVIDIA H200"
    uuid: str = ""  # "" -> derived from the index
    pci_bus_id: str = ""
    memory_total: int = 150_754_820_096  # an H200's 143,771 MiB
    memory_reserved: int = 512 * 1024 * 1024
    memory_used: int = 100 * GIB
    util_gpu: int = 87
    util_memory: int = 45
    temperature: int = 61
    power_mw: int = 512_345
    power_limit_mw: int = 700_000
    sm_clock: int = 1980
    mem_clock: int = 3201
    clock_event_reasons: int = nvmlClocksEventReasonSwPowerCap
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter type)
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failed
    nvlink_states: list[int] = field(default_factory=lambda: [NVML_FEATURE_ENABLED] * 18)
    nvlink_tx_kib: int = 0
    nvlink_rx_kib: int = 0
    pcie_tx_kbs: int = 1200
    pcie_rx_kbs: int = 3400
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, bytes)
    supported_events: int = nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError
    unsupported: set[str] = field(default_factory=set)  # function names raising NotSupported
    errors: dict[str, int] = field(default_factory=dict)  # function name -> NVML error code
    lost: bool = False


class FakeNvml:
    """The fake's state; :attr:`module` is what ``NvmlSource(nvml=...)`` takes."""

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        library_missing: bool = False,
        driver_not_loaded: bool = False,
        driver_version: str = "550.127.05",
        memory_v2: bool = True,
        clocks_event_api: bool = True,
    ) -> None:
        self.gpus = [FakeGpu() for _ in range(2)] if gpus is None else gpus
        for i, gpu in enumerate(self.gpus):
            gpu.uuid = gpu.uuid or f"GPU-{i:08x}-0000-4000-8000-00000000000{i}"
            gpu.pci_bus_id = gpu.pci_bus_id or f"00000000:{0x18 + 0x20 * i:02X}:00.0"
        self.library_missing = library_missing
        self.driver_not_loaded = driver_not_loaded
        self.driver_version = driver_version
        self.memory_v2 = memory_v2  # False: a driver older than nvmlDeviceGetMemoryInfo_v2
        self.clocks_event_api = clocks_event_api  # False: a driver older than the r535 rename
        self.fail_all: int | BaseException | None = None  # every call raises this, init aside
        self.time_us = 1_700_000_000_000_000  # what field values carry as their timestamp
        self.initialized = 0  # NVML's init refcount
        self.calls: Counter[tuple[str, int]] = Counter()  # (function, GPU index or -1)
        self.wait_timeouts: list[int] = []
        self._events: deque[tuple[int, int, int]] = deque()  # (GPU index, event type, data)
        self._registered: dict[int, int] = {}  # GPU index -> event mask
        self._structs = [struct_c_nvmlDevice_t() for _ in self.gpus]
        self._by_address = {ctypes.addressof(s): i for i, s in enumerate(self._structs)}
        self._event_sets: list[struct_c_nvmlEventSet_t] = []
        self.module = self._build_module()

    # test controls
    def queue_xid(self, index: int, xid: int) -> None:
        """Make the driver report XID ``xid`` on GPU ``index``."""
        self._events.append((index, nvmlEventTypeXidCriticalError, xid))

    def device_calls(self, function: str, index: int) -> int:
        return self.calls[(function, index)]

    def _build_module(self) -> types.ModuleType:
        module = types.ModuleType("fake_pynvml_instance", "A per-test fake of pynvml.")
        for name, value in vars(sys.modules[__name__]).items():
            if is_api_name(name):
                setattr(module, name, value)
        for name, method in inspect.getmembers(self, inspect.ismethod):
            if name.startswith("nvml"):
                setattr(module, name, method)
        return module

    # plumbing shared by every call
    def _enter(self, function: str, index: int = -1) -> None:
        self.calls[(function, index)] += 1
        if self.initialized <= 0:
            raise _err(NVML_ERROR_UNINITIALIZED)
        if isinstance(self.fail_all, BaseException):
            raise self.fail_all
        if self.fail_all is not None:
            raise _err(self.fail_all)

    def _gpu(self, function: str, handle: Any) -> FakeGpu:
        try:
            index = self._by_address[ctypes.cast(handle, ctypes.c_void_p).value or 0]
        except (KeyError, TypeError, ctypes.ArgumentError):
            self._enter(function)
            raise _err(NVML_ERROR_INVALID_ARGUMENT) from None
        self._enter(function, index)
        gpu = self.gpus[index]
        if gpu.lost:
            raise _err(NVML_ERROR_GPU_IS_LOST)
        if function in gpu.unsupported:
            raise _err(NVML_ERROR_NOT_SUPPORTED)
        if function in gpu.errors:
            raise _err(gpu.errors[function])
        return gpu

    def _handle(self, index: int) -> Any:
        return ctypes.pointer(self._structs[index])  # a new pointer object per call, as in pynvml

    # -- the pynvml API ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.calls[("nvmlInit", -1)] += 1
        if self.library_missing:
            raise _err(NVML_ERROR_LIBRARY_NOT_FOUND)
        if self.driver_not_loaded:
            raise _err(NVML_ERROR_DRIVER_NOT_LOADED)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise _err(NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _err(NVML_ERROR_GPU_IS_LOST)
        return self._handle(index)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._gpu("nvmlDeviceGetIndex", handle)
        return self._by_address[ctypes.cast(handle, ctypes.c_void_p).value or 0]

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> nvmlPciInfo_t:
        bus = self._gpu("nvmlDeviceGetPciInfo", handle).pci_bus_id
        info = nvmlPciInfo_t()
        info.busId = bus.encode()
        info.busIdLegacy = bus[-12:].encode()
        info.bus = int(bus.split(":")[1], 16)
        return info

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        free = gpu.memory_total - gpu.memory_reserved - gpu.memory_used
        if not version:  # v1 counts the driver's reservation as used
            return c_nvmlMemory_t(gpu.memory_total, free, gpu.memory_used + gpu.memory_reserved)
        if not self.memory_v2:
            raise _err(NVML_ERROR_FUNCTION_NOT_FOUND)
        return c_nvmlMemory_v2_t(version, gpu.memory_total, gpu.memory_reserved, free, gpu.memory_used)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> c_nvmlUtilization_t:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return c_nvmlUtilization_t(gpu.util_gpu, gpu.util_memory)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise _err(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        clocks = {NVML_CLOCK_SM: gpu.sm_clock, NVML_CLOCK_GRAPHICS: gpu.sm_clock,
                  NVML_CLOCK_MEM: gpu.mem_clock}
        if type not in clocks:
            raise _err(NVML_ERROR_INVALID_ARGUMENT)
        return clocks[type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle)
        if not self.clocks_event_api:
            raise _err(NVML_ERROR_FUNCTION_NOT_FOUND)
        return gpu.clock_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clock_event_reasons

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        return self._gpu("nvmlDeviceGetTotalEccErrors", handle).ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", device).remapped_rows

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        gpu = self._gpu("nvmlDeviceGetNvLinkState", device)
        if not gpu.nvlink_states:
            raise _err(NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlink_states):
            raise _err(NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlink_states[link]

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        values = (c_nvmlFieldValue_t * len(fieldIds))()
        counters = {NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: gpu.nvlink_tx_kib,
                    NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: gpu.nvlink_rx_kib}
        for fv, wanted in zip(values, fieldIds, strict=True):
            fv.fieldId, fv.scopeId = wanted if isinstance(wanted, tuple) else (wanted, 0)
            if fv.fieldId not in counters or not gpu.nvlink_states:
                fv.nvmlReturn = NVML_ERROR_NOT_SUPPORTED  # per-field status; the call itself succeeds
                continue
            fv.timestamp = self.time_us
            fv.valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            fv.value.ullVal = counters[fv.fieldId]
        return values

    def nvmlDeviceGetPcieThroughput(self, device: Any, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", device)
        return gpu.pcie_tx_kbs if counter == NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kbs

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[nvmlFriendlyObject]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            nvmlFriendlyObject({"pid": pid, "usedGpuMemory": used, "gpuInstanceId": _NO_INSTANCE,
                                "computeInstanceId": _NO_INSTANCE})
            for pid, used in gpu.processes
        ]

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        self._event_sets.append(struct_c_nvmlEventSet_t())
        return ctypes.pointer(self._event_sets[-1])

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if eventTypes & ~gpu.supported_events:
            raise _err(NVML_ERROR_NOT_SUPPORTED)
        index = self.gpus.index(gpu)
        self._registered[index] = self._registered.get(index, 0) | eventTypes

    def nvmlEventSetWait(self, eventSet: Any, timeoutms: int) -> c_nvmlEventData_t:
        self._enter("nvmlEventSetWait")
        self.wait_timeouts.append(timeoutms)
        while self._events:
            index, kind, data = self._events.popleft()
            if self._registered.get(index, 0) & kind:
                return c_nvmlEventData_t(self._handle(index), kind, data, _NO_INSTANCE, _NO_INSTANCE)
        raise _err(NVML_ERROR_TIMEOUT)  # nothing pending within timeoutms (the fake never waits)

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")


def is_api_name(name: str) -> bool:
    """The names that mirror pynvml (everything else here is test machinery)."""
    return name.startswith(("NVML", "nvml", "c_nvml", "struct_c_nvml"))
