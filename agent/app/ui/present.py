"""What the pages show, shaped from the JSON the API serves: ages, sorted labels, safe links, silenced alerts.

The pages read the same views as ``/api/v1/...`` (so the UI never shows something the API
does not) and this module turns them into rows the templates print as they are. Nothing here
escapes anything: the templates autoescape every value, and the one thing escaping cannot make
safe, a link's scheme (``javascript:`` in an ``href``), is checked by :func:`safe_url`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode, urlsplit

from agent.matchers import AlertMatcher

__all__ = [
    "AlertRow",
    "age",
    "alert_rows",
    "format_value",
    "parse_time",
    "safe_url",
    "silence_link",
    "silence_matchers",
]

_STATE_ORDER = {"firing": 0, "pending": 1}


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time from the API (``2026-01-01T00:00:00.000Z``) -> Unix seconds (None for none)."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def age(then: float | None, now: float) -> str:
    """How long ago ``then`` (Unix seconds) was, in the two largest units: ``42s``, ``3m 5s``, ``2d 4h``."""
    if then is None or not math.isfinite(then):
        return "never"
    s = max(0, int(now - then))
    units = [("d", 86400, 0), ("h", 3600, 24), ("m", 60, 60), ("s", 1, 60)]
    first = next(i for i, (_, size, _) in enumerate(units) if s >= size or size == 1)
    out = [f"{s // units[first][1]}{units[first][0]}"]
    if first + 1 < len(units):
        unit, size, mod = units[first + 1]
        out.append(f"{s // size % mod}{unit}")
    return " ".join(out)


def utc(then: float | None) -> str:
    """``then`` as ``2026-01-01 12:00:00 UTC`` (the tooltip beside an age)."""
    if then is None:
        return ""
    return datetime.fromtimestamp(then, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def format_value(text: str | float | None) -> str:
    """An alert value (the API writes Go's ``2e+01``) as a person reads it: ``20``, ``0.973``, ``1.2e+09``."""
    if text is None:
        return ""
    try:
        v = float(text)
    except ValueError:
        return str(text)
    if math.isnan(v) or math.isinf(v):
        return str(v)
    return f"{v:.4g}"


def safe_url(url: str | None) -> str | None:
    """``url`` if it is an http(s) link or a path on this agent, else None (never ``javascript:``,
    ``data:`` or a scheme-relative ``//host``): a rule's annotation becomes an ``href``."""
    if not url:
        return None
    url = url.strip()
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.netloc:
        return url
    if not parts.scheme and not parts.netloc and url.startswith("/") and not url.startswith("//"):
        return url
    return None


def silence_matchers(silence: Mapping[str, Any]) -> list[AlertMatcher]:
    """A silence's matchers (the API's ``{name, value, isRegex, isEqual}``) back as matchers."""
    out = []
    for m in silence.get("matchers", []):
        op = ("=~" if m["isEqual"] else "!~") if m["isRegex"] else ("=" if m["isEqual"] else "!=")
        out.append(AlertMatcher(m["name"], op, m["value"]))
    return out


def silence_link(labels: Mapping[str, str]) -> str:
    """The Silences page with the form filled in for these labels (one ``name="value"`` per matcher)."""
    keep = {k: v for k, v in labels.items() if k in ("alertname", "instance", "job", "replica", "model_name")}
    pairs = [("matcher", str(AlertMatcher(k, "=", v))) for k, v in sorted((keep or dict(labels)).items())]
    return "/silences?" + urlencode(pairs) + "#new-silence"


@dataclass
class AlertRow:
    """One alert as the Alerts page prints it."""

    name: str
    state: str
    labels: list[tuple[str, str]]
    summary: str
    description: str
    value: str
    since: str
    since_utc: str
    runbook: str | None
    silenced_by: list[str] = field(default_factory=list)
    silence_link: str = ""


def alert_rows(alerts: Sequence[Mapping[str, Any]], silences: Sequence[Mapping[str, Any]],
               now: float) -> list[AlertRow]:
    """Firing before pending, then by name and labels; each with the active silences that mute it."""
    active = [(str(s["id"]), silence_matchers(s)) for s in silences if s.get("status", {}).get("state") == "active"]
    rows = []
    for a in alerts:
        labels: dict[str, str] = dict(a.get("labels", {}))
        ann: dict[str, str] = dict(a.get("annotations", {}))
        since = parse_time(a.get("activeAt"))
        rows.append(AlertRow(
            name=labels.get("alertname", ""), state=str(a.get("state", "")),
            labels=sorted((k, v) for k, v in labels.items() if k != "alertname"),
            summary=ann.get("summary", ""), description=ann.get("description", ""),
            value=format_value(a.get("value")), since=age(since, now), since_utc=utc(since),
            runbook=safe_url(ann.get("runbook_url")),
            silenced_by=[sid for sid, ms in active if ms and all(m.matches(labels) for m in ms)],
            silence_link=silence_link(labels),
        ))
    rows.sort(key=lambda r: (_STATE_ORDER.get(r.state, 9), r.name, r.labels))
    return rows
