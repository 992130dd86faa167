"""When a rule group is evaluated: aligned timestamps, as Prometheus' ``Group.EvalTimestamp`` computes them.

Two central agents with the same config (an HA pair in Prometheus mode) must reach the same
alert state from the same data: the same ``activeAt``, the same ``startsAt`` toward Alertmanager,
and, since a scale request's idempotency key is built from the alert's start, the same key. That
holds only if both evaluate at the same timestamps, whatever second each process was started in.
Prometheus gets there by putting a group's evaluations on a fixed grid: every ``interval``, shifted
by an offset derived from a hash of the group's file and name, so different groups spread over the
interval and every process with that group evaluates at the same instants. The agent does the same:
the scheduler runs a group's job on the grid, and the job evaluates at the grid point it is at,
not at the clock reading it happened to wake up with.

The hash is FNV-1a 64 over the rule file's base name and the group's name (Prometheus hashes the
full path; the base name keeps two hosts with different install directories on one grid), so an
offset is stable across processes, restarts and Python's per-process ``hash`` seed.
"""

from __future__ import annotations

from pathlib import PurePath

__all__ = ["EARLY_TOLERANCE_MS", "eval_offset_ms", "eval_timestamp_ms", "next_eval_ms"]

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = (1 << 64) - 1
#: A scheduler may wake a few milliseconds before its grid point; that still counts as the point.
EARLY_TOLERANCE_MS = 100


def _fnv1a64(data: bytes) -> int:
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & _MASK
    return h


def eval_offset_ms(file: str, name: str, interval_ms: int) -> int:
    """Where in each interval the group ``name`` of ``file`` is evaluated, in ms (0 ≤ offset < interval)."""
    if interval_ms <= 0:
        return 0
    return _fnv1a64(f"{PurePath(file).name}\xff{name}".encode()) % interval_ms


def eval_timestamp_ms(now_ms: int, interval_ms: int, offset_ms: int) -> int:
    """The grid point an evaluation running at ``now_ms`` belongs to: the latest one not after
    ``now_ms`` (a wake-up up to :data:`EARLY_TOLERANCE_MS` early counts as on time)."""
    if interval_ms <= 0:
        return now_ms
    tolerance = min(EARLY_TOLERANCE_MS, interval_ms // 10)
    adjusted = now_ms + tolerance - offset_ms
    return adjusted - adjusted % interval_ms + offset_ms


def next_eval_ms(after_ms: int, interval_ms: int, offset_ms: int) -> int:
    """The first grid point at or after ``after_ms``: when to schedule the group's first evaluation."""
    if interval_ms <= 0:
        return after_ms
    adjusted = after_ms - offset_ms
    base = adjusted - adjusted % interval_ms + offset_ms
    return base if base >= after_ms else base + interval_ms
