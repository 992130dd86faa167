"""The GPU dashboard (``gpu``), on dcgm-exporter's names and labels.

The agent's NVML poller exports the same ``DCGM_FI_DEV_*`` series (agent/collect/dcgm.py), so
this works with either; the ``sre_agent_gpu_*`` series (XID counts per XID, NVLink state per
link) exist only where the agent polls NVML. Hosts are labelled ``Hostname`` by released
dcgm-exporters and ``hostname`` by its main branch: legends print both (one is empty).

Framebuffer fill is used / (used + free), the rule's definition: dcgm-exporter's default
counters have no FB_TOTAL, and the driver-reserved part of the total can never be allocated.
"""

from __future__ import annotations

from dashboards.kit import Board, Column, Q, Var
from dashboards.rules import threshold

__all__ = ["board"]

_VARS = (
    Var("job", "job", "DCGM_FI_DEV_FB_USED"),
    Var("instance", "instance", "DCGM_FI_DEV_FB_USED"),
    Var("gpu", "gpu", "DCGM_FI_DEV_FB_USED"),
)
FB_FULL = threshold("GPUMemoryNearFull", "gpu:fb_used:ratio")
_LEGEND = "{{Hostname}}{{hostname}} GPU {{gpu}}"
_BY = "Hostname, hostname, gpu"
#: clocks-event-reason bits (NVML nvmlClocksEventReason*) the throttling alerts test.
_BITS = ((0x04, "SW power cap"), (0x08, "HW slowdown"), (0x20, "SW thermal"), (0x40, "HW thermal"),
         (0x80, "HW power brake"))  # fmt: skip


