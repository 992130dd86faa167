"""Drawing the report's plots with matplotlib's Agg canvas: PNG bytes, embedded in the page as data: URIs.

Each plot is its own small figure (one ``<figure>`` in the page, with its own alt text), drawn
with matplotlib's object API (``Figure`` + the Agg canvas, never ``pyplot``'s global state), so
two reports can be drawn in two threads; the caller still serialises drawing with a lock because
matplotlib's font and text caches are shared. What makes them readable, checked on a screenshot:

* the time axis in UTC with a locator that puts 3-5 ticks on a narrow plot (3-8 on the wide one) in
  any window, the labels ``HH:MM``
  (``HH:MM:SS`` under ten minutes), and the axis titled "time (UTC)";
* a y-axis label with the unit; percentages on a fixed 0-100 scale;
* the incident shaded: pending in amber, firing in red (the page says so once), a dashed threshold line;
* every text drawn literally (:func:`_literal`): a ``$`` in a label value is a dollar sign, never mathtext;
* the legend outside the axes (right of the wide plot, under the narrow ones), so it never hides a
  line or a tick label; constrained layout makes the room.
"""

from __future__ import annotations

import io
import math
import textwrap
from datetime import UTC, datetime

from matplotlib import dates as mdates
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator

from agent.app.triage.series import PlotData, Window

__all__ = ["FIRING_COLOR", "PENDING_COLOR", "draw", "figure"]

