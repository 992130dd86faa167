"""PromQL functions over instant vectors and scalars (Prometheus 2.42 semantics).

Each entry of :data:`FUNCTIONS` takes the already evaluated arguments (an instant
vector as ``list[(labels, value)]``, a scalar as ``float``, a string as ``str``), the
evaluation time in ms and the engine's :class:`~agent.promql.values.Memos` (where
``histogram_quantile`` keeps its bucket keys and ``label_replace`` its compiled
regexps), and returns a vector or a float. Functions that need the
unevaluated argument (``absent``, ``timestamp``) or a range vector live in the engine
and in :mod:`agent.promql.rangefuncs`.

Which results keep ``__name__`` follows Prometheus: math, clamping, rounding and date
functions drop it; ``sort``, ``label_replace`` and ``label_join`` keep it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.errors import PromQLError, RegexError
from agent.gocompat.math import UNARY, div, floor, fmax, fmin, int64_ok
from agent.gocompat.regex import Regexp, compile_anchored, expand
from agent.promql.buckets import histogram_quantile
from agent.promql.nodes import VectorSel
from agent.promql.values import Memos, Vec, check_unique, drop_names
from agent.series import METRIC_NAME, Labels, is_label_name

__all__ = ["FUNCTIONS", "InstantFn", "absent_labels", "trunc_div"]

InstantFn = Callable[[list[Any], int, Memos], "Vec | float"]


def trunc_div(a: int, b: int) -> int:
    """Go's integer division (truncates towards zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def _unary(name: str) -> InstantFn:
    fn = UNARY[name]

    def apply(args: list[Any], ts: int, memos: Memos) -> Vec:
        return drop_names((labels, fn(v)) for labels, v in args[0])

    return apply


def _round(args: list[Any], ts: int, memos: Memos) -> Vec:
    to_nearest = args[1] if len(args) > 1 else 1.0
    inverse = 1.0 / to_nearest if to_nearest else math.copysign(math.inf, to_nearest)
    return drop_names((labels, div(floor(v * inverse + 0.5), inverse)) for labels, v in args[0])


def _clamp(args: list[Any], ts: int, memos: Memos) -> Vec:
    vec, low, high = args
    if high < low:
        return []
    return drop_names((labels, fmax(low, fmin(high, v))) for labels, v in vec)


def _clamp_max(args: list[Any], ts: int, memos: Memos) -> Vec:
    return drop_names((labels, fmin(args[1], v)) for labels, v in args[0])


def _clamp_min(args: list[Any], ts: int, memos: Memos) -> Vec:
    return drop_names((labels, fmax(args[1], v)) for labels, v in args[0])


def _set_label(labels: Labels, name: str, value: str) -> Labels:
    """``labels`` with ``name`` set to ``value``, or removed when ``value`` is empty."""
    rest = [p for p in labels if p[0] != name]
    if value:
        rest.append((name, value))
        rest.sort()
    return tuple(rest)


def _regex(text: str) -> Regexp:
    """``label_replace``'s regexp, ``^(?:regex)$`` in RE2 as in Prometheus, compiled once per engine."""
    try:
        return compile_anchored(text, what="label_replace()")
    except RegexError as exc:
        raise PromQLError(f"invalid regular expression in label_replace(): {text}") from exc


def _label_replace(args: list[Any], ts: int, memos: Memos) -> Vec:
    vec, dst, repl, src, regex = args
    pattern = memos.of(_regex)[regex]
    if not is_label_name(dst):
        raise PromQLError(f"invalid destination label name in label_replace(): {dst}")
    out: Vec = []
    for labels, v in vec:
        value = next((lv for ln, lv in labels if ln == src), "")
        m = pattern.search(value)
        out.append((labels if m is None else _set_label(labels, dst, expand(repl, m)), v))
    return check_unique(out)


def _label_join(args: list[Any], ts: int, memos: Memos) -> Vec:
    vec, dst, sep, *srcs = args
    for src in srcs:
        if not is_label_name(src):
            raise PromQLError(f"invalid source label name in label_join(): {src}")
    if not is_label_name(dst):
        raise PromQLError(f"invalid destination label name in label_join(): {dst}")
    out: Vec = []
    for labels, v in vec:
        d = dict(labels)
        out.append((_set_label(labels, dst, sep.join(d.get(s, "") for s in srcs)), v))
    return check_unique(out)


def _vector(args: list[Any], ts: int, memos: Memos) -> Vec:
    return [((), args[0])]