def board() -> Board:
    b = Board("gpu", "GPUs", "NVIDIA GPUs on dcgm-exporter names: memory, utilization, heat, power, clocks, "
              "XID, ECC, row remapping, NVLink.", tags=["gpu"], variables=_VARS)
    used, free = b.sel("DCGM_FI_DEV_FB_USED"), b.sel("DCGM_FI_DEV_FB_FREE")
    reasons = f"({b.sel('DCGM_FI_DEV_CLOCKS_EVENT_REASONS')} or {b.sel('DCGM_FI_DEV_CLOCK_THROTTLE_REASONS')})"

    b.row("Memory")
    b.timeseries(
        "Framebuffer used / usable", unit="percentunit", min_=0, max_=1, thresholds=[(FB_FULL, "red")],
        queries=[Q(f"{used} / clamp_min({used} + {free}, 1)", _LEGEND)],
        what=f"Share of the usable framebuffer in use: used / (used + free). Dashed line: the alert's "
             f"{FB_FULL:.0%}. vLLM claims --gpu-memory-utilization (0.9) at start-up, so a serving GPU sits near it.",
        bad=f"Above {FB_FULL:.0%} for 15 minutes: a spike ends in CUDA out of memory; check "
            "--gpu-memory-utilization, --max-model-len and --max-num-seqs.",
        runbooks=["GPUMemoryNearFull", "diagnosis-gpu-memory-contention"],
    )  # fmt: skip
    b.timeseries(
        "Framebuffer used and usable total", unit="mbytes",
        queries=[Q(used, f"used {_LEGEND}"), Q(f"{used} + {free}", f"usable {_LEGEND}")],
        what="Framebuffer memory in use and in total usable (used + free), MiB as DCGM reports them.",
        bad=f"Used closing on usable (above {FB_FULL:.0%} of it): out-of-memory risk.",
        runbooks=["GPUMemoryNearFull"],
    )  # fmt: skip
    b.row("Load, heat and power")
    b.timeseries(
        "GPU utilization", unit="percent", min_=0, max_=100,
        queries=[Q(b.sel("DCGM_FI_DEV_GPU_UTIL"), _LEGEND)],
        what="Percent of time a kernel ran on the GPU over NVML's sample period.",
        bad="Low while requests wait or run: the engine stalls on something else (inter-GPU traffic, host); "
            "sustained 100% with growing queues: capacity is short.",
        runbooks=["VLLMGenerationThroughputLow", "diagnosis-nccl-bandwidth-low"],
    )  # fmt: skip
    b.timeseries(
        "Temperature", unit="celsius", queries=[Q(b.sel("DCGM_FI_DEV_GPU_TEMP"), _LEGEND)],
        what="GPU core temperature.",
        bad="Rising together with the thermal clock-event bits: the GPU slows itself down; check cooling.",
        runbooks=["GPUThermalThrottling"],
    )  # fmt: skip
    b.timeseries(
        "Power draw and limit", unit="watt",
        queries=[Q(b.sel("DCGM_FI_DEV_POWER_USAGE"), f"draw {_LEGEND}"),
                 Q(b.sel("DCGM_FI_DEV_POWER_MGMT_LIMIT"), f"limit {_LEGEND}")],
        what="Power draw and the power-management limit.",
        bad="Draw pinned at the limit under load is by design (SW power cap); hardware slowdown or power brake "
            "in the clock-event reasons is not.",
        runbooks=["GPUPowerThrottling"],
    )  # fmt: skip
    b.timeseries(
        "SM clock", unit="rotmhz", queries=[Q(b.sel("DCGM_FI_DEV_SM_CLOCK"), _LEGEND)],
        what="Streaming-multiprocessor clock.",
        bad="Dropping under load while a throttling bit is set: throughput falls with it.",
        runbooks=["GPUThermalThrottling", "GPUPowerThrottling"],
    )  # fmt: skip
    b.timeseries(
        "Clock-event reasons", unit="bool_on_off", min_=0, max_=1, width=24,
        queries=[Q(f"floor({reasons} / {bit}) % 2", f"{name} {_LEGEND}") for bit, name in _BITS],
        what="The bits of the clocks-event-reasons bitmask (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, or "
             "CLOCK_THROTTLE_REASONS before DCGM 3.3) that the throttling alerts test.",
        bad="SW/HW thermal on for 10 minutes: cooling. HW power brake, or HW slowdown without HW thermal: power "
            "supply. SW power cap alone is normal at full load.",
        runbooks=["GPUThermalThrottling", "GPUPowerThrottling"],
    )  # fmt: skip
    b.row("Errors")
    xid = b.sel("sre_agent_gpu_xid_errors_total")
    b.timeseries(
        "XID errors", unit="short", bars=True,
        queries=[Q(f"sum by ({_BY}, xid) (increase({xid}[$__rate_interval]))", f"XID {{{{xid}}}} {_LEGEND}"),
                 Q(f"{b.sel('DCGM_FI_DEV_XID_ERRORS')} > 0", f"last XID (dcgm-exporter) {_LEGEND}")],
        what="XID events per interval by XID (the agent's counter), and the last XID dcgm-exporter saw (it "
             "keeps that value until it restarts).",
        bad="48, 61-64, 69, 74, 79, 92, 94, 95, 119, 120, 140: hardware, drain and reset the GPU. 13, 31, 43: "
            "usually the application faulted; check the server log.",
        runbooks=["GPUHardwareXIDError", "GPUApplicationXIDError"],
    )  # fmt: skip
    b.timeseries(
        "ECC errors (volatile)", unit="short", bars=True,
        queries=[Q(f"increase({b.sel('DCGM_FI_DEV_ECC_DBE_VOL_TOTAL')}[$__rate_interval])", f"double-bit {_LEGEND}"),
                 Q(f"increase({b.sel('DCGM_FI_DEV_ECC_SBE_VOL_TOTAL')}[$__rate_interval])", f"single-bit {_LEGEND}")],
        what="New ECC errors since driver load per interval: double-bit (uncorrectable) and single-bit "
             "(corrected).",
        bad="Any double-bit error: data in GPU memory was lost; drain the node and reset the GPU. A high "
            "single-bit rate precedes retirement.",
        runbooks=["GPUECCDoubleBitError"],
    )  # fmt: skip
    b.table(
        "Row remapping", width=24, hide=["__name__", "job", "UUID", "pci_bus_id", "device", "DCGM_FI_DRIVER_VERSION"],
        columns=[
            _col(b, "Correctable remaps", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
            _col(b, "Uncorrectable remaps", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
            _col(b, "Remap pending", "DCGM_FI_DEV_ROW_REMAP_PENDING"),
            _col(b, "Remap failed", "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
        ],
        what="Memory rows remapped (Ampere and later), whether a remap waits for a GPU reset, and whether one "
             "failed.",
        bad="Uncorrectable remaps rising or remap pending: drain and reset. Remap failed: take the GPU out of "
            "service.",
        runbooks=["GPUUncorrectableRowRemap", "GPURowRemapFailure"],
    )  # fmt: skip
    b.row("Interconnect")
    link = b.sel("sre_agent_gpu_nvlink_up")
    b.timeseries(
        "NVLink links up and down", unit="short",
        queries=[Q(f"sum by ({_BY}) ({link})", f"up {_LEGEND}"),
                 Q(f"count by ({_BY}) ({link} == 0)", f"down {_LEGEND}")],
        what="NVLinks of each GPU reported active and inactive (the agent's NVML poller).",
        bad="A link down while others of the GPU are up, for 5 minutes: collectives take slower paths.",
        runbooks=["GPUNVLinkDown"],
    )  # fmt: skip
    b.timeseries(
        "NVLink and PCIe bandwidth", unit="KiBs",
        queries=[Q(f"1000 * {b.sel('DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL')}", f"NVLink {_LEGEND}"),
                 Q(b.sel("DCGM_FI_DEV_PCIE_TX_THROUGHPUT"), f"PCIe tx {_LEGEND}"),
                 Q(b.sel("DCGM_FI_DEV_PCIE_RX_THROUGHPUT"), f"PCIe rx {_LEGEND}")],
        what="NVLink traffic over all links (DCGM's \"MB/s\" is 1000 KiB/s) and PCIe tx and rx, in KiB/s.",
        bad="Tensor-parallel traffic on PCIe instead of NVLink, or NVLink near zero under load on an NVLink "
            "system: all-reduce is slow; run nccl-tests.",
        runbooks=["diagnosis-nccl-bandwidth-low", "GPUNVLinkDown"],
    )  # fmt: skip
    b.stat(
        "NVML available", unit="bool_on_off", thresholds=[(1, "green")], base="red", width=24,
        queries=[Q('sre_agent_nvml_up{job=~"$job", instance=~"$instance"}', "{{instance}}")],
        what="Whether the agent's NVML poller can read the GPUs (only where the agent polls NVML).",
        bad="Off for 10 minutes: no GPU metrics from the agent and the GPU alerts cannot fire.",
        runbooks=["SREAgentNVMLUnavailable"],
    )  # fmt: skip
    return b


def _col(b: Board, header: str, metric: str) -> Column:
    return Column(header, b.sel(metric), "short")
