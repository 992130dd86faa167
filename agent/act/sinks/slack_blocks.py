"""Block Kit messages for Slack: what an alert group, a finding or a scale request looks like.

Pure functions from a :class:`~agent.act.notification.Notification` (or a finding's JSON) to
``(text, blocks)``: ``text`` is the plain fallback Slack shows in notifications and
screen readers, ``blocks`` the rich layout. They are kept apart from the sending code
(:mod:`agent.act.sinks.slack`) so the layout is tested without any HTTP.

Two things every builder guarantees:

* **Block Kit limits** (https://api.slack.com/reference/block-kit/blocks): a header's text
  ≤ 150 characters, a section's text ≤ 3000, at most 10 fields of ≤ 2000 each, button text
  ≤ 75, ≤ 50 blocks per message. Longer text is cut and ends in "…", so Slack never
  answers ``invalid_blocks`` because a description was long. A URL longer than 3000
  characters (or not http/https) drops its button instead: a cut URL would be broken.
* **Escaping**: label values and annotations come from scraped targets and rule files,
  so every piece of it that lands in ``mrkdwn`` (and the fallback ``text``, which Slack
  also parses) has ``&``, ``<``, ``>`` escaped as Slack documents
  (https://api.slack.com/reference/surfaces/formatting#escaping). A label value of
  ``<!channel>`` is shown as text and pings nobody. ``plain_text`` objects (header,
  button labels) are not parsed for mentions and are left as they are.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from agent.act.notification import Notification

__all__ = [
    "BUTTON_TEXT_LIMIT",
    "FIELDS_LIMIT",
    "FIELD_TEXT_LIMIT",
    "HEADER_TEXT_LIMIT",
    "MAX_BLOCKS",
    "SECTION_TEXT_LIMIT",
    "URL_LIMIT",
    "alert_blocks",
    "escape",
    "finding_blocks",
    "format_utc",
    "scale_blocks",
    "truncate",
]

HEADER_TEXT_LIMIT = 150
SECTION_TEXT_LIMIT = 3000
FIELDS_LIMIT = 10
FIELD_TEXT_LIMIT = 2000
BUTTON_TEXT_LIMIT = 75
URL_LIMIT = 3000
MAX_BLOCKS = 50
ELLIPSIS = "…"

# Labels that get a field of their own; the rest of the common labels go to the context line.
_FIELD_LABELS = (("Instance", ("instance",)), ("Model", ("model_name", "model")), ("GPU", ("gpu",)))
_NOT_IN_CONTEXT = {"alertname", "severity", "instance", "model_name", "model", "gpu"}
_SEVERITY_EMOJI = {"critical": ":rotating_light:", "warning": ":warning:", "info": ":information_source:"}
_RESOLVED_EMOJI = ":white_check_mark:"
_OTHER_EMOJI = ":bell:"
_PARTIAL_ENTITY = re.compile(r"&(?:a|am|amp|l|lt|g|gt)?$")


def escape(text: str) -> str:
    """Slack's three control characters as entities: ``&`` → ``&amp;``, ``<`` → ``&lt;``, ``>`` → ``&gt;``."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def truncate(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else its start ending in "…" (exactly ``limit`` long)."""
    if len(text) <= limit:
        return text
    return text[: limit - 1] + ELLIPSIS


