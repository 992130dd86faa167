"""Tests for agent.collect.nvml: dcgm-exporter names/labels/units and NVML's failure modes, on a fake pynvml."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import pytest
import structlog

from agent.collect.nvml import NvmlSource
from agent.series import Observation, labels_get
from tests import fake_pynvml as fk
from tests.fake_pynvml import GIB, FakeGpu, FakeNvml, NVMLError, is_api_name

MIB = 1024 * 1024
NOW = 1_700_000_000_000


def _source(fake: FakeNvml, proc_root: Path = Path("/nonexistent"), **kwargs: object) -> NvmlSource:
    return NvmlSource(nvml=fake.module, hostname="node-1", proc_root=proc_root, **kwargs)  # type: ignore[arg-type]


def _find(samples: list[Observation], name: str, **labels: str) -> list[Observation]:
    return [
        s for s in samples if s.name == name and all(labels_get(s.labels, k) == v for k, v in labels.items())
    ]


def _value(samples: list[Observation], name: str, **labels: str) -> float:
    found = _find(samples, name, **labels)
    assert len(found) == 1, (name, labels, found)
    return found[0].value


def _started(fake: FakeNvml, **kwargs: object) -> NvmlSource:
    source = _source(fake, **kwargs)  # type: ignore[arg-type]
    assert source.start() is True
    return source


def test_two_gpu_box_exports_dcgm_names_labels_and_units() -> None:
    """Two GPUs export dcgm-exporter names with its label set, in MiB, W, C, MHz and %."""
    a100 = FakeGpu(name="NVIDIA A100-SXM4-80GB", memory_total=80 * GIB, memory_reserved=0, memory_used=GIB,
                   power_mw=250_500, remapped_rows=(3, 1, 1, 0),
                   ecc={(fk.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, fk.NVML_AGGREGATE_ECC): 2})
    fake = FakeNvml([FakeGpu(), a100])
    samples = _started(fake).poll(NOW)

    assert {s.timestamp_ms for s in samples} == {NOW}
    used = _find(samples, "DCGM_FI_DEV_FB_USED", gpu="0")[0]
    assert dict(used.labels) == {
        "__name__": "DCGM_FI_DEV_FB_USED", "gpu": "0", "UUID": fake.gpus[0].uuid,
        "pci_bus_id": "00000000:18:00.0", "device": "nvidia0", "modelName": "NVIDIA H200",
        "Hostname": "node-1", "DCGM_FI_DRIVER_VERSION": "550.127.05",
    }
    assert used.value == 100 * 1024  # MiB, as NVML v2 reports used (reserved excluded)
    assert _value(samples, "DCGM_FI_DEV_FB_TOTAL", gpu="0") == 143_771
    assert _value(samples, "DCGM_FI_DEV_FB_RESERVED", gpu="0") == 512
    assert _value(samples, "DCGM_FI_DEV_FB_FREE", gpu="0") == 143_771 - 512 - 100 * 1024
    assert _value(samples, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == pytest.approx(512.345)
    assert _value(samples, "DCGM_FI_DEV_POWER_MGMT_LIMIT", gpu="0") == 700.0
    assert _value(samples, "DCGM_FI_DEV_GPU_TEMP", gpu="0") == 61
    assert _value(samples, "DCGM_FI_DEV_SM_CLOCK", gpu="0") == 1980
    assert _value(samples, "DCGM_FI_DEV_MEM_CLOCK", gpu="0") == 3201
    assert _value(samples, "DCGM_FI_DEV_GPU_UTIL", gpu="0") == 87
    assert _value(samples, "DCGM_FI_DEV_MEM_COPY_UTIL", gpu="0") == 45
    assert _value(samples, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", gpu="0") == fk.nvmlClocksEventReasonSwPowerCap
    assert _value(samples, "DCGM_FI_DEV_PCIE_TX_THROUGHPUT", gpu="0") == 1200
    assert _value(samples, "DCGM_FI_DEV_PCIE_RX_THROUGHPUT", gpu="0") == 3400
    assert _value(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0
    assert _value(samples, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", gpu="0") == 0  # DCGM: first reading 0
    assert len(_find(samples, "sre_agent_gpu_nvlink_up", gpu="0")) == 18
    assert _value(samples, "sre_agent_gpu_nvlink_up", gpu="0", link="17") == 1

    assert _value(samples, "DCGM_FI_DEV_FB_USED", gpu="1", modelName="NVIDIA A100-SXM4-80GB") == 1024
    assert _value(samples, "DCGM_FI_DEV_POWER_USAGE", gpu="1") == pytest.approx(250.5)
    assert _value(samples, "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", gpu="1") == 2
    assert _value(samples, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", gpu="1") == 0
    assert _value(samples, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", gpu="1") == 3
    assert _value(samples, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", gpu="1") == 1
    assert _value(samples, "DCGM_FI_DEV_ROW_REMAP_PENDING", gpu="1") == 1
    assert _value(samples, "DCGM_FI_DEV_ROW_REMAP_FAILURE", gpu="1") == 0

    assert _value(samples, "sre_agent_nvml_up") == 1
    assert [s.value for s in _find(samples, "sre_agent_gpu_lost")] == [0, 0]
    assert not _find(samples, "sre_agent_nvml_errors_total")


def test_hostname_label_name_is_configurable() -> None:
    """The hostname label can follow dcgm-exporter's newer lowercase spelling."""
    samples = _started(FakeNvml([FakeGpu()]), hostname_label="hostname").poll(NOW)
    labels = dict(_find(samples, "DCGM_FI_DEV_GPU_TEMP")[0].labels)
    assert labels["hostname"] == "node-1" and "Hostname" not in labels


