"""The data model shared by every source and the store: labels, samples, staleness.

Sources (scraper, NVML poller) produce :class:`Observation` records; the store keeps them
per series. Both sides import this module and nothing above it, which keeps the
data flow one-way (sources -> store -> evaluate -> act).

Labels are a tuple of ``(name, value)`` pairs sorted by name, ``__name__`` included.
A tuple is hashable and cheap to compare, so it is the series identity.
"""

from __future__ import annotations

import math
import re
import struct
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "METRIC_NAME",
    "STALE_NAN",
    "Labels",
    "Observation",
    "is_label_name",
    "is_stale",
    "iso_ms",
    "labels_from",
    "labels_get",
    "labels_str",
]

METRIC_NAME = "__name__"

#: Prometheus' staleness marker: a NaN with a specific payload (``value.StaleNaN``,
#: 0x7ff0000000000002). An ordinary NaN scraped from a target is a *value*; this one
#: means "the series ended here" and makes PromQL stop returning it at once instead
#: of after the 5-minute lookback.
_STALE_BITS = 0x7FF0000000000002
_STALE_BYTES = struct.pack("<Q", _STALE_BITS)
STALE_NAN: float = struct.unpack("<d", _STALE_BYTES)[0]

Labels = tuple[tuple[str, str], ...]

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def is_label_name(name: str) -> bool:
    """Whether ``name`` is a valid Prometheus label name (``[a-zA-Z_][a-zA-Z0-9_]*``,
    ASCII only, the whole string)."""
    return _LABEL_NAME.fullmatch(name) is not None


def is_stale(value: float) -> bool:
    """True only for the staleness-marker NaN, not for any other NaN."""
    return math.isnan(value) and struct.pack("<d", value) == _STALE_BYTES


def labels_from(name: str | None, labels: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> Labels:
    """Build the canonical sorted label tuple; ``name`` becomes ``__name__``."""
    items = dict(labels.items() if isinstance(labels, Mapping) else labels)
    if name is not None:
        items[METRIC_NAME] = name
    return tuple(sorted(items.items()))


def labels_get(labels: Labels, key: str, default: str = "") -> str:
    """The value of one label, or ``default`` (Prometheus treats missing as empty)."""
    for k, v in labels:
        if k == key:
            return v
    return default


def labels_str(labels: Labels) -> str:
    """Prometheus' own rendering: ``name{a="1", b="2"}``, for logs and errors."""
    name = labels_get(labels, METRIC_NAME)
    rest = ", ".join(f'{k}="{v}"' for k, v in labels if k != METRIC_NAME)
    return f"{name}{{{rest}}}" if rest or not name else name


@dataclass(frozen=True, slots=True)
class Observation:
    """One observed value with its labels, on its way into the store (an NVML reading, a telemetry
    value). ``timestamp_ms`` is None when the source gave no timestamp (the scrape time is then used,
    as Prometheus does). An element of a PromQL instant vector is :class:`agent.promql.Sample`."""

    labels: Labels
    value: float
    timestamp_ms: int | None = None

    @property
    def name(self) -> str:
        return labels_get(self.labels, METRIC_NAME)


def iso_ms(ms: int) -> str:
    """A Unix-millisecond timestamp as RFC 3339 UTC with exactly three fraction digits
    (``2026-11-29T18:40:02.123Z``), the form Prometheus' API and Alertmanager write."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
