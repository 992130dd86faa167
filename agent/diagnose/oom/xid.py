"""NVIDIA's XID codes: what each common one means, whether it is hardware, and what to do.

An XID is the driver's error report (``NVRM: Xid (PCI:0000:3b:00): 79, ...`` in the kernel
log). :mod:`agent.diagnose.oom.evidence` recognises the lines; this table says what a code means,
so the OOM verdict (:mod:`agent.diagnose.oom.verdict`) can tell a failing GPU (drain the node) from an
application fault (restart it) and leave the latter to the GPU alerts. A module of its own
because it is reference data from NVIDIA's catalog, not a log pattern.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["XID_TABLE", "XidInfo", "xid_info"]


@dataclass(frozen=True)
class XidInfo:
    """One XID: its meaning, whether the fault is in the hardware, and the action NVIDIA advises."""

    code: int
    meaning: str
    hardware: bool  # True: the GPU, its memory, firmware or interconnect; False: the application/driver
    action: str


#: Common XIDs, from NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors) and its resolution
#: buckets. 48/63/64/74/79/92/94/95 are also rules/gpu.rules.yaml's GPUHardwareXIDError set.
XID_TABLE: dict[int, XidInfo] = {x.code: x for x in (
    XidInfo(8, "GPU stopped processing (channel idle timeout)", False, "restart the application"),
    XidInfo(13, "graphics engine exception", False, "restart the application; suspect a kernel bug"),
    XidInfo(31, "GPU memory page fault (illegal address)", False, "restart the application; suspect a kernel bug"),
    XidInfo(43, "GPU stopped processing (faulting channel reset)", False, "restart the application"),
    XidInfo(45, "preemptive cleanup after an earlier error", False, "look at the XID logged before it"),
    XidInfo(48, "double-bit ECC error", True, "drain the node, reset the GPU; RMA if it repeats"),
    XidInfo(61, "internal micro-controller breakpoint/warning", True, "drain the node and reset the GPU"),
    XidInfo(62, "internal micro-controller halt", True, "drain the node and reset the GPU (reboot if that fails)"),
    XidInfo(63, "ECC page retirement / row-remapping event", True,
            "restart the application; reset the GPU at the next drain to apply the remap"),
    XidInfo(64, "ECC page retirement / row-remapping failure", True, "drain the node, reset the GPU, RMA it"),
    XidInfo(68, "video processor (NVDEC) exception", False, "restart the application"),
    XidInfo(69, "graphics engine class error", True, "drain the node and reset the GPU"),
    XidInfo(74, "NVLink error", True, "drain the node, reset the GPU; reseat/replace the NVLink bridge if it repeats"),
    XidInfo(79, "GPU has fallen off the bus", True, "drain and reboot the node; check power/PCIe; RMA if it repeats"),
    XidInfo(92, "high single-bit ECC error rate", True, "drain the node, reset the GPU; RMA if it persists"),
    XidInfo(94, "contained ECC error", True, "restart the application; reset the GPU at the next drain"),
    XidInfo(95, "uncontained ECC error", True, "drain the node and reset the GPU now"),
    XidInfo(119, "GSP RPC timeout", True, "drain the node and reset the GPU; update the driver if it repeats"),
    XidInfo(120, "GSP error", True, "drain the node and reset the GPU; update the driver if it repeats"),
    XidInfo(140, "unrecovered ECC error", True, "drain the node and reset the GPU"),
)}


def xid_info(code: int) -> XidInfo:
    """The table entry, or an application-side placeholder for an XID the table lacks."""
    return XID_TABLE.get(code) or XidInfo(code, "XID not in the agent's table (see NVIDIA's Xid catalog)", False,
                                          "look it up in NVIDIA's Xid catalog")