def test_nvlink_bandwidth_is_dcgm_rate_from_cumulative_counters() -> None:
    """NVLink bandwidth is (tx+rx KiB delta) / seconds / 1000, as DCGM computes its total."""
    fake = FakeNvml([FakeGpu(nvlink_states=[1, 0, 1])])
    source = _started(fake)
    first = source.poll(NOW)
    assert [s.value for s in _find(first, "sre_agent_gpu_nvlink_up")] == [1, 0, 1]
    fake.gpus[0].nvlink_tx_kib += 4_000_000
    fake.gpus[0].nvlink_rx_kib += 2_000_000
    fake.time_us += 2_000_000
    second = source.poll(NOW + 2000)
    assert _value(second, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == pytest.approx(3000.0)
    # the first poll probes every possible link once; later polls ask only the three that exist
    assert fake.device_calls("nvmlDeviceGetNvLinkState", 0) == fk.NVML_NVLINK_MAX_LINKS + 3


def test_gpu_without_nvlink_exports_no_nvlink_series() -> None:
    """A PCIe-only GPU has no NVLink series and is not probed again."""
    fake = FakeNvml([FakeGpu(nvlink_states=[])])
    source = _started(fake)
    source.poll(NOW)
    samples = source.poll(NOW + 1000)
    assert not _find(samples, "sre_agent_gpu_nvlink_up")
    assert not _find(samples, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")
    assert fake.device_calls("nvmlDeviceGetNvLinkState", 0) == fk.NVML_NVLINK_MAX_LINKS


def test_library_missing_makes_source_unavailable_without_raising() -> None:
    """No libnvidia-ml: start() is False with a reason, one warning, polls give nvml_up 0 only."""
    with structlog.testing.capture_logs() as logs:
        source = _source(FakeNvml(library_missing=True))
        assert source.start() is False
        first, second = source.poll(NOW), source.poll(NOW + 1000)
    assert not source.available
    assert "not found" in source.reason
    assert [(s.name, s.value) for s in first] == [("sre_agent_nvml_up", 0.0)]
    assert [(s.name, s.value) for s in second] == [("sre_agent_nvml_up", 0.0)]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["nvml_unavailable"]


def test_driver_not_loaded_makes_source_unavailable() -> None:
    """A host with the library but no kernel driver is unavailable with that reason."""
    source = _source(FakeNvml(driver_not_loaded=True))
    assert source.start() is False
    assert "driver not loaded" in source.reason
    assert [(s.name, s.value) for s in source.poll(NOW)] == [("sre_agent_nvml_up", 0.0)]


def test_pynvml_not_importable_makes_source_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without nvidia-ml-py installed, the lazy import fails into 'unavailable', not an exception."""
    monkeypatch.setitem(sys.modules, "pynvml", None)
    source = NvmlSource(hostname="node-1")
    assert source.start() is False
    assert "not importable" in source.reason
    assert [s.value for s in source.poll(NOW)] == [0.0]
    source.shutdown()


def test_poll_before_start_reports_down() -> None:
    """A source that was never started reports nvml_up 0 and says why."""
    source = _source(FakeNvml())
    assert [s.value for s in source.poll(NOW)] == [0.0]
    assert source.reason == "not started"


def test_not_supported_field_is_skipped_on_that_gpu_only_and_not_retried() -> None:
    """NotSupported on one GPU drops that reading there, keeps it elsewhere, and is not retried."""
    fake = FakeNvml([FakeGpu(), FakeGpu(unsupported={"nvmlDeviceGetPowerUsage"})])
    with structlog.testing.capture_logs() as logs:
        source = _started(fake)
        source.poll(NOW)
        samples = source.poll(NOW + 1000)
    assert _value(samples, "DCGM_FI_DEV_POWER_USAGE", gpu="0") > 0
    assert not _find(samples, "DCGM_FI_DEV_POWER_USAGE", gpu="1")
    assert _value(samples, "DCGM_FI_DEV_GPU_TEMP", gpu="1") == 61
    assert fake.device_calls("nvmlDeviceGetPowerUsage", 0) == 2
    assert fake.device_calls("nvmlDeviceGetPowerUsage", 1) == 1
    assert not _find(samples, "sre_agent_nvml_errors_total")
    skipped = [e for e in logs if e["event"] == "nvml_field_unsupported" and e["field"] == "power_usage"]
    assert len(skipped) == 1 and skipped[0]["log_level"] == "debug" and skipped[0]["gpu"] == 1


def test_old_driver_falls_back_to_memory_info_v1_and_throttle_reasons() -> None:
    """Without the v2 memory call or the clocks-event call, v1 and the old throttle call are used."""
    fake = FakeNvml([FakeGpu()], memory_v2=False, clocks_event_api=False)
    source = _started(fake)
    source.poll(NOW)
    samples = source.poll(NOW + 1000)
    assert _value(samples, "DCGM_FI_DEV_FB_USED") == 100 * 1024 + 512  # v1 counts reserved as used
    assert not _find(samples, "DCGM_FI_DEV_FB_RESERVED")
    assert fake.device_calls("nvmlDeviceGetMemoryInfo", 0) == 2 + 1  # v2 tried once only
    assert _value(samples, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == fk.nvmlClocksEventReasonSwPowerCap
    assert fake.device_calls("nvmlDeviceGetCurrentClocksEventReasons", 0) == 1


def test_gpu_lost_mid_run_marks_it_and_keeps_polling_the_others() -> None:
    """A GPU that falls off the bus is marked lost once and skipped; the other GPU is still read."""
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    with structlog.testing.capture_logs() as logs:
        source = _started(fake)
        source.poll(NOW)
        fake.gpus[0].lost = True
        lost_poll = source.poll(NOW + 1000)
        calls_after_loss = sum(n for (_, index), n in fake.calls.items() if index == 0)
        later = source.poll(NOW + 2000)
    for samples in (lost_poll, later):
        assert not _find(samples, "DCGM_FI_DEV_FB_USED", gpu="0")
        assert _value(samples, "DCGM_FI_DEV_FB_USED", gpu="1") == 100 * 1024
        assert _value(samples, "sre_agent_gpu_lost", gpu="0", UUID=fake.gpus[0].uuid) == 1
        assert _value(samples, "sre_agent_gpu_lost", gpu="1") == 0
    assert sum(n for (_, index), n in fake.calls.items() if index == 0) == calls_after_loss
    assert [e["gpu"] for e in logs if e["event"] == "gpu_lost"] == [0]
    assert source.gpus()[0]["lost"] == "true" and source.gpus()[1]["lost"] == "false"


def test_gpu_lost_before_start_is_listed_as_lost() -> None:
    """A GPU already lost when the agent starts is reported lost; the healthy one is polled."""
    fake = FakeNvml([FakeGpu(lost=True), FakeGpu()])
    samples = _started(fake).poll(NOW)
    assert _value(samples, "sre_agent_gpu_lost", gpu="0") == 1
    assert _value(samples, "DCGM_FI_DEV_GPU_TEMP", gpu="1") == 61


def test_xid_events_are_drained_without_blocking_and_counted_by_code() -> None:
    """XIDs are read with timeout 0; the last one is DCGM's gauge, each code has its own counter."""
    fake = FakeNvml([FakeGpu(), FakeGpu()])
    source = _started(fake)
    fake.queue_xid(1, 13)
    fake.queue_xid(1, 13)
    fake.queue_xid(1, 48)
    with structlog.testing.capture_logs() as logs:
        samples = source.poll(NOW)
    assert _value(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 48
    assert _value(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 0
    assert _value(samples, "sre_agent_gpu_xid_errors_total", gpu="1", xid="13") == 2
    assert _value(samples, "sre_agent_gpu_xid_errors_total", gpu="1", xid="48") == 1
    assert not _find(samples, "sre_agent_gpu_xid_errors_total", gpu="0")
    assert [e["xid"] for e in logs if e["event"] == "gpu_xid_error"] == [13, 13, 48]
    quiet = source.poll(NOW + 1000)
    assert _value(quiet, "sre_agent_gpu_xid_errors_total", gpu="1", xid="13") == 2
    assert fake.wait_timeouts == [0] * 5  # 3 events + one Timeout per poll
    assert not _find(quiet, "sre_agent_nvml_errors_total")


def test_gpu_without_xid_event_support_exports_no_xid_gauge() -> None:
    """Where the XID event type is unsupported, no XID series pretends to be zero."""
    fake = FakeNvml([FakeGpu(supported_events=fk.nvmlEventTypeSingleBitEccError)])
    samples = _started(fake).poll(NOW)
    assert not _find(samples, "DCGM_FI_DEV_XID_ERRORS")
    assert fake.device_calls("nvmlDeviceRegisterEvents", 0) == 0


def test_processes_exported_with_names_from_procfs(tmp_path: Path) -> None:
    """Compute processes export their GPU memory in bytes, named from <proc_root>/<pid>/comm."""
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "comm").write_text("python3\n")
    (tmp_path / "77").mkdir()
    (tmp_path / "77" / "comm").write_text("lmdeploy\n")
    gpu = FakeGpu(processes=[(77, 2 * GIB), (4242, 70 * GIB), (5000, GIB), (6000, None)])
    samples = _started(FakeNvml([gpu]), proc_root=tmp_path).poll(NOW)
    procs = _find(samples, "sre_agent_gpu_process_memory_bytes")
    got = [(labels_get(s.labels, "pid"), labels_get(s.labels, "process_name"), s.value) for s in procs]
    assert got == [("4242", "python3", 70 * GIB), ("77", "lmdeploy", 2 * GIB), ("5000", "unknown", GIB)]
    assert _value(samples, "sre_agent_gpu_processes") == 4
    assert labels_get(procs[0].labels, "UUID") == labels_get(samples[0].labels, "UUID")


def test_process_series_are_capped_per_gpu(tmp_path: Path) -> None:
    """Only the largest max_processes processes get a series, bounding PID cardinality."""
    gpu = FakeGpu(processes=[(pid, pid * MIB) for pid in range(1, 41)])
    samples = _started(FakeNvml([gpu]), proc_root=tmp_path, max_processes=3).poll(NOW)
    pids = [labels_get(s.labels, "pid") for s in _find(samples, "sre_agent_gpu_process_memory_bytes")]
    assert pids == ["40", "39", "38"]


def test_shutdown_is_idempotent_and_safe_when_never_started() -> None:
    """shutdown() twice, or before start(), neither raises nor calls NVML out of order."""
    fake = FakeNvml()
    _source(fake).shutdown()
    source = _started(fake)
    source.shutdown()
    source.shutdown()
    assert fake.initialized == 0
    assert fake.calls[("nvmlShutdown", -1)] == 1
    assert fake.calls[("nvmlEventSetFree", -1)] == 1
    assert not source.available and source.reason == "shut down"
    assert [s.value for s in source.poll(NOW)] == [0.0]


def test_unknown_errors_are_counted_per_field_and_retried() -> None:
    """An NVML error other than NotSupported/GpuIsLost is counted and the reading retried next poll."""
    fake = FakeNvml([FakeGpu(errors={"nvmlDeviceGetTemperature": fk.NVML_ERROR_UNKNOWN})])
    source = _started(fake)
    source.poll(NOW)
    samples = source.poll(NOW + 1000)
    assert _value(samples, "sre_agent_nvml_errors_total", field="temperature", error="Unknown") == 2
    assert not _find(samples, "DCGM_FI_DEV_GPU_TEMP")
    assert _value(samples, "DCGM_FI_DEV_GPU_UTIL") == 87


def test_poll_never_raises_even_when_every_call_fails() -> None:
    """With every NVML call failing, or raising a non-NVML exception, poll still returns self-metrics."""
    fake = FakeNvml()
    source = _started(fake)
    fake.fail_all = fk.NVML_ERROR_UNKNOWN
    samples = source.poll(NOW)
    assert _value(samples, "sre_agent_nvml_up") == 1
    assert _value(samples, "sre_agent_nvml_errors_total", field="xid_events", error="Unknown") == 1
    assert _value(samples, "sre_agent_nvml_errors_total", field="memory_v2", error="Unknown") == 2
    assert {s.name for s in samples if s.name.startswith("DCGM_")} == {"DCGM_FI_DEV_XID_ERRORS"}  # last known
    fake.fail_all = RuntimeError("driver wedged")
    assert _value(source.poll(NOW + 1000), "sre_agent_nvml_up") == 1
    fake.fail_all = fk.NVML_ERROR_UNKNOWN
    source.shutdown()  # nvmlShutdown fails too; still no exception


def test_start_fails_cleanly_when_enumeration_fails() -> None:
    """If NVML initialises but cannot count GPUs, the source is unavailable and NVML is shut down."""
    fake = FakeNvml()
    fake.fail_all = fk.NVML_ERROR_UNKNOWN
    source = _source(fake)
    assert source.start() is False
    assert source.reason.startswith("enumerating GPUs failed")
    assert fake.calls[("nvmlShutdown", -1)] == 1
    fake.fail_all = None
    assert source.start() is True and source.available


def test_gpus_lists_identity_for_the_api() -> None:
    """gpus() gives index, UUID, name, PCI bus id and lost flag as strings."""
    fake = FakeNvml([FakeGpu(name="NVIDIA H100 80GB HBM3")])
    assert _started(fake).gpus() == [{
        "index": "0", "uuid": fake.gpus[0].uuid, "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0", "lost": "false",
    }]


def test_fake_follows_nvml_documented_behaviour() -> None:
    """The fake raises Uninitialized before init, Timeout on an empty wait, GpuIsLost on a lost GPU."""
    fake = FakeNvml([FakeGpu(lost=True)])
    nvml = fake.module
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nvml.NVMLError_Timeout) as caught:
        nvml.nvmlEventSetWait(nvml.nvmlEventSetCreate(), 0)
    assert caught.value.value == nvml.NVML_ERROR_TIMEOUT
    assert type(nvml.NVMLError(nvml.NVML_ERROR_NOT_SUPPORTED)) is nvml.NVMLError_NotSupported
    nvml.nvmlShutdown()
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlShutdown()


def test_fake_matches_real_pynvml() -> None:
    """Every name the fake defines exists in nvidia-ml-py's pynvml with the same value, code,
    structure fields and parameter names, so the fake cannot drift from the real API."""
    real = pytest.importorskip("pynvml")
    module = FakeNvml().module
    names = [n for n in vars(module) if not n.startswith("__")]
    assert all(is_api_name(n) for n in names)
    for name in names:
        assert hasattr(real, name), f"pynvml has no {name}"
        mine, theirs = getattr(module, name), getattr(real, name)
        if isinstance(mine, int):
            assert mine == theirs, name
        elif isinstance(mine, type) and issubclass(mine, NVMLError) and mine is not NVMLError:
            assert mine().value == theirs().value, name
            assert type(real.NVMLError(mine().value)) is theirs, name
        elif isinstance(mine, type) and hasattr(mine, "_fields_"):
            assert [f[0] for f in mine._fields_] == [f[0] for f in theirs._fields_], name
        elif inspect.ismethod(mine):
            params = list(inspect.signature(theirs).parameters)
            assert list(inspect.signature(mine).parameters) == params, name
    real_errors = {n for n in vars(real) if n.startswith("NVMLError_")}
    fake_codes = {n for n in names if n.startswith("NVML_ERROR_")}
    assert {fk._error_class_name(c) for c in fake_codes} <= real_errors


def test_nvlink_probe_is_repeated_after_a_failed_first_poll() -> None:
    """A transient error while discovering NVLinks does not freeze a wrong link list."""
    flaky = FakeGpu(nvlink_states=[1, 1], errors={"nvmlDeviceGetNvLinkState": fk.NVML_ERROR_UNKNOWN})
    fake = FakeNvml([flaky])
    source = _started(fake)
    assert not _find(source.poll(NOW), "sre_agent_gpu_nvlink_up")
    fake.gpus[0].errors.clear()
    assert len(_find(source.poll(NOW + 1000), "sre_agent_gpu_nvlink_up")) == 2
    before = fake.device_calls("nvmlDeviceGetNvLinkState", 0)
    source.poll(NOW + 2000)
    assert fake.device_calls("nvmlDeviceGetNvLinkState", 0) - before == 2


def test_xid_registration_failure_exports_no_false_zero() -> None:
    """If NVML refuses to register XID events for a GPU, that GPU gets no XID gauge and an error count."""
    gpu = FakeGpu(errors={"nvmlDeviceRegisterEvents": fk.NVML_ERROR_NO_PERMISSION})
    samples = _started(FakeNvml([gpu, FakeGpu()])).poll(NOW)
    assert not _find(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="0")
    assert _value(samples, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 0
    assert _value(samples, "sre_agent_nvml_errors_total", field="xid_events", error="NoPermission") == 1
