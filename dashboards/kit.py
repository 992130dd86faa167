"""The conventions every dashboard follows, in one place, over grafana-foundation-sdk's builders.

* The data source is the ``${datasource}`` variable (type datasource, plugin prometheus) on
  every panel and every query: never a data-source uid.
* Filters are chained multi-select query variables with an All option (``job`` then
  ``model_name`` then ``instance``, or ``job``, ``instance``, ``gpu``): each one's
  ``label_values()`` is filtered by the ones before it. All is the regex ``.+``, so a
  series without the label (the production-stack router's ``vllm:num_requests_*``, which
  has no ``model_name``) is never counted.
* Every panel has a unit and a description that says what the panel shows, what a bad
  value means, and links the runbooks (``runbooks/<Name>.md``, checked to exist).
* Threshold lines come from :mod:`dashboards.rules`, so they are the alerts' numbers.
* Every dashboard carries the shared tag and a drop-down of links to the others.

:class:`Board` holds one dashboard being built: it numbers panels and ``refId`` s, and lays
panels out left to right in rows of 24 columns (the SDK's own layout).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.variants import Dataquery
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

__all__ = [
    "ALL",
    "RUNBOOK_BASE",
    "TAG",
    "Board",
    "Column",
    "Q",
    "Var",
    "runbook_link",
]

TAG = "sre-agent"
RUNBOOK_BASE = "https://github.com/sre-agent/sre-agent/blob/main/runbooks/"
RUNBOOKS_DIR = Path(__file__).resolve().parent.parent / "runbooks"
#: What a variable's All option stands for in queries: any non-empty value.
ALL = ".+"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
_GRAFANA = dm.DataSourceRef(type_val="grafana", uid="-- Grafana --")  # the built-in annotations source
_GREEN, _YELLOW, _ORANGE, _RED = "green", "yellow", "orange", "red"

PanelBuilder = timeseries.Panel | stat.Panel | table.Panel


def runbook_link(name: str) -> str:
    """A markdown link to ``runbooks/<name>.md``; the file must exist."""
    if not (RUNBOOKS_DIR / f"{name}.md").is_file():
        raise FileNotFoundError(f"no runbook runbooks/{name}.md")
    return f"[{name}]({RUNBOOK_BASE}{name}.md)"


@dataclass(frozen=True, slots=True)
class Q:
    """One PromQL query of a panel and its legend."""

    expr: str
    legend: str = ""


@dataclass(frozen=True, slots=True)
class Column:
    """One value column of a table: an instant query merged on its labels."""

    header: str
    expr: str
    unit: str


@dataclass(frozen=True, slots=True)
class Var:
    """A chained query variable: its values are ``label`` of ``metric``, filtered by the variables before it."""

    name: str
    label: str
    metric: str
    multi: bool = True


class Board:
    """One dashboard under construction."""

    def __init__(self, uid: str, title: str, description: str, *, tags: Sequence[str], variables: Sequence[Var],
                 fixed: str = "") -> None:  # fmt: skip
        # fixed: matchers every selector carries besides the variables (model_name!="" for vLLM)
        self.uid = uid
        self._vars = list(variables)
        self._fixed = fixed
        self._next_id = 1
        self._b = (
            db.Dashboard(title).uid(uid).description(description).tags([TAG, *tags]).editable()
            .tooltip(dm.DashboardCursorSync.CROSSHAIR).time("now-1h", "now").refresh("30s").timezone("browser")
            .annotation(db.AnnotationQuery().name("Annotations & Alerts").datasource(_GRAFANA).enable(True)
                        .hide(True).icon_color("rgba(0, 211, 255, 1)").type("dashboard").built_in(1))
            .link(db.DashboardLink("sre-agent dashboards").type(dm.DashboardLinkType.DASHBOARDS).tags([TAG])
                  .as_dropdown(True).keep_time(True).include_vars(False))
            .with_variable(db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
        )  # fmt: skip
        for i, var in enumerate(self._vars):
            self._b.with_variable(self._variable(var, self._vars[:i]))

    # -- variables and selectors ----------------------------------------------------------------
    def _variable(self, var: Var, before: Sequence[Var]) -> db.QueryVariable:
        query = f"label_values({self.sel(var.metric, upto=before)}, {var.label})"
        v = (db.QueryVariable(var.name).label(var.name).datasource(DATASOURCE).query(query)
             .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dm.VariableSort.ALPHABETICAL_ASC)
             .multi(var.multi).include_all(True).all_value(ALL)
             .current(dm.VariableOption(selected=True, text=["All"], value=["$__all"])))  # fmt: skip
        return v

    def sel(self, metric: str, extra: str = "", *, upto: Sequence[Var] | None = None) -> str:
        """``metric{<fixed>, <label>=~"$<var>" for each variable, <extra>}``."""
        vars_ = self._vars if upto is None else upto
        parts = [p for p in (self._fixed, *(f'{v.label}=~"${v.name}"' for v in vars_), extra) if p]
        return f"{metric}{{{', '.join(parts)}}}" if parts else metric

    # -- layout -------------------------------------------------------------------------------
    def row(self, title: str) -> None:
        self._b.with_row(db.Row(title).id(self._id()))

    def _id(self) -> int:
        n = self._next_id
        self._next_id += 1
        return n

    def _common(self, p: PanelBuilder, title: str, *, unit: str, what: str, bad: str, runbooks: Sequence[str],
                width: int, height: int) -> None:  # fmt: skip
        if not runbooks:
            raise ValueError(f"{self.uid}/{title}: a panel links at least one runbook")
        links = ", ".join(runbook_link(r) for r in runbooks)
        p.id(self._id()).title(title).datasource(DATASOURCE).unit(unit).span(width).height(height)
        p.description(f"{what}\n\n**Bad:** {bad}\n\n**Runbook:** {links}")

    @staticmethod
    def _thresholds(steps: Sequence[tuple[float, str]], base: str = _GREEN) -> db.ThresholdsConfig:
        return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
            [dm.Threshold(value=None, color=base), *(dm.Threshold(value=v, color=c) for v, c in steps)])

    @staticmethod
    def _targets(queries: Sequence[Q], *, instant: bool = False) -> list[Builder[Dataquery]]:
        out: list[Builder[Dataquery]] = []
        for i, q in enumerate(queries):
            t = prometheus.Dataquery().expr(q.expr).ref_id(chr(ord("A") + i)).datasource(DATASOURCE)
            t.legend_format(q.legend or "__auto")
            if instant:
                t.instant().format(pm.PromQueryFormat.TABLE)
            else:
                t.range()
            out.append(t)
        return out

    def timeseries(
        self, title: str, *, unit: str, what: str, bad: str, runbooks: Sequence[str], queries: Sequence[Q],
        thresholds: Sequence[tuple[float, str]] = (), min_: float | None = None, max_: float | None = None,
        stack: bool = False, bars: bool = False, width: int = 12, height: int = 8,
    ) -> None:  # fmt: skip
        """A time-series panel; ``thresholds`` are drawn as dashed lines."""
        p = timeseries.Panel().targets(self._targets(queries)).fill_opacity(10 if not stack else 40)
        self._common(p, title, unit=unit, what=what, bad=bad, runbooks=runbooks, width=width, height=height)
        p.legend(cb.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM)
                 .show_legend(True))  # fmt: skip
        p.tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING))
        if thresholds:
            p.thresholds(self._thresholds(thresholds))
            p.thresholds_style(cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
        if min_ is not None:
            p.min(min_)
        if max_ is not None:
            p.max(max_)
        if stack:
            p.stacking(cb.StackingConfig().mode(cm.StackingMode.NORMAL))
        if bars:
            p.draw_style(cm.GraphDrawStyle.BARS)
        self._b.with_panel(p)

    def stat(
        self, title: str, *, unit: str, what: str, bad: str, runbooks: Sequence[str], queries: Sequence[Q],
        thresholds: Sequence[tuple[float, str]] = (), base: str = _GREEN, width: int = 6, height: int = 4,
    ) -> None:  # fmt: skip
        """A stat panel showing each series' last value, coloured by ``thresholds``."""
        p = stat.Panel().targets(self._targets(queries)).color_mode(cm.BigValueColorMode.BACKGROUND)
        self._common(p, title, unit=unit, what=what, bad=bad, runbooks=runbooks, width=width, height=height)
        p.graph_mode(cm.BigValueGraphMode.AREA)
        p.reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        p.thresholds(self._thresholds(thresholds, base))
        self._b.with_panel(p)

    def table(
        self, title: str, *, what: str, bad: str, runbooks: Sequence[str], columns: Sequence[Column],
        hide: Sequence[str] = (), width: int = 24, height: int = 8, unit: str = "none",
    ) -> None:  # fmt: skip
        """A table of instant queries merged on their labels, one renamed value column per query."""
        p = table.Panel().targets(self._targets([Q(c.expr) for c in columns], instant=True))
        self._common(p, title, unit=unit, what=what, bad=bad, runbooks=runbooks, width=width, height=height)
        rename = {("Value" if len(columns) == 1 else f"Value #{chr(ord('A') + i)}"): c.header
                  for i, c in enumerate(columns)}  # fmt: skip
        p.with_transformation(dm.DataTransformerConfig(id_val="merge", options={}))
        p.with_transformation(dm.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, **dict.fromkeys(hide, True)}, "renameByName": rename}))
        for c in columns:
            p.override_by_name(c.header, [dm.DynamicConfigValue(id_val="unit", value=c.unit)])
        self._b.with_panel(p)

    # -- output -------------------------------------------------------------------------------
    def to_json(self) -> str:
        """The dashboard as Grafana's JSON model: sorted keys, two-space indent, one final newline."""
        return json.dumps(self._b.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"
