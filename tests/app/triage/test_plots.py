"""agent.app.triage.plots: text that comes from data (label values, rule names, a source's error message) is drawn
literally, never as matplotlib mathtext or TeX: a PNG comes back whatever it holds, each text as wide as the
same characters set literally; the HTML page around the plots keeps the same text escaped."""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from agent.act.notification import fingerprint
from agent.act.state import StateDB
from agent.app.triage import build, render
from agent.app.triage.facts import read_state
from agent.app.triage.plots import draw, figure
from agent.app.triage.series import Line, PlotData, PlotSpec, Query, Window

T0 = 1_780_000_000_000
PAYLOADS = [r"$\frac{1}{0}$", "$x^{$", r"\$", "cost $5 per $", r"$\undefinedcommand$", r"a\nb $\alpha$ \\",
            "$" + "x" * 600 + "$", "<script>alert(1)</script>$<b>$"]
PNG = b"\x89PNG\r\n\x1a\n"


def _data(text: str, *, empty: bool) -> PlotData:
    spec = PlotSpec("firing", f"{text}: the firing series", text, (Query("up", "value"),), threshold=1.0,
                    threshold_label=text, caption=text)
    if empty:
        return PlotData(spec, errors=[f"range query failed: {text}"])
    return PlotData(spec, [Line(text, [T0, T0 + 60_000], [0.5, 2.0], "value"),
                           Line(text[:40], [T0, T0 + 60_000], [1.0, 1.0], "threshold")])


def _literal_width(fig: Figure, t: Text) -> float:
    """The width of ``t``'s characters set literally, in the same font and size."""
    ref = fig.text(0, 0, t.get_text(), fontproperties=t.get_fontproperties(), rotation=t.get_rotation(),
                   parse_math=False, usetex=False)
    width: float = ref.get_window_extent(fig.canvas.get_renderer()).width  # type: ignore[attr-defined]
    ref.remove()
    return width


@pytest.mark.parametrize("empty", [False, True])
@pytest.mark.parametrize("text", PAYLOADS)
def test_data_text_is_drawn_literally(text: str, empty: bool) -> None:
    """A legend, title, axis label, threshold label or empty-plot reason holding $ or \\ draws as those characters."""
    w = Window(T0 - 300_000, T0 + 300_000, 15_000)
    png = draw(_data(text, empty=empty), w, pending_ms=T0 - 60_000, fired_ms=T0, resolved_ms=0)
    assert png.startswith(PNG)
    fig = figure(_data(text, empty=empty), w, pending_ms=T0 - 60_000, fired_ms=T0, resolved_ms=0)
    FigureCanvasAgg(fig).draw()  # type: ignore[no-untyped-call]  # matplotlib's backends are untyped
    texts = [t for t in fig.findobj(Text) if isinstance(t, Text) and ("$" in t.get_text() or "\\" in t.get_text())]
    assert texts  # the payload is on the figure
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for t in texts:
        assert t.get_window_extent(renderer).width == pytest.approx(_literal_width(fig, t), rel=0.02), t.get_text()


@pytest.mark.parametrize("text", PAYLOADS)
def test_hostile_labels_make_a_report_whose_page_escapes_them(text: str, tmp_path: Path) -> None:
    """A whole report with the payload as label value: a PNG per plot, the page's text holds it verbatim, no element."""
    db = StateDB(tmp_path / "state.db")
    labels = {"alertname": "KVHigh", "instance": text, "job": text}
    iid = db.incidents.open(fingerprint=fingerprint(labels), alertname="KVHigh", labels=labels, severity="warning",
                            summary=text, started_ms=T0)

    def answer(expr: str, start_ms: int, end_ms: int, step_ms: int) -> list[tuple[dict[str, str], list[int],
                                                                                  list[float]]]:
        return [({"instance": text, "Hostname": text, "gpu": text}, [start_ms, end_ms], [1.0, 2.0])]

    report = build(read_state(db, iid, now_ms=T0 + 90_000), [], now_ms=T0 + 90_000, query=answer, source=text,
                   images=True)
    db.close()
    assert len(report.images) == len(report.plots) == 5 and all(png.startswith(PNG) for png in report.images)
    page = render(report, "html")

    class _Page(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.tags: list[str] = []
            self.text: list[str] = []

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            self.tags.append(tag)

        def handle_data(self, data: str) -> None:
            self.text.append(data)

    parser = _Page()
    parser.feed(page)
    assert "script" not in parser.tags and "b" not in parser.tags
    assert text[:40] in "".join(parser.text)


@pytest.mark.parametrize("values", [[1e308, -1e308], [1.7e308, 1.7e308], [-1.7e308, 1e-300], [5e-324, 0.0]])
@pytest.mark.parametrize("percent", [False, True])
def test_values_matplotlib_cannot_scale_draw_an_empty_plot_that_says_why(values: list[float], percent: bool) -> None:
    """Finite values whose range overflows matplotlib's tick arithmetic give a PNG, never an exception."""
    spec = PlotSpec("kv", "KV-cache usage", "%", (Query("up", ""),), percent=percent)
    data = PlotData(spec, [Line("a", [T0, T0 + 60_000], values)])
    png = draw(data, Window(T0 - 300_000, T0 + 300_000, 15_000), pending_ms=None, fired_ms=T0, resolved_ms=0)
    assert png.startswith(PNG)
    assert not data.errors or (len(data.errors) == 1 and "the series could not be drawn" in data.errors[0])