def format_utc(ms: int) -> str:
    """Unix ms -> ``2024-05-01 12:00:00 UTC`` (readable in any Slack client's time zone)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def alert_blocks(notification: Notification, dashboard_url: str = "", report_url: str = ""
                 ) -> tuple[str, list[dict[str, Any]]]:
    """The message for one alert group: header, summary/description, key fields, other
    labels, Runbook/Dashboard/Report buttons; and the plain-text fallback.

    ``report_url`` is the agent's ``server.external_url``: with it the message links each
    alert's triage report (``/incidents/<id>``, one button for one incident, a line of links
    for several), and a resolve update carries each incident's one-line summary."""
    alerts = list(notification.alerts)
    firing = notification.firing
    resolved = notification.status == "resolved"
    shown = firing or alerts  # a firing group shows its firing alerts; a resolved one all of them
    first = shown[0] if shown else None
    common = notification.common_labels()
    annotations = notification.common_annotations()

    alertname = (notification.group_labels.get("alertname") or common.get("alertname")
                 or (first.labels.get("alertname", "") if first else "") or "alert")
    severity = common.get("severity") or (first.labels.get("severity", "") if first else "")
    title = f"[RESOLVED] {alertname}" if resolved else f"[FIRING:{len(firing)}] {alertname}"
    emoji = _RESOLVED_EMOJI if resolved else _SEVERITY_EMOJI.get(severity, _OTHER_EMOJI)

    summary = annotations.get("summary") or (first.annotations.get("summary", "") if first else "")
    if "description" in annotations:
        description = annotations["description"]
    else:
        description = "\n".join(f"• {a.annotations.get('description') or _label_text(a.labels)}" for a in shown)

    blocks: list[dict[str, Any]] = [_header(f"{emoji} {title}")]
    body = "\n".join(part for part in (f"*{escape(summary)}*" if summary else "", escape(description)) if part)
    blocks.append(_section(body or escape(title), escaped=True))

    fields: list[tuple[str, str]] = [("Value", _joined(_format_value(a.value) for a in shown))]
    for name, keys in _FIELD_LABELS:
        fields.append((name, _joined(next((a.labels[k] for k in keys if a.labels.get(k)), "") for a in shown)))
    fields.append(("Severity", severity))
    if alerts:
        fields.append(("Since", format_utc(min(a.starts_at_ms for a in alerts))))
    if resolved:
        ends = [a.ends_at_ms for a in alerts if a.ends_at_ms > 0]
        fields.append(("Resolved", format_utc(max(ends)) if ends else ""))
    if len(alerts) > 1:
        fields.append(("Alerts", f"{len(firing)} firing, {len(alerts) - len(firing)} resolved"))
    field_block = _fields(fields)
    if field_block is not None:
        blocks.append(field_block)

    rest = {k: v for k, v in sorted(common.items()) if k not in _NOT_IN_CONTEXT}
    if rest:
        blocks.append(_context(_label_text(rest)))

    refs = [notification.incidents[a.fingerprint] for a in shown if a.fingerprint in notification.incidents]
    if resolved:
        lines = [str(r["summary"]) for r in refs if r.get("summary")]
        if lines:
            blocks.append(_section("\n".join(f"• {line}" for line in lines[:5])))
    reports = [(f"#{r['id']}", f"{report_url}/incidents/{r['id']}") for r in refs if report_url and "id" in r]
    if len(reports) > 1:
        links = " · ".join(f"<{url}|report {name}>" for name, url in reports if len(url) <= URL_LIMIT)
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": links}]})
    runbook = annotations.get("runbook_url") or (first.annotations.get("runbook_url", "") if first else "")
    buttons = [("Runbook", runbook), ("Dashboard", dashboard_url)]
    if len(reports) == 1:
        buttons.append(("Triage report", reports[0][1]))
    actions = _actions(buttons)
    if actions is not None:
        blocks.append(actions)

    text = f"{title}: {summary}" if summary else title
    if resolved and refs and refs[0].get("summary"):
        text = f"{title}: {refs[0]['summary']}"
    return _mrkdwn(text, SECTION_TEXT_LIMIT), blocks[:MAX_BLOCKS]


def finding_blocks(finding: Mapping[str, Any], dashboard_url: str = "") -> tuple[str, list[dict[str, Any]]]:
    """A diagnosis finding (:meth:`Finding.to_json`): kind, summary, evidence as a code
    block, the setting to change → its suggested value, the alternatives (``details["alternatives"]``)
    and the runbook button."""
    kind = str(finding.get("kind") or "finding")
    summary = str(finding.get("summary") or "")
    severity = str(finding.get("severity") or "")
    ok = bool(finding.get("ok"))
    evidence = [str(line) for line in finding.get("evidence") or []]
    setting = str(finding.get("setting") or "")
    suggested = str(finding.get("suggested_value") or "")
    labels = {str(k): str(v) for k, v in (finding.get("labels") or {}).items()}

    emoji = _RESOLVED_EMOJI if ok else _SEVERITY_EMOJI.get(severity, _OTHER_EMOJI)
    blocks: list[dict[str, Any]] = [_header(f"{emoji} Finding: {kind}")]
    blocks.append(_section(summary or kind))
    if evidence:
        fence = "```"
        inner = _mrkdwn("\n".join(evidence), SECTION_TEXT_LIMIT - 2 * len(fence) - 2)
        blocks.append(_section(f"{fence}\n{inner}\n{fence}", escaped=True))
    change = ""
    if setting:
        change = f"`{escape(setting)}` → `{escape(suggested)}`" if suggested else f"`{escape(setting)}`"
    fields = [("Change", change), ("Severity", "ok" if ok else severity)]
    fields += [(name, next((labels[k] for k in keys if labels.get(k)), "")) for name, keys in _FIELD_LABELS]
    field_block = _fields(fields, escaped={"Change"})
    if field_block is not None:
        blocks.append(field_block)
    details = finding.get("details")
    alternatives = details.get("alternatives") if isinstance(details, Mapping) else None
    if isinstance(alternatives, list) and alternatives:  # the other changes that would also work
        blocks.append(_context("Or: " + "; ".join(str(a) for a in alternatives)))
    rest = {k: v for k, v in sorted(labels.items()) if k not in _NOT_IN_CONTEXT}
    if rest:
        blocks.append(_context(_label_text(rest)))
    actions = _actions([("Runbook", str(finding.get("runbook_url") or "")), ("Dashboard", dashboard_url)])
    if actions is not None:
        blocks.append(actions)

    text = f"Finding {kind}: {summary}"
    if setting and suggested:
        text += f" ({setting} → {suggested})"
    return _mrkdwn(text, SECTION_TEXT_LIMIT), blocks[:MAX_BLOCKS]


