"""Functions over a range vector: ``rate`` and friends, ``deriv``, ``*_over_time``.

Each takes one series' points inside the selected window (stale markers already
removed, oldest first) plus the window's bounds and returns one float, or None to drop
the series from the result. The engine selects the window straight from the store's
arrays, so nothing here allocates per sample.

Semantics are Prometheus 2.42's (``promql/functions.go``): ``rate``/``increase``/
``delta`` extrapolate towards the window edges unless the first or last sample lies
more than 1.1 average intervals away (then only half an interval), never extrapolate a
counter below zero, and treat any decrease of a counter as a reset; ``irate``/
``idelta`` use the last two points; ``deriv``/``predict_linear`` fit a least-squares
line with compensated sums.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from agent.gocompat.math import div
from agent.promql.values import Vec
from agent.series import Labels

__all__ = ["RANGE_FUNCTIONS", "Extent", "Frame", "RangeFunction", "change", "extrapolated", "quantile"]


@dataclass(frozen=True, slots=True)
class Frame:
    """What a range function needs besides the points: the window ``[mint, maxt]`` (ms),
    the evaluation time (ms) and the scalar parameter (NaN when the function has none)."""

    mint: int
    maxt: int
    at: int
    param: float


#: (timestamps ms, values, frame) -> result, or None to drop the series.
RangeFn = Callable[[Sequence[int], Sequence[float], Frame], "float | None"]


@dataclass(frozen=True, slots=True)
class RangeFunction:
    fn: RangeFn
    matrix_arg: int = 0  # which argument is the range vector (1 for quantile_over_time)
    keep_name: bool = False  # only last_over_time keeps __name__
    #: ``(counter, per_second)`` for rate/increase/delta: over a selector the engine then
    #: runs :func:`extrapolated` on the store's arrays directly.
    extrapolation: tuple[bool, bool] | None = None


#: One series' window for :func:`extrapolated`: its labels, first value, change over the
#: window (:func:`change`), number of points (at least two, stale markers removed), and
#: the timestamps (ms) of the first and the last point.
Extent = tuple[Labels, float, float, int, int, int]


def change(vs: Sequence[float], counter: bool) -> float:
    """Last minus first value; for a counter also plus the value before each decrease,
    which Prometheus takes for a reset (the counter restarted from zero)."""
    first = vs[0]
    result = vs[-1] - first
    if counter:
        prev = first
        for v in vs:
            if v < prev:
                result += prev
            prev = v
    return result


def extrapolated(windows: Iterable[Extent], mint: int, maxt: int, counter: bool, per_second: bool) -> Vec:
    """``rate`` (``counter``, ``per_second``), ``increase`` (``counter``) or ``delta``
    of every window in ``[mint, maxt]`` (ms), in order.

    One loop over all windows rather than a call per series: ``rate`` over histogram
    buckets is the bulk of a rule evaluation, and a call costs as much as the
    arithmetic. A window comes as its first value, change and end times, so the engine
    can stream them straight from the store's arrays (:func:`.selectors.extents`),
    skipping the reset scan where it knows there is none. The arithmetic is
    Prometheus' ``extrapolatedRate``, the same operations in the same order.
    """
    out: Vec = []
    append = out.append
    range_s = (maxt - mint) / 1000
    for labels, first, result, n, first_t, last_t in windows:
        to_start = (first_t - mint) / 1000
        to_end = (maxt - last_t) / 1000
        sampled = (last_t - first_t) / 1000
        average = sampled / (n - 1)
        if counter and result > 0 and first >= 0:
            # A counter cannot have been below zero: do not extrapolate past its zero point.
            to_zero = sampled * (first / result)
            to_start = min(to_start, to_zero)
        threshold = average * 1.1
        interval = sampled
        interval += to_start if to_start < threshold else average / 2
        interval += to_end if to_end < threshold else average / 2
        factor = interval / sampled
        if per_second:
            factor /= range_s
        append((labels, result * factor))
    return out


def _extrapolated(ts: Sequence[int], vs: Sequence[float], w: Frame, counter: bool, per_second: bool) -> float | None:
    if len(vs) < 2:
        return None
    window = ((), vs[0], change(vs, counter), len(vs), ts[0], ts[-1])
    return extrapolated([window], w.mint, w.maxt, counter, per_second)[0][1]


def _rate(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return _extrapolated(ts, vs, w, True, True)


def _increase(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return _extrapolated(ts, vs, w, True, False)


def _delta(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return _extrapolated(ts, vs, w, False, False)


def _last_two(ts: Sequence[int], vs: Sequence[float], per_second: bool) -> float | None:
    if len(vs) < 2:
        return None
    last, prev = vs[-1], vs[-2]
    result = last if per_second and last < prev else last - prev
    interval = ts[-1] - ts[-2]
    if interval == 0:
        return None
    return result / (interval / 1000) if per_second else result


def _irate(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return _last_two(ts, vs, True)


def _idelta(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return _last_two(ts, vs, False)


def _resets(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    count = 0
    prev = vs[0]
    for v in vs:
        if v < prev:
            count += 1
        prev = v
    return float(count)


def _changes(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    count = 0
    prev = vs[0]
    for v in vs:
        if not (v == prev or (math.isnan(v) and math.isnan(prev))):
            count += 1
        prev = v
    return float(count)


def _kahan_inc(inc: float, total: float, c: float) -> tuple[float, float]:
    """One step of Neumaier's compensated summation, as Prometheus' ``kahanSumInc``."""
    t = total + inc
    if abs(total) >= abs(inc):
        c += (total - t) + inc
    else:
        c += (inc - t) + total
    return t, c


def _regression(ts: Sequence[int], vs: Sequence[float], intercept_ms: int) -> tuple[float, float]:
    """Least-squares slope (per second) and the intercept at ``intercept_ms``."""
    n = 0.0
    sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    init = vs[0]
    const = True
    for t, v in zip(ts, vs, strict=True):
        if const and v != init:
            const = False
        n += 1.0
        x = (t - intercept_ms) / 1e3
        sx, cx = _kahan_inc(x, sx, cx)
        sy, cy = _kahan_inc(v, sy, cy)
        sxy, cxy = _kahan_inc(x * v, sxy, cxy)
        sx2, cx2 = _kahan_inc(x * x, sx2, cx2)
    if const:
        return (math.nan, math.nan) if math.isinf(init) else (0.0, init)
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = div(cov, var)
    return slope, sy / n - slope * sx / n


def _deriv(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    if len(vs) < 2:
        return None
    return _regression(ts, vs, ts[0])[0]


def _predict_linear(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    if len(vs) < 2:
        return None
    slope, intercept = _regression(ts, vs, w.at)
    return slope * w.param + intercept


def _avg(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    # An incremental mean, so values near the float64 limit do not overflow a sum.
    mean = 0.0
    count = 0.0
    isinf = math.isinf  # a local: this loop runs once per sample of every window
    for v in vs:
        count += 1
        if isinf(mean):
            if isinf(v) and (mean > 0) == (v > 0):
                continue  # Inf of the same sign: the mean is already right
            if not isinf(v) and v == v:  # noqa: PLR0124 - v is not NaN
                continue  # an infinite mean stays infinite
        mean += v / count - mean / count
    return mean


def _sum(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return sum(vs, 0.0)


def _count(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return float(len(vs))


def _min(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    out = vs[0]
    for v in vs:
        if v < out or out != out:  # noqa: PLR0124 - out is NaN: any value replaces it
            out = v
    return out


def _max(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    out = vs[0]
    for v in vs:
        if v > out or out != out:  # noqa: PLR0124 - out is NaN: any value replaces it
            out = v
    return out


def _variance(vs: Sequence[float]) -> float:
    count = 0.0
    mean = c_mean = aux = c_aux = 0.0
    for v in vs:
        count += 1
        delta = v - (mean + c_mean)
        mean, c_mean = _kahan_inc(delta / count, mean, c_mean)
        aux, c_aux = _kahan_inc(delta * (v - (mean + c_mean)), aux, c_aux)
    return (aux + c_aux) / count


def _stdvar(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return _variance(vs)


def _stddev(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    var = _variance(vs)
    return math.sqrt(var) if var >= 0 else math.nan


def quantile(q: float, values: Sequence[float]) -> float:
    """Prometheus' ``quantile``: linear interpolation between the two nearest ranks,
    NaN sorted lowest; -Inf/+Inf for ``q`` outside [0, 1]."""
    if not values or math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    ordered = sorted(values, key=lambda v: (not math.isnan(v), v))
    n = len(ordered)
    rank = q * (n - 1)
    lower = max(0, math.floor(rank))
    upper = min(n - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def _quantile(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return quantile(w.param, vs)


def _last(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return vs[-1]


def _present(ts: Sequence[int], vs: Sequence[float], w: Frame) -> float | None:
    return 1.0


RANGE_FUNCTIONS: dict[str, RangeFunction] = {
    "rate": RangeFunction(_rate, extrapolation=(True, True)),
    "increase": RangeFunction(_increase, extrapolation=(True, False)),
    "delta": RangeFunction(_delta, extrapolation=(False, False)),
    "irate": RangeFunction(_irate),
    "idelta": RangeFunction(_idelta),
    "resets": RangeFunction(_resets),
    "changes": RangeFunction(_changes),
    "deriv": RangeFunction(_deriv),
    "predict_linear": RangeFunction(_predict_linear),
    "avg_over_time": RangeFunction(_avg),
    "sum_over_time": RangeFunction(_sum),
    "count_over_time": RangeFunction(_count),
    "min_over_time": RangeFunction(_min),
    "max_over_time": RangeFunction(_max),
    "stddev_over_time": RangeFunction(_stddev),
    "stdvar_over_time": RangeFunction(_stdvar),
    "quantile_over_time": RangeFunction(_quantile, matrix_arg=1),
    "last_over_time": RangeFunction(_last, keep_name=True),
    "present_over_time": RangeFunction(_present),
}
