"""``histogram_quantile`` over classic (``le``-labelled) histogram buckets.

vLLM exports its latencies (TTFT, inter-token latency, e2e request latency) as classic
histograms, so this is the function most SLO rules lean on. Semantics are Prometheus
2.42's ``bucketQuantile``: buckets are grouped by all labels but ``le`` (the metric name
included, so two histograms differing only by name are two groups, which then collide
once the name is dropped: an error, as in Prometheus); a group needs a ``+Inf`` bucket;
buckets with the same bound are merged; non-monotonic counts (a rule racing a scrape)
are raised to the running maximum; the quantile is interpolated linearly inside the
bucket that holds the rank, the lowest bucket starting at 0 unless its bound is <= 0,
and a rank in the ``+Inf`` bucket returns the highest finite bound.
"""

from __future__ import annotations

import math

from agent.gocompat.math import div, parse_float
from agent.promql.values import Memos, Vec, check_unique
from agent.series import Labels

__all__ = ["bucket_quantile", "histogram_quantile"]

BUCKET_LABEL = "le"


def _bucket_of(labels: Labels) -> tuple[Labels, float] | None:
    """A bucket's group key (its labels less ``le``) and upper bound; None when it has
    no ``le`` or one Go cannot parse (Prometheus skips such a sample)."""
    le: str | None = None
    for k, v in labels:
        if k == BUCKET_LABEL:
            le = v
            break
    bound = parse_float(le) if le is not None else None
    if bound is None:
        return None
    return tuple(p for p in labels if p[0] != BUCKET_LABEL), bound


def histogram_quantile(q: float, vec: Vec, memos: Memos) -> Vec:
    """The ``q`` quantile of each group of buckets in ``vec``. Each label set's group key
    and bound come from the engine's memo of :func:`_bucket_of` (a rule sees the same
    buckets every interval); the result labels (the group key less ``__name__``) from
    its ``group_keys(True, ())`` memo, which hits by identity since the group keys come
    out of the first as the same objects."""
    groups: dict[Labels, list[tuple[float, float]]] = {}
    get = groups.get
    buckets_of = memos.of(_bucket_of)
    for labels, value in vec:
        found = buckets_of[labels]
        if found is None:
            continue
        key, bound = found
        bucket = get(key)
        if bucket is None:
            groups[key] = [(bound, value)]
        else:
            bucket.append((bound, value))
    result_labels = memos.group_keys(True, ())
    out: Vec = [(result_labels[key], bucket_quantile(q, buckets)) for key, buckets in groups.items()]
    return check_unique(out) if len(out) > 1 else out


def bucket_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The ``q`` quantile from (upper bound, cumulative count) pairs in any order."""
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    buckets = sorted(buckets, key=lambda b: b[0])
    if buckets[-1][0] != math.inf:
        return math.nan
    bounds: list[float] = []
    counts: list[float] = []
    for bound, count in buckets:  # merge equal bounds ("0.2", "2e-1", ...)
        if bounds and bounds[-1] == bound:
            counts[-1] += count
        else:
            bounds.append(bound)
            counts.append(count)
    high = -math.inf
    for i, c in enumerate(counts):  # force monotonic counts
        if c > high:
            high = c
        elif c < high:
            counts[i] = high
    if len(counts) < 2:
        return math.nan
    observations = counts[-1]
    if observations == 0:
        return math.nan
    rank = q * observations
    b = len(counts) - 1  # first bucket (below +Inf) whose count reaches the rank
    for i in range(len(counts) - 1):
        if counts[i] >= rank:
            b = i
            break
    if b == len(counts) - 1:
        return bounds[-2]
    if b == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0
    end = bounds[b]
    count = counts[b]
    if b > 0:
        start = bounds[b - 1]
        count -= counts[b - 1]
        rank -= counts[b - 1]
    return start + (end - start) * div(rank, count)
