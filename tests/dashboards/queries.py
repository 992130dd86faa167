"""Reading the queries out of a dashboard's JSON, and filling in Grafana's variables as Grafana does.

Shared by the dashboard tests here and by the integration tests that run every panel query
against real Prometheus and VictoriaMetrics; the API (:func:`panel_queries`,
:func:`substitute`, :data:`ALL_VALUES`, :func:`load`, :func:`dashboards`) stays stable.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = ["ALL_VALUES", "DASHBOARDS_DIR", "dashboards", "load", "panel_queries", "panels", "substitute"]

DASHBOARDS_DIR = Path(__file__).resolve().parents[2] / "dashboards"

#: What each variable becomes when the dashboard is opened with every filter at All: the
#: variables' allValue (``.+``), and Grafana's built-in interval variables at a 1-minute
#: rate interval (4 x the 15 s scrape interval, Grafana's own minimum for $__rate_interval).
ALL_VALUES: Mapping[str, str] = {
    "job": ".+",
    "model_name": ".+",
    "instance": ".+",
    "gpu": ".+",
    "datasource": "prometheus",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__range": "1h",
    "__range_s": "3600",
    "__interval_ms": "15000",
}

# $1, $2 ... are label_replace's capture references, not variables (Grafana leaves names it does not know)
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$([A-Za-z_]\w*)")


def substitute(expr: str, values: Mapping[str, str] = ALL_VALUES) -> str:
    """``expr`` with ``$name``, ``${name}``, ``${name:fmt}`` and ``[[name]]`` replaced from ``values``.

    A variable not in ``values`` raises KeyError naming it, so a query never reaches a
    backend with a ``$`` left in it.
    """

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise KeyError(f"variable ${name} has no value (in {expr!r})")
        return values[name]

    return _VAR.sub(one, expr)


def load(path: str | Path) -> dict[str, Any]:
    """One dashboard's JSON model."""
    data: dict[str, Any] = json.loads(Path(path).read_text(encoding="utf-8"))
    return data


def dashboards(directory: Path = DASHBOARDS_DIR) -> dict[str, dict[str, Any]]:
    """Every committed dashboard by uid."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob("*.json")):
        board = load(path)
        out[board["uid"]] = board
    return out


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel that is not a row, including panels inside collapsed rows."""
    for p in dashboard.get("panels", []):
        if p.get("type") == "row":
            yield from (q for q in p.get("panels", []) if q.get("type") != "row")
        else:
            yield p


def panel_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, expr)`` for every Prometheus query of every panel, in dashboard order."""
    out: list[tuple[str, str]] = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            if t.get("expr"):
                out.append((p.get("title", ""), t["expr"]))
    return out