def scale_blocks(scale: Mapping[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    """A scale request, for a channel that follows what the agent does: its fields, one per line."""
    lines = "\n".join(f"*{escape(str(k))}*: {escape(str(v))}" for k, v in sorted(scale.items()))
    text = "Scale request: " + ", ".join(f"{k}={v}" for k, v in sorted(scale.items()))
    blocks = [_header(":arrows_counterclockwise: Scale request"), _section(lines or "(empty)", escaped=True)]
    return _mrkdwn(text, SECTION_TEXT_LIMIT), blocks


def _mrkdwn(text: str, limit: int) -> str:
    """Escape, then cut to ``limit``."""
    return _cut(escape(text), limit)


def _cut(escaped: str, limit: int) -> str:
    """Cut already-escaped text to ``limit`` without leaving half an entity (``&am…``) before the "…"."""
    if len(escaped) <= limit:
        return escaped
    return _PARTIAL_ENTITY.sub("", escaped[: limit - 1]) + ELLIPSIS


def _header(text: str) -> dict[str, Any]:
    return {"type": "header", "text": {"type": "plain_text", "text": truncate(text, HEADER_TEXT_LIMIT), "emoji": True}}


def _section(text: str, *, escaped: bool = False) -> dict[str, Any]:
    body = _cut(text, SECTION_TEXT_LIMIT) if escaped else _mrkdwn(text, SECTION_TEXT_LIMIT)
    return {"type": "section", "text": {"type": "mrkdwn", "text": body}}


def _fields(pairs: list[tuple[str, str]], escaped: Iterable[str] = ()) -> dict[str, Any] | None:
    """A section of ``*Name*\\nvalue`` fields; empty values are left out, at most 10 kept."""
    already = set(escaped)
    out = []
    for name, value in pairs:
        if not value:
            continue
        head = f"*{name}*\n"
        room = FIELD_TEXT_LIMIT - len(head)
        body = _cut(value, room) if name in already else _mrkdwn(value, room)
        out.append({"type": "mrkdwn", "text": head + body})
    return {"type": "section", "fields": out[:FIELDS_LIMIT]} if out else None


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": _mrkdwn(text, SECTION_TEXT_LIMIT)}]}


def _actions(buttons: list[tuple[str, str]]) -> dict[str, Any] | None:
    elements = [
        {
            "type": "button",
            "text": {"type": "plain_text", "text": truncate(label, BUTTON_TEXT_LIMIT), "emoji": True},
            "url": url,
            "action_id": label.lower().replace(" ", "_"),
        }
        for label, url in buttons
        if url.startswith(("https://", "http://")) and len(url) <= URL_LIMIT
    ]
    return {"type": "actions", "elements": elements} if elements else None


def _label_text(labels: Mapping[str, str]) -> str:
    return " · ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _joined(values: Iterable[str]) -> str:
    """Distinct non-empty values in first-seen order, comma-separated."""
    return ", ".join(dict.fromkeys(v for v in values if v))


def _format_value(value: float) -> str:
    """The sample value; none (an alert an Alertmanager posted carries no value: NaN) leaves the field out."""
    return "" if math.isnan(value) else f"{value:.4g}"
