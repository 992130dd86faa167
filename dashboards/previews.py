"""Render every dashboard from real query results to ``dashboards/previews/<uid>.png``.

There is no Grafana server in Debian, so this draws what Grafana would: it runs the same stack
as the backend tests (``tests/dashboards/stack.py``: the simulated fleets with their GPUs, the
agent, Prometheus 2.42 with our recording rules, optionally VictoriaMetrics), lets the
scenarios play for ``--duration`` seconds, range-queries every panel's targets with every
variable at All, and lays the panels out on the dashboard's own 24-column grid with
matplotlib: titles, units on the axes, legends from ``legendFormat``, the thresholds as
dashed lines, stat panels as their last value, tables as tables. A panel whose queries
return nothing is drawn with "No data" in red and listed on stderr (exit status 1).

    python -m dashboards.previews [--duration 120] [--backend prometheus] [--out dashboards/previews]

Needs the ``previews`` extra (matplotlib) and the test extra (the stack is test code), plus
Debian's ``prometheus`` (and ``victoria-metrics`` for ``--backend victoriametrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import math
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.ticker import EngFormatter
from PIL import Image

from tests.dashboards.queries import ALL_VALUES, dashboards, panels, substitute
from tests.dashboards.stack import Stack

__all__ = ["main", "render_dashboard"]

OUT = Path(__file__).resolve().parent / "previews"
STEP_S = 2.0
GRID_COLS = 24
UNIT_IN = 0.27  # inches per grid row (Grafana draws 30 px per row)
WIDTH_IN = 15.0
DPI = 80
BG, PANEL_BG, FG, MUTED = "#111217", "#181b1f", "#d8d9da", "#8e8e8e"
COLORS = ("#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a",
          "#37872d", "#c4162a", "#1f60c4", "#fa6400")  # fmt: skip
NAMED = {"green": "#73bf69", "yellow": "#fade2a", "red": "#f2495c", "orange": "#ff9830", "blue": "#5794f2",
         "purple": "#b877d9", "dark-red": "#c4162a", "semi-dark-orange": "#fa6400"}  # fmt: skip
#: Grafana unit id -> (axis label, factor applied to values).
UNITS: Mapping[str, tuple[str, float]] = {
    "percentunit": ("%", 100.0), "percent": ("%", 1.0), "s": ("seconds", 1.0), "ms": ("ms", 1.0),
    "reqps": ("requests/s", 1.0), "count:tok/s": ("tokens/s", 1.0), "cps": ("per second", 1.0),
    "mbytes": ("MiB", 1.0), "celsius": ("°C", 1.0), "watt": ("W", 1.0), "rotmhz": ("MHz", 1.0),
    "KiBs": ("KiB/s", 1.0), "GBs": ("GB/s", 1.0), "bool_on_off": ("off / on", 1.0), "short": ("", 1.0),
    "none": ("", 1.0), "bytes": ("bytes", 1.0),
}  # fmt: skip
_TEMPLATE = re.compile(r"\{\{\s*(\w+)\s*\}\}")

Series = tuple[str, dict[str, str], list[float], list[float]]  # legend, labels, times, values


def _legend(fmt: str, labels: Mapping[str, str]) -> str:
    if not fmt or fmt == "__auto":
        name = labels.get("__name__", "")
        rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
        return f"{name}{{{rest}}}" if rest or not name else name
    return _TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()


def _unit(panel: Mapping[str, Any]) -> tuple[str, float]:
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or "short"
    return UNITS.get(unit, (unit, 1.0))


def _thresholds(panel: Mapping[str, Any]) -> list[tuple[float, str]]:
    steps = (panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds") or {}).get("steps") or []
    return [(float(s["value"]), NAMED.get(s.get("color", ""), s.get("color", "red")))
            for s in steps if s.get("value") is not None]  # fmt: skip


async def fetch(stack: Stack, backend: str, board: Mapping[str, Any], start: float,
                end: float) -> dict[int, list[list[Series]]]:  # fmt: skip
    """Per panel id, per target: the series of its range query."""
    out: dict[int, list[list[Series]]] = {}
    for panel in panels(board):
        per_target: list[list[Series]] = []
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if not expr:
                continue
            result = await stack.query_range(backend, substitute(expr, ALL_VALUES), start, end, STEP_S)
            series = []
            for s in result:
                pts = [(float(t), float(v)) for t, v in s["values"] if not math.isnan(float(v))]
                if pts:
                    series.append((_legend(target.get("legendFormat", ""), s["metric"]), s["metric"],
                                   [t - end for t, _ in pts], [v for _, v in pts]))  # fmt: skip
            per_target.append(series)
        out[int(panel.get("id", 0))] = per_target
    return out


def _style(ax: Axes, title: str) -> None:
    ax.set_facecolor(PANEL_BG)
    for spine in ax.spines.values():
        spine.set_color("#2c3235")
    ax.tick_params(colors=MUTED, labelsize=7)
    ax.set_title(title, color=FG, fontsize=9, loc="left", pad=4, fontweight="bold")


def _no_data(ax: Axes) -> None:
    ax.text(0.5, 0.5, "No data", color="#f2495c", ha="center", va="center", fontsize=12, transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _timeseries(ax: Axes, panel: Mapping[str, Any], data: list[list[Series]]) -> None:
    label, factor = _unit(panel)
    flat = [s for target in data for s in target]
    for i, (name, _, ts, vs) in enumerate(flat):
        ax.plot([t / 60 for t in ts], [v * factor for v in vs], color=COLORS[i % len(COLORS)], linewidth=1.1,
                label=name if i < 8 else None)  # fmt: skip
    for value, color in _thresholds(panel):
        ax.axhline(value * factor, color=color, linestyle="--", linewidth=1.0, alpha=0.9)
        ax.annotate(f"{value * factor:g}", xy=(1.0, value * factor), xycoords=("axes fraction", "data"),
                    color=color, fontsize=6, ha="right", va="bottom")  # fmt: skip
    if panel.get("fieldConfig", {}).get("defaults", {}).get("unit") == "bool_on_off":
        ax.set_yticks([0, 1], ["off", "on"])
        ax.set_ylim(-0.1, 1.15)
    else:
        values = [v * factor for *_, vs in flat for v in vs]
        if values and max(abs(v) for v in values) >= 1e4:
            ax.yaxis.set_major_formatter(EngFormatter(sep=""))  # 40k, 1.2M: no offset text lost on a dark panel
        else:
            ax.ticklabel_format(axis="y", style="plain", useOffset=False)
        if values and max(values) == min(values):  # a flat line (no errors): whole numbers around it
            ax.set_ylim(values[0] - 1, values[0] + 1)
    ax.set_ylabel(label, color=MUTED, fontsize=7)
    ax.set_xlabel("minutes before now", color=MUTED, fontsize=6, labelpad=1)
    ax.grid(color="#2c3235", linewidth=0.5)
    if flat:
        extra = f" (+{len(flat) - 8} more)" if len(flat) > 8 else ""
        legend = ax.legend(loc="upper left", fontsize=6, frameon=False, labelcolor=FG, ncol=2 if len(flat) > 4 else 1,
                           title=extra or None, title_fontsize=6)  # fmt: skip
        legend.get_title().set_color(MUTED)


def _stat(ax: Axes, panel: Mapping[str, Any], data: list[list[Series]]) -> None:
    width = int(panel.get("gridPos", {}).get("w", 12))
    label, factor = _unit(panel)
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit") or ""
    steps = _thresholds(panel)
    flat = [s for target in data for s in target][:6]
    ax.set_xticks([])
    ax.set_yticks([])
    for i, (name, _, _, vs) in enumerate(flat):
        value = vs[-1]
        if unit == "bool_on_off":
            text, color = ("ON", NAMED["green"]) if value else ("OFF", NAMED["red"])
        else:
            shown = value * factor
            text = f"{shown:.3g}{' ' + label if label and label != '%' else label}"
            color = next((c for v, c in reversed(steps) if value >= v), NAMED["green"] if steps else "#3274d9")
        x0 = i / len(flat)
        ax.add_patch(Rectangle((x0 + 0.01, 0.05), 1 / len(flat) - 0.02, 0.8, color=color, alpha=0.85,
                                   transform=ax.transAxes))  # fmt: skip
        ax.text(x0 + 0.5 / len(flat), 0.52, text, color="white", ha="center", va="center", fontsize=11,
                fontweight="bold", transform=ax.transAxes)  # fmt: skip
        room = max(8, width * 7 // len(flat))  # characters that fit under one value at 6 pt
        shown_name = name
        if len(name) > room:  # the first word (the instance) says most; then its tail (the port)
            first = name.split()[0]
            shown_name = first if len(first) <= room else "…" + first[-(room - 1):]
        ax.text(x0 + 0.5 / len(flat), 0.15, shown_name, color="white", ha="center", va="center", fontsize=6,
                transform=ax.transAxes)  # fmt: skip


def _table(ax: Axes, panel: Mapping[str, Any], data: list[list[Series]]) -> None:
    rename: dict[str, str] = {}
    for t in panel.get("transformations", []):
        rename.update(t.get("options", {}).get("renameByName", {}))
    refs = [t.get("refId", "") for t in panel.get("targets", []) if t.get("expr")]
    columns = [rename.get(f"Value #{r}", f"Value #{r}") for r in refs]
    _, factor = _unit(panel)
    rows: dict[str, list[str]] = {}
    every = [labels for series in data for _, labels, _, _ in series]
    varying = sorted((k for k in set().union(*every) if k != "__name__" and len({lab.get(k) for lab in every}) > 1),
                     key=lambda k: (k != "instance", k))  # fmt: skip
    for col, series in enumerate(data):
        for _, labels, _, vs in series:
            name = " ".join(f"{k}={labels.get(k, '')}" for k in varying) or "value"  # what tells the rows apart
            row = rows.setdefault(name, [""] * len(columns))
            row[col] = f"{vs[-1] * factor:.4g}"
    ax.set_xticks([])
    ax.set_yticks([])
    if not rows:
        return
    keys = sorted(rows)[:8]
    cells = [[k[:60], *rows[k]] for k in keys]
    table = ax.table(cellText=cells, colLabels=["series", *columns], loc="upper center", cellLoc="left",
                     colLoc="left")  # fmt: skip
    table.auto_set_font_size(False)
    table.set_fontsize(6)
    for cell in table.get_celld().values():
        cell.set_facecolor(PANEL_BG)
        cell.set_edgecolor("#2c3235")
        cell.get_text().set_color(FG)


def render_dashboard(board: Mapping[str, Any], data: Mapping[int, list[list[Series]]], path: Path) -> list[str]:
    """Draw one dashboard; returns the titles of panels that had no data."""
    tops = [(p.get("gridPos", {}), p) for p in board.get("panels", [])]
    nested = [(q.get("gridPos", {}), q) for _, p in tops if p.get("type") == "row" for q in p.get("panels", [])]
    placed = tops + nested
    rows_total = max((g.get("y", 0) + g.get("h", 1) for g, _ in placed), default=1) + 2
    fig: Figure = plt.figure(figsize=(WIDTH_IN, rows_total * UNIT_IN), facecolor=BG)
    fig.text(0.01, 1 - 0.9 / rows_total, board.get("title", board.get("uid", "")), color=FG, fontsize=14,
             fontweight="bold", va="center")  # fmt: skip
    fig.text(0.99, 1 - 0.9 / rows_total, "every variable at All · simulated fleet (sre-agent simulate)",
             color=MUTED, fontsize=8, ha="right", va="center")  # fmt: skip
    empty: list[str] = []
    for grid, panel in placed:
        x, y, w, h = grid.get("x", 0), grid.get("y", 0) + 2, grid.get("w", 24), grid.get("h", 8)
        left, width = x / GRID_COLS, w / GRID_COLS
        top = 1 - y / rows_total
        if panel.get("type") == "row":
            fig.text(left + 0.005, top - 0.5 / rows_total, panel.get("title", ""), color=FG, fontsize=11,
                     va="center")  # fmt: skip
            continue
        pad_x, pad_top, pad_bottom = 0.035, 0.75 / rows_total, 0.9 / rows_total
        ax = fig.add_axes((left + pad_x, top - h / rows_total + pad_bottom, width - pad_x - 0.008,
                           h / rows_total - pad_top - pad_bottom))  # fmt: skip
        _style(ax, panel.get("title", ""))
        series = data.get(int(panel.get("id", 0)), [])
        if not any(series):
            _no_data(ax)
            empty.append(str(panel.get("title", "")))
            continue
        kind = panel.get("type")
        if kind == "stat":
            _stat(ax, panel, series)
        elif kind == "table":
            _table(ax, panel, series)
        else:
            _timeseries(ax, panel, series)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=DPI, facecolor=BG)
    plt.close(fig)
    # 128 colours are plenty for flat panels and lines, and keep each PNG a fraction of the RGBA size
    Image.open(buffer).convert("RGB").quantize(colors=128).save(path, optimize=True)
    return empty


async def run(duration: float, backend: str, out: Path, only: Sequence[str], speed: float) -> int:
    boards = {uid: b for uid, b in dashboards().items() if not only or uid in only}
    failed = 0
    with tempfile.TemporaryDirectory(prefix="sre-agent-previews-") as tmp:
        async with Stack(Path(tmp), speed=speed) as stack:
            start = time.time()
            print(f"stack up; letting the scenarios play for {duration:g}s", file=sys.stderr)
            await asyncio.sleep(duration)  # a recording of a run, not a test condition: wall time is the point
            end = time.time()
            for uid, board in boards.items():
                data = await fetch(stack, backend, board, start, end)
                empty = render_dashboard(board, data, out / f"{uid}.png")
                size = (out / f"{uid}.png").stat().st_size // 1024
                print(f"{uid}: {out / f'{uid}.png'} ({size} KiB)" + (f"; no data: {empty}" if empty else ""))
                failed += len(empty)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dashboards.previews", description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=120.0, help="seconds of scenario to show (default %(default)s)")
    p.add_argument("--speed", type=float, default=5.0,
                   help="simulated seconds per second (default %(default)s: the surge begins after 12 s)")
    p.add_argument("--backend", choices=["prometheus", "victoriametrics"], default="prometheus")
    p.add_argument("--out", type=Path, default=OUT, help="where the PNGs go (default dashboards/previews)")
    p.add_argument("uids", nargs="*", help="only these dashboards (default: all)")
    args = p.parse_args(argv)
    return asyncio.run(run(args.duration, args.backend, args.out, args.uids, args.speed))


if __name__ == "__main__":
    sys.exit(main())