FIRING_COLOR = "#d62728"
PENDING_COLOR = "#ff9f1c"
_SIZE_IN = (5.2, 2.7)  # a context plot: half the page (about 570 px wide at 110 dpi, as it is shown)
_WIDE_IN = (10.6, 3.0)  # the firing series: the page's width
_DPI = 110
_COLORS = ["#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]


_DAY_MS = 86_400_000


def _epoch_days() -> float:
    """matplotlib's date number of 1970-01-01 (its ``date.epoch`` setting decides; 0.0 by default)."""
    return float(mdates.date2num(datetime(1970, 1, 1, tzinfo=UTC)))  # type: ignore[no-untyped-call]  # untyped


def draw(data: PlotData, w: Window, *, pending_ms: int | None, fired_ms: int, resolved_ms: int,
         start_ms: int | None = None) -> bytes:
    """One plot as PNG bytes, from ``start_ms`` (default: the window's start; every plot of a report starts
    at the same time) to the window's end. ``resolved_ms`` 0: still firing (shaded to the window's end)."""
    def png(d: PlotData) -> bytes:
        buf = io.BytesIO()
        figure(d, w, pending_ms=pending_ms, fired_ms=fired_ms, resolved_ms=resolved_ms,
               start_ms=start_ms).savefig(buf, format="png", dpi=_DPI)
        return buf.getvalue()

    try:
        return png(data)
    except (ArithmeticError, ValueError, RuntimeError) as exc:
        # finite values matplotlib cannot scale (1.7e308: its tick arithmetic overflows): the plot says so, and
        # the reason joins the plot's errors, so the page's text (the figure's alt) says it too
        data.errors.append(f"the series could not be drawn ({exc.__class__.__name__}: {str(exc)[:80]})")
        return png(PlotData(data.spec, errors=data.errors))


def figure(data: PlotData, w: Window, *, pending_ms: int | None, fired_ms: int, resolved_ms: int,
           start_ms: int | None = None) -> Figure:
    """The figure :func:`draw` saves (see there)."""
    start = w.start_ms if start_ms is None else start_ms
    epoch = _epoch_days()

    def _dt(ms: int) -> float:  # a time as matplotlib's date number, so the date locator and formatter read it
        return epoch + ms / _DAY_MS

    spec = data.spec
    wide = spec.key == "firing"
    fig = Figure(figsize=_WIDE_IN if wide else _SIZE_IN, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if pending_ms is not None and pending_ms < fired_ms:
        ax.axvspan(_dt(max(pending_ms, start)), _dt(fired_ms), color=PENDING_COLOR, alpha=0.18, lw=0)
    ax.axvspan(_dt(fired_ms), _dt(resolved_ms or w.end_ms), color=FIRING_COLOR, alpha=0.12, lw=0)
    color = iter(_COLORS * 2)
    for line in data.lines:
        if not line.ts:
            continue
        times = [_dt(t) for t in line.ts]
        values = [v if math.isfinite(v) else math.nan for v in line.values]
        if line.role == "threshold":
            ax.plot(times, values, color=FIRING_COLOR, lw=1.4, ls="--", label=line.label)
        else:
            ax.plot(times, values, color=next(color), lw=1.6 if line.role == "value" else 1.3, label=line.label)
    if spec.threshold is not None:
        ax.axhline(spec.threshold, color=FIRING_COLOR, lw=1.2, ls="--", label=spec.threshold_label or "threshold")
    if data.empty:
        reason = "; ".join(data.errors)[:120] if data.errors else "no data for this incident's series"
        # wrapped here, not with wrap=True: matplotlib measures wrapped text as mathtext whatever parse_math says
        ax.text(0.5, 0.5, textwrap.fill(reason, 60), transform=ax.transAxes, ha="center", va="center", fontsize=9,
                color="#555555")
    ax.set_xlim(_dt(start), _dt(w.end_ms))
    if spec.percent:
        top = max([100.0] + [v for line in data.lines for v in line.values if math.isfinite(v)])
        ax.set_ylim(0, min(top * 1.05, 110))
    else:
        if _non_negative(data):
            ax.set_ylim(bottom=0)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=5))
    span_s = (w.end_ms - start) / 1000
    # matplotlib.dates has no type hints: the two calls below are untyped
    locator = mdates.AutoDateLocator(minticks=3, maxticks=8 if wide else 5, tz=UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_locator(locator)
    formatter = mdates.DateFormatter("%H:%M:%S" if span_s < 600 else "%H:%M", tz=UTC)  # type: ignore[no-untyped-call]
    ax.xaxis.set_major_formatter(formatter)
    ax.set_xlabel("time (UTC)", fontsize=9)
    ax.set_ylabel(_short(spec.ylabel, 40), fontsize=9)
    ax.set_title(_short(spec.title, 110 if wide else 55), fontsize=10.5, loc="left")  # a rule name can be long
    ax.tick_params(labelsize=8.5)
    ax.grid(True, color="#e5e5e5", lw=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles, labels = ax.get_legend_handles_labels()
    labels = [_short(label, 48) for label in labels]  # a legend as wide as the page squeezes the axes to nothing
    if handles:  # outside the axes (constrained layout makes room): right of a wide plot, under a narrow one
        if wide:
            fig.legend(handles, labels, loc="outside right upper", ncol=1, fontsize=8, frameon=False)
        else:
            fig.legend(handles, labels, loc="outside lower center", ncol=min(3, len(labels)), fontsize=8, frameon=False)
    _literal(fig)
    return fig


def _short(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters: a longer title or axis label leaves the plot no room."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _literal(fig: Figure) -> None:
    """Every text on ``fig`` drawn as its characters: titles, axis labels, legend entries and the empty plot's
    reason come from label values, rule names and a source's error messages, and matplotlib would read ``$...$``
    in them as mathtext (an unbalanced ``$`` or an unknown ``\\command`` raises in ``savefig``, a balanced one
    renders as math) and, with ``text.usetex`` set, hand them to TeX. Tick labels, made while drawing, are
    numbers and times the formatters write."""
    for text in fig.findobj(Text):
        assert isinstance(text, Text)
        text.set_usetex(False)
        text.set_parse_math(False)


def _non_negative(data: PlotData) -> bool:
    values = [v for line in data.lines for v in line.values if math.isfinite(v)]
    return bool(values) and min(values) >= 0 and (data.spec.threshold is None or data.spec.threshold >= 0)
