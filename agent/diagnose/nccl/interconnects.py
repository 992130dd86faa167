"""Expected nccl-tests bus bandwidth per interconnect, from NVIDIA maintainers' own numbers.

``busbw`` (nccl-tests' "bus bandwidth") is corrected so that it can be compared with
the hardware's peak independently of the rank count (nccl-tests ``doc/PERFORMANCE.md``,
https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md: "The bus bandwidth
should reflect the speed of the hardware bottleneck: NVLink, PCI, QPI, or network").
The figures below are what NCCL reaches at large sizes (8 GiB), not line rates: NVLink
and PCIe lose ~20 % to protocol overhead. They hold for any collective's busbw, except
the NVLink SHARP (NVLS) figures, which only all-reduce reaches.

A key names one interconnect (``a100-nvswitch``); network keys take a NIC count
(``ib-400gx8`` = eight 400 Gb/s NICs per node). :func:`guess_interconnect` picks a
key from the GPU models and node count an nccl-tests run prints, when none is
configured; it guesses conservatively (the ring figure, never NVLS) so that a guess
never raises a false alarm, and it does not guess across nodes (the NIC count is not
in the output).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.errors import ConfigError

__all__ = [
    "INTERCONNECTS",
    "Interconnect",
    "check_configured",
    "expected_busbw",
    "guess_interconnect",
    "nvlink_busbw",
]


@dataclass(frozen=True)
class Interconnect:
    key: str
    busbw_gbps: float  # per NIC for network keys
    description: str
    source: str  # where the number comes from
    per_nic: bool = False


INTERCONNECTS: dict[str, Interconnect] = {
    i.key: i
    for i in (
        # sjeaugey (NCCL lead), 2023-07-05: "12 NVLinks ... ~20GB/s effective bandwidth [each] ...
        # should therefore be 240GB/s on A100, but some other bottlenecks on the GPUs limits it to ~230GB/s."
        Interconnect("a100-nvswitch", 230.0, "A100 SXM, NVLink3 through NVSwitch (12 links)",
                     "https://github.com/NVIDIA/nccl-tests/issues/149"),
        # sjeaugey, 2023-04-24, on 8x A800 (8 NVLinks instead of 12): "you should get ~160GB/s intra-node".
        Interconnect("a800-nvswitch", 160.0, "A800 SXM, NVLink3 through NVSwitch (8 links)",
                     "https://github.com/NVIDIA/nccl/issues/412"),
        # sjeaugey, 2024-05-06: "450GB/s is the line rate. With the protocol overhead (~20%) NCCL can get an
        # effective NVLink bandwidth of 370GB/s, which you can observe as 'BusBw' when running non-allreduce
        # operations, or when running with NCCL_ALGO=RING."
        Interconnect("h100-nvswitch", 370.0, "H100 SXM, NVLink4 through NVSwitch, ring algorithm",
                     "https://github.com/NVIDIA/nccl-tests/issues/212"),
        # Same comment: "allreduce uses NVLink SHARP by default ... On 8 GPUs, you should reach a peak busBw of
        # ~480GB/s (algbw ~275GB/s)." NVLS busbw is not a wire bandwidth; it only applies to all-reduce.
        Interconnect("h100-nvls", 480.0, "H100 SXM, 8 GPUs, all-reduce with NVLink SHARP (NVLS)",
                     "https://github.com/NVIDIA/nccl-tests/issues/212"),
        # H200 SXM has H100's NVLink4 (18 links, 900 GB/s); a user's 8x H200 all-reduce peaked at 475 GB/s
        # busbw with NVLS (nccl-tests#272), matching the H100 NVLS figure.
        Interconnect("h200-nvswitch", 370.0, "H200 SXM, NVLink4 through NVSwitch, ring algorithm (as H100)",
                     "https://github.com/NVIDIA/nccl-tests/issues/212"),
        Interconnect("h200-nvls", 480.0, "H200 SXM, 8 GPUs, all-reduce with NVLS (as H100)",
                     "https://github.com/NVIDIA/nccl-tests/issues/272"),
        # A PCIe Gen4 x16 device delivers ~24 GB/s through NCCL: sjeaugey, 2022-11-17, "We usually consider
        # 24GB/s is the peak performance per 200G NIC (12 GB/s for 100G NICs)" -- a 200G NIC is a Gen4 x16
        # device, a 100G NIC a Gen3 x16 one -- and 2023-04-24: "If the NIC is attached to the CPU getting
        # 16 GB/s is normal". GPU-to-GPU through a CPU root complex lands between: 22 GB/s.
        Interconnect("pcie-gen4", 22.0, "GPUs over PCIe Gen4 x16 (no NVLink)",
                     "https://github.com/NVIDIA/nccl-tests/issues/119"),
        # Gen3 x16: ~12 GB/s is NCCL's ceiling on such a link (the 100G-NIC figure above); GPU-to-GPU through
        # the host bridge, e.g. 2x RTX 2080 Ti without an NVLink bridge, ~10 GB/s.
        Interconnect("pcie-gen3", 10.0, "GPUs over PCIe Gen3 x16 (no NVLink)",
                     "https://github.com/NVIDIA/nccl-tests/issues/119"),
        # Network figures are per NIC (per node); a node's busbw scales with its GPU-attached NICs:
        # "12 GB/s for 100G NICs", "24GB/s ... per 200G NIC" (nccl-tests#119); a DGX-A100 with 8x 200G
        # measures 192 GB/s all-reduce busbw (AddyLaddy, nccl#812, quoted in nccl#1576).
        Interconnect("ib-100g", 12.0, "InfiniBand/RoCE 100 Gb/s NIC (EDR), GPUDirect RDMA",
                     "https://github.com/NVIDIA/nccl-tests/issues/119", per_nic=True),
        Interconnect("ib-200g", 24.0, "InfiniBand/RoCE 200 Gb/s NIC (HDR), GPUDirect RDMA",
                     "https://github.com/NVIDIA/nccl-tests/issues/119", per_nic=True),
        # AddyLaddy (NCCL team), 2025-01-23: "CX-7 NICs at NDR rate (400Gbps) should achieve up to 48-49GB/s
        # per NIC." Eight of them: ~384 GB/s.
        Interconnect("ib-400g", 48.0, "InfiniBand/RoCE 400 Gb/s NIC (NDR, ConnectX-7), GPUDirect RDMA",
                     "https://github.com/NVIDIA/nccl-tests/issues/267", per_nic=True),
    )
}

_KEY_RE = re.compile(r"^(?P<key>[a-z0-9-]+?)(?:x(?P<n>\d+))?$")

# GPU model (as nccl-tests prints it, e.g. "NVIDIA A100-SXM4-80GB") -> its NVLink interconnect.
# Order matters: PCIe and NVL (PCIe cards with NVLink bridges) variants first.
_NVLINK_MODELS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"PCIE|\bNVL\b", re.IGNORECASE), ""),
    (re.compile(r"\bA100\b|A100-SXM", re.IGNORECASE), "a100-nvswitch"),
    (re.compile(r"\bA800\b|A800-SXM", re.IGNORECASE), "a800-nvswitch"),
    (re.compile(r"\bH100\b", re.IGNORECASE), "h100-nvswitch"),
    (re.compile(r"\bH200\b", re.IGNORECASE), "h200-nvswitch"),
]

# PCIe-only models by the PCIe generation they use.
_PCIE_MODELS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"RTX 20\d0|GTX 10\d0|\bT4\b|V100-PCIE|TITAN (?:V|RTX)", re.IGNORECASE), "pcie-gen3"),
    (re.compile(r"RTX 30\d0|RTX 40\d0|RTX A[456]000|\bA10G?\b|\bA30\b|\bA40\b|\bL4\b|\bL40S?\b"
                r"|A100[- ](?:80GB |40GB )?PCIE|A800[- ](?:80GB )?PCIE", re.IGNORECASE), "pcie-gen4"),
]


def expected_busbw(interconnect: str) -> float:
    """The expected busbw of ``interconnect`` (``a100-nvswitch``, ``ib-200gx4``); KeyError names the known keys."""
    m = _KEY_RE.match(interconnect.strip().lower())
    if m is None or m.group("key") not in INTERCONNECTS:
        raise KeyError(f"unknown interconnect {interconnect!r}; known: {', '.join(sorted(INTERCONNECTS))} "
                       "(network keys take a NIC count, e.g. ib-400gx8)")
    entry = INTERCONNECTS[m.group("key")]
    nics = int(m.group("n") or 1)
    if m.group("n") and not entry.per_nic:
        raise KeyError(f"{entry.key} takes no count (only network keys do, e.g. ib-400gx8)")
    return entry.busbw_gbps * nics


def check_configured(interconnect: str, *, key: str = "diagnostics.nccl.interconnect") -> None:
    """Refuse a configured interconnect the table does not know, naming the config key.

    Why here and not in the config model: the config is the foundation every layer reads and
    imports nothing above it; the table is this layer's data. The CLI and the daemon call this
    once at start-up, so an unknown key still stops ``run`` and ``check`` before anything starts.
    """
    if not interconnect:
        return
    try:
        expected_busbw(interconnect)
    except KeyError as exc:
        raise ConfigError(f"{key}: {exc.args[0]}") from exc


def _model_key(model: str, table: list[tuple[re.Pattern[str], str]]) -> str | None:
    for pattern, key in table:
        if pattern.search(model):
            return key
    return None


def nvlink_busbw(gpu_models: list[str]) -> float | None:
    """The NVLink ring busbw of these GPUs (the figure the cross-node rule divides by 10), or None
    when they are not all one NVLink model we know."""
    keys = {_model_key(m, _NVLINK_MODELS) for m in gpu_models}
    if len(keys) != 1:
        return None
    key = keys.pop()
    return INTERCONNECTS[key].busbw_gbps if key else None


def guess_interconnect(gpu_models: list[str], ranks: int, nodes: int) -> str | None:
    """A key of :data:`INTERCONNECTS` for a single-node run of these GPUs, or None when unsure
    (several nodes: the NIC count is not printed; unknown or mixed models; fewer than 2 ranks)."""
    if nodes > 1 or ranks < 2 or not gpu_models:
        return None
    nvlink = {_model_key(m, _NVLINK_MODELS) for m in gpu_models}
    if len(nvlink) == 1 and (key := nvlink.pop()):
        return key
    pcie = {_model_key(m, _PCIE_MODELS) for m in gpu_models}
    if len(pcie) == 1 and (key := pcie.pop()):
        return key
    return None
