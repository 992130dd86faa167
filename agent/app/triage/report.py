"""The triage report: facts, timeline, plots and summary of one incident, put together.

:func:`build` is the whole pipeline for a caller without an event loop (the CLI): facts from a
:class:`~agent.app.triage.facts.StateRead`, the window, the plots' series through one
``RangeQuery`` (or none: a report without plots, saying why), the PNGs when the output is HTML.
The daemon runs the same steps split between its event loop, its state thread and worker threads
(:mod:`agent.app.triage.service`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from agent.act.incident_summary import one_line
from agent.app.triage.facts import Facts, StateRead, facts
from agent.app.triage.plots import draw
from agent.app.triage.series import PlotData, PlotSpec, RangeQuery, Window, fetch, plot_specs, window
from agent.app.triage.summary import summary
from agent.app.triage.timeline import Entry, timeline
from agent.rules.files import GroupSpec

__all__ = ["Report", "assemble", "build", "draw_all", "no_data"]


@dataclass
class Report:
    """Everything a format renders. ``images``: one PNG per plot (HTML only; empty otherwise).
    ``source``: where the series came from (``the agent's store``, the source's URL, or why none)."""

    facts: Facts
    timeline: list[Entry]
    window: Window
    plots: list[PlotData]
    summary: list[str]
    headline: str
    source: str
    images: list[bytes] = field(default_factory=list)

    @property
    def shown_start_ms(self) -> int:
        """Where the plots start: the window's start, or the first sample if later (a young agent)."""
        firsts = [line.ts[0] for p in self.plots for line in p.lines if line.ts]
        start = max(self.window.start_ms, min(firsts, default=self.window.start_ms))
        return min(start, self.facts.start_ms)


def assemble(f: Facts, w: Window, plots: list[PlotData], source: str) -> Report:
    return Report(f, timeline(f), w, plots, summary(f, plots), one_line(f.incident, now_ms=f.now_ms), source)


def no_data(specs: list[PlotSpec], reason: str) -> list[PlotData]:
    """Plots without series (no source to ask), each saying why."""
    return [PlotData(s, errors=[reason]) for s in specs]


def draw_all(report: Report) -> list[bytes]:
    """Every plot as PNG (CPU-heavy: a worker thread in the daemon)."""
    f = report.facts
    return [draw(p, report.window, pending_ms=f.pending_ms, fired_ms=f.incident.started_ms,
                 resolved_ms=f.incident.resolved_ms, start_ms=report.shown_start_ms) for p in report.plots]


def build(state: StateRead, groups: Iterable[GroupSpec], *, now_ms: int, query: RangeQuery | None, source: str,
          images: bool, min_step_ms: int = 1000) -> Report:
    """The report of ``state``'s incident; ``query`` None: plots without data, ``source`` says why."""
    f = facts(state, groups, now_ms=now_ms)
    w = window(f, min_step_ms=min_step_ms)
    specs = plot_specs(f, w)
    plots = [fetch(s, w, query, f.labels) for s in specs] if query is not None else no_data(specs, source)
    report = assemble(f, w, plots, source)
    if images:
        report.images = draw_all(report)
    return report