def _scalar(args: list[Any], ts: int, memos: Memos) -> float:
    vec: Vec = args[0]
    return vec[0][1] if len(vec) == 1 else math.nan


def _time(args: list[Any], ts: int, memos: Memos) -> float:
    return ts / 1000


def _pi(args: list[Any], ts: int, memos: Memos) -> float:
    return math.pi


def _sort(args: list[Any], ts: int, memos: Memos) -> Vec:
    """Ascending, NaN last."""
    return sorted(args[0], key=lambda s: (math.isnan(s[1]), s[1]))


def _sort_desc(args: list[Any], ts: int, memos: Memos) -> Vec:
    """Descending, NaN last."""
    return sorted(args[0], key=lambda s: (math.isnan(s[1]), -s[1]))


@dataclass(frozen=True, slots=True)
class _Civil:
    """A UTC date and time of day, from Unix seconds, for any int64 (Go's range)."""

    year: int
    month: int
    day: int
    day_of_year: int
    day_of_week: int
    days_in_month: int
    hour: int
    minute: int


#: What Go on amd64 computes for ``time.Unix(int64(x), 0)`` when ``x`` is NaN, ±Inf or
#: outside int64 (the conversion yields the "integer indefinite" value and the date
#: wraps to 292277026596-12-04 15:30 UTC, a Sunday). Prometheus 2.42 returns these.
_GO_INDEFINITE = _Civil(292277026596, 12, 4, 339, 0, 31, 15, 30)
_MONTH_DAYS = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _days_from_civil(y: int, m: int, d: int) -> int:
    y -= m <= 2
    era = y // 400
    yoe = y - era * 400
    doy = (153 * (m - 3 if m > 2 else m + 9) + 2) // 5 + d - 1
    return era * 146097 + yoe * 365 + yoe // 4 - yoe // 100 + doy - 719468


def _civil(seconds: float) -> _Civil:
    """Proleptic Gregorian calendar arithmetic on integers (``datetime`` stops at year
    9999; Go's ``time`` does not)."""
    if not int64_ok(seconds):
        return _GO_INDEFINITE
    sec = math.trunc(seconds)
    days, rem = divmod(sec, 86_400)
    z = days + 719468
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day = doy - (153 * mp + 2) // 5 + 1
    month = mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    dim = 29 if month == 2 and leap else _MONTH_DAYS[month - 1]
    return _Civil(
        year, month, day, days - _days_from_civil(year, 1, 1) + 1, (days + 4) % 7, dim, rem // 3600, rem % 3600 // 60
    )


def _date(part: Callable[[_Civil], int]) -> InstantFn:
    def apply(args: list[Any], ts: int, memos: Memos) -> Vec:
        if not args:
            return [((), float(part(_civil(trunc_div(ts, 1000)))))]
        return drop_names((labels, float(part(_civil(v)))) for labels, v in args[0])

    return apply


def _histogram_quantile(args: list[Any], ts: int, memos: Memos) -> Vec:
    return histogram_quantile(args[0], args[1], memos)


def absent_labels(sel: VectorSel | None) -> Labels:
    """The labels ``absent()`` reports: those fixed by one ``=`` matcher each; a label
    with several matchers (``job="a",job="b"``) is left out, as in Prometheus."""
    if sel is None:
        return ()
    out: dict[str, str] = {}
    seen: set[str] = set()
    for m in sel.matchers:
        if m.name == METRIC_NAME:
            continue
        if m.op == "=" and m.name not in seen:
            out[m.name] = m.value
            seen.add(m.name)
        else:
            out.pop(m.name, None)
    return tuple(sorted(out.items()))


FUNCTIONS: dict[str, InstantFn] = {
    **{name: _unary(name) for name in UNARY},
    "round": _round,
    "clamp": _clamp,
    "clamp_max": _clamp_max,
    "clamp_min": _clamp_min,
    "label_replace": _label_replace,
    "label_join": _label_join,
    "vector": _vector,
    "scalar": _scalar,
    "time": _time,
    "pi": _pi,
    "sort": _sort,
    "sort_desc": _sort_desc,
    "histogram_quantile": _histogram_quantile,
    "year": _date(lambda c: c.year),
    "month": _date(lambda c: c.month),
    "day_of_month": _date(lambda c: c.day),
    "day_of_year": _date(lambda c: c.day_of_year),
    "day_of_week": _date(lambda c: c.day_of_week),
    "days_in_month": _date(lambda c: c.days_in_month),
    "hour": _date(lambda c: c.hour),
    "minute": _date(lambda c: c.minute),
}
