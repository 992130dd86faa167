"""The report as HTML, Markdown or JSON.

HTML and Markdown come from jinja2 templates shipped in the package (``templates/``). The HTML
page stands on its own: its CSS is in a ``<style>`` element, its plots are PNG ``data:`` URIs, it
has no script and loads nothing, so it works saved to a file, offline, and under the strict
Content-Security-Policy :data:`CSP`. Every value is escaped: the HTML environment autoescapes,
links are kept only when they are ``http(s)://`` (a ``javascript:`` runbook URL is shown as text),
and the Markdown filter escapes what Markdown (and the HTML inside it) would interpret, so a label
value holding ``<script>`` stays text in all three formats. JSON carries the facts and the plotted
series (no images) for tools.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import re
from datetime import UTC, datetime
from pathlib import PurePath
from typing import Any

import jinja2
from markupsafe import Markup

from agent.app.triage.facts import facts_json
from agent.app.triage.report import Report

__all__ = ["CONTENT_TYPES", "CSP", "FORMATS", "render"]

FORMATS = ("html", "md", "json")
CONTENT_TYPES = {"html": "text/html; charset=utf-8", "md": "text/markdown; charset=utf-8",
                 "json": "application/json"}
#: What the page needs: its own inline style and data: images, nothing else.
CSP = "default-src 'none'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; base-uri 'none'; form-action 'none'"
_MD_SPECIAL = re.compile(r"([\\`*\[\]|~])")  # what makes markup (emphasis, code, links, tables); not . - ( )


def _utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if ms else "—"


def _clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%H:%M:%S") if ms else "—"


def _md(value: object) -> str:
    """Text safe in Markdown and in a Markdown table cell: HTML escaped, Markdown's markers backslashed."""
    text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text).replace("\n", " ").replace("\r", " ")


def _link(url: object) -> str:
    """``url`` if it is an http(s) URL, else "" (a template shows it as text then)."""
    text = str(url or "")
    return text if re.match(r"^https?://[^\s<>\"']+$", text) else ""


def _data_uri(png: bytes) -> Markup:
    return Markup("data:image/png;base64,") + base64.b64encode(png).decode("ascii")


@functools.cache
def _environment() -> jinja2.Environment:
    """The templates' environment, built on first use."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("agent.app.triage", "templates"),
        # HTML escaped; the Markdown template escapes with its own filter (md), as Markdown needs
        autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",), disabled_extensions=("md.j2",),
                                            default=True, default_for_string=True),
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True,
    )
    env.filters.update(utc=_utc, clock=_clock, md=_md, link=_link, data_uri=_data_uri,
                       basename=lambda path: PurePath(str(path)).name)  # a rule file's name, not the host's paths
    return env


def _alt(report: Report, index: int) -> str:
    """The plot's text alternative: what it shows and the range of each line."""
    p = report.plots[index]
    parts = [f"{p.spec.title}, {_clock(report.window.start_ms)} to {_clock(report.window.end_ms)} UTC"]
    for line in p.lines[:4]:
        vals = [v for v in line.values if math.isfinite(v)]
        if vals:
            parts.append(f"{line.label}: {min(vals):.3g} to {max(vals):.3g}")
    if p.empty:
        parts.append("no data" + (f" ({p.errors[0]})" if p.errors else ""))
    return "; ".join(parts)


def _json(report: Report) -> dict[str, Any]:
    w = report.window
    return {
        **facts_json(report.facts),
        "headline": report.headline,
        "summary": " ".join(report.summary),
        "timeline": [e.to_json() for e in report.timeline],
        "window": {"start_ms": w.start_ms, "end_ms": w.end_ms, "step_ms": w.step_ms},
        "source": report.source,
        "plots": [{"key": p.spec.key, "title": p.spec.title, "unit": p.spec.ylabel, "threshold": p.spec.threshold,
                   "queries": [q.expr for q in p.spec.queries], "errors": p.errors,
                   "series": [{"label": line.label, "role": line.role,
                               "points": [[t, v if math.isfinite(v) else None]
                                          for t, v in zip(line.ts, line.values, strict=True)]}
                              for line in p.lines]}
                  for p in report.plots],
    }


def render(report: Report, fmt: str) -> str:
    """``report`` as ``html`` (needs ``report.images``), ``md`` or ``json``."""
    if fmt == "json":
        return json.dumps(_json(report), indent=2, allow_nan=False) + "\n"
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt[:20]!r}")
    template = _environment().get_template(f"report.{fmt}.j2")
    plots = [{"data": p, "alt": _alt(report, i), "png": report.images[i] if i < len(report.images) else None}
             for i, p in enumerate(report.plots)]
    return template.render(r=report, f=report.facts, inc=report.facts.incident, rule=report.facts.rule,
                           plots=plots, csp=CSP)
