"""Alertmanager intake: the version-4 webhook an Alertmanager posts, read strictly, as the agent's alerts.

``POST /api/v1/alertmanager/webhook`` takes what an Alertmanager ``webhook_config`` sends
(https://prometheus.io/docs/alerting/latest/configuration/#webhook_config): ``version: "4"``,
``groupKey``, ``truncatedAlerts``, ``status``, ``receiver``, ``groupLabels``, ``commonLabels``,
``commonAnnotations``, ``externalURL`` and ``alerts``, each with ``status``, ``labels``,
``annotations``, ``startsAt``, ``endsAt``, ``generatorURL`` and ``fingerprint``.
:func:`parse_webhook` checks every one of those (type, presence, RFC 3339 times, the status
values) and raises :class:`ValueError` naming the first problem by its path
(``alerts[2].startsAt: ...``), which the HTTP layer answers with 400. Times must lie in what the
agent can store and print back (after 1970, up to :data:`MAX_TIME_MS`, a day short of year 10000:
``9999-12-31T23:59:59-01:00`` is year 10000 in UTC and would break every report that shows it), and
the body may nest at most :data:`MAX_DEPTH` levels, even under keys that are ignored (checked without
recursion, so a deep body is a 400, never a ``RecursionError`` further on). Keys it does not know
(``notification_reason``, and whatever later Alertmanagers add) are ignored, so a newer
Alertmanager is not refused; ``version`` must be ``"4"``, the format this reads.

An accepted alert becomes the agent's own alert model (:func:`evaluation`): its labels and
annotations, ``activeAt`` = ``startsAt``, resolved at ``endsAt`` when its status is resolved.
The dispatcher then does with it what it does with an alert its rules raised (routes, grouped
receivers, Slack updated in place, the ``diagnose`` action, the incident log) with one
exception: **an intake alert is never sent to an Alertmanager receiver**. It came from an
Alertmanager; sending it to one (the same or a peer that also posts to this agent) would come
back as a new webhook, a loop, and an Alertmanager needs no copy of an alert another one holds.
The agent's own alerts that return through an Alertmanager are recognised before they are
stored (:meth:`~agent.act.ActLayer.accept_webhook`) and skipped for the same reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

from agent.act.dispatch import Evaluation
from agent.act.notification import AlertSnapshot, Status
from agent.act.state import IntakeAlert
from agent.act.state.intake import InboxItem
from agent.rules.manager import Alert, AlertEvent, AlertState
from agent.series import labels_from

__all__ = ["INTAKE_GROUP", "MAX_ALERTS", "MAX_DEPTH", "MAX_TIME_MS", "Webhook", "check_nesting", "check_time_ms",
           "evaluation", "parse_webhook", "snapshot"]

#: The rule-group name intake alerts carry in the act layer (events, logs).
INTAKE_GROUP = "alertmanager-intake"
#: Alerts in one webhook: Alertmanager sends a whole aggregation group (``max_alerts`` 0: all of it).
MAX_ALERTS = 10_000
MAX_LABELS = 256  # labels or annotations on one alert
MAX_NAME = 1024  # characters of a label or annotation name
#: The latest time taken from outside (Unix ms): 9999-12-30T23:59:59.999Z, a day short of the end of what
#: Python's datetime (and Go's RFC 3339 encoder) can write, so windows a report adds around it still format.
MAX_TIME_MS = int(datetime(9999, 12, 31, tzinfo=UTC).timestamp() * 1000) - 1
#: Levels of objects and arrays in one webhook body (Alertmanager's own is 4 deep: body, alerts, alert, labels).
MAX_DEPTH = 16
_VERSION = "4"
_STATUSES = ("firing", "resolved")
# RFC 3339 as Go's time.Time marshals it (Alertmanager's encoding/json): 'T', up to 9 fraction digits, Z or ±hh:mm
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})")
_MAX_TIME_TEXT = "9999-12-30T23:59:59.999Z"
_GO_ZERO = "0001-01-01T00:00:00Z"  # Go's zero time: Alertmanager's endsAt of a firing alert
_FINGERPRINT = re.compile(r"[0-9A-Za-z]{1,64}")
_SURROGATE = re.compile("[\ud800-\udfff]")  # Python's re: RE2 reads UTF-8, which cannot hold a lone surrogate


@dataclass(frozen=True)
class Webhook:
    """One webhook, checked: the group it is about and its alerts."""

    receiver: str
    group_key: str
    status: Status
    external_url: str
    truncated: int  # alerts Alertmanager left out (its webhook_config max_alerts)
    alerts: tuple[IntakeAlert, ...]


def parse_webhook(data: Mapping[str, Any]) -> Webhook:
    """A version-4 webhook body (a JSON object) -> :class:`Webhook`; ``ValueError`` names what is wrong."""
    check_nesting(data, "the body", max_depth=MAX_DEPTH)
    version = json_field(data, "version", str, "")
    if version != _VERSION:
        raise ValueError(f"version: expected {_VERSION!r} (Alertmanager's webhook format), not {version[:20]!r}")
    receiver = json_field(data, "receiver", str, "")
    group_key = json_field(data, "groupKey", str, "")
    status = _status(data, "")
    external_url = json_field(data, "externalURL", str, "")
    for key in ("groupLabels", "commonLabels", "commonAnnotations"):
        _strings(json_field(data, key, dict, ""), key)
    truncated = 0
    if "truncatedAlerts" in data:
        truncated = json_field(data, "truncatedAlerts", int, "")
        if truncated < 0:
            raise ValueError(f"truncatedAlerts: must not be negative, got {truncated}")
    raw = json_field(data, "alerts", list, "")
    if not raw:
        raise ValueError("alerts: empty; a webhook carries at least one alert")
    if len(raw) > MAX_ALERTS:
        raise ValueError(f"alerts: {len(raw)} alerts in one webhook, more than the {MAX_ALERTS} taken")
    alerts = tuple(_alert(a, f"alerts[{i}]", external_url, receiver) for i, a in enumerate(raw))
    return Webhook(receiver, group_key, status, external_url, truncated, alerts)


def _alert(raw: Any, path: str, source: str, receiver: str) -> IntakeAlert:
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must be an object, not {type_name(raw)}")
    status = _status(raw, path)
    labels = _strings(json_field(raw, "labels", dict, path), f"{path}.labels")
    if not labels:
        raise ValueError(f"{path}.labels: empty; an alert is identified by its labels")
    annotations = _strings(json_field(raw, "annotations", dict, path), f"{path}.annotations")
    starts_ms = _time(json_field(raw, "startsAt", str, path), f"{path}.startsAt")
    if starts_ms <= 0:
        raise ValueError(f"{path}.startsAt: an alert must have started after 1970")
    ends_ms = _time(json_field(raw, "endsAt", str, path), f"{path}.endsAt")
    if status == "resolved" and ends_ms <= 0:
        raise ValueError(f"{path}.endsAt: a resolved alert needs the time it resolved")
    generator_url = json_field(raw, "generatorURL", str, path)
    fp = json_field(raw, "fingerprint", str, path)
    if not _FINGERPRINT.fullmatch(fp):
        raise ValueError(f"{path}.fingerprint: expected Alertmanager's fingerprint (hex digits), not {fp[:70]!r}")
    return IntakeAlert(fingerprint=fp, status=status, labels=labels, annotations=annotations, starts_ms=starts_ms,
                       ends_ms=ends_ms if status == "resolved" else 0, generator_url=generator_url, source=source,
                       receiver=receiver)


def json_field(obj: Mapping[str, Any], key: str, kind: type, path: str) -> Any:
    """``obj[key]``, which must be a ``kind`` (a bool is not an int); ValueError names ``path.key``."""
    where = f"{path}.{key}" if path else key
    if key not in obj:
        raise ValueError(f"{where}: missing")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ValueError(f"{where}: must be {type_name(kind())}, not {type_name(value)}")
    return value


def _status(obj: Mapping[str, Any], path: str) -> Status:
    value = json_field(obj, "status", str, path)
    if value not in _STATUSES:
        raise ValueError(f"{path + '.' if path else ''}status: must be 'firing' or 'resolved', not {value[:20]!r}")
    return cast(Status, value)


def _strings(obj: dict[str, Any], path: str) -> dict[str, str]:
    if len(obj) > MAX_LABELS:
        raise ValueError(f"{path}: {len(obj)} entries, more than the {MAX_LABELS} taken")
    for name, value in obj.items():
        if not name or len(name) > MAX_NAME:
            raise ValueError(f"{path}: a name must have 1 to {MAX_NAME} characters, got {len(name)}")
        if not isinstance(value, str):
            raise ValueError(f"{path}.{name[:40]}: must be a string, not {type_name(value)}")
    return dict(obj)


def check_nesting(value: Any, path: str, *, max_depth: int, max_values: int | None = None) -> None:
    """ValueError naming ``path`` when a JSON value nests objects and arrays more than ``max_depth`` levels
    deep, holds more than ``max_values`` values in all, or has a string (a key too) with a lone surrogate
    (``"\\ud800"`` is valid JSON, but no UTF-8 encoder, SQLite or log line takes it). Iterative: no depth
    can make it recurse."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    count = 0
    while stack:
        item, depth = stack.pop()
        count += 1
        if max_values is not None and count > max_values:
            raise ValueError(f"{path}: more than the {max_values} values taken")
        if isinstance(item, str):
            if _SURROGATE.search(item):
                raise ValueError(f"{path}: a string is not valid Unicode (a lone surrogate): {item[:40]!a}")
            continue
        if isinstance(item, dict):
            stack.extend((key, depth) for key in item if isinstance(key, str) and _SURROGATE.search(key))
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > max_depth:
            raise ValueError(f"{path}: nested more than the {max_depth} levels taken")
        stack.extend((child, depth + 1) for child in children)


def check_time_ms(ms: int, path: str) -> int:
    """``ms`` (Unix ms) if the agent can store and print it back (0 to :data:`MAX_TIME_MS`), else ValueError."""
    if not 0 <= ms <= MAX_TIME_MS:
        raise ValueError(f"{path}: {str(ms)[:30]} is not a Unix time in milliseconds from 1970 to year 9999")
    return ms


def _time(text: str, path: str) -> int:
    """An RFC 3339 time -> Unix milliseconds (0 for Go's zero time, which Alertmanager sends for "none")."""
    if text == _GO_ZERO:
        return 0
    m = _RFC3339.fullmatch(text) if len(text) <= 40 else None
    if m is None:
        raise ValueError(f"{path}: not an RFC 3339 time like 2024-05-01T12:00:00.000Z: {text[:40]!r}")
    frac, zone = m.group(1) or "", m.group(2).upper()
    stamp = text[:10] + "T" + text[11:19] + frac[:7] + ("+00:00" if zone == "Z" else zone)  # Python: 6 digits
    try:
        when = datetime.fromisoformat(stamp)
    except ValueError as exc:  # 2024-13-45: the shape is right, the date is not
        raise ValueError(f"{path}: not a valid time: {text!r} ({exc})") from exc
    try:
        ms = when.timestamp() * 1000
    except (OverflowError, ValueError) as exc:  # an offset past year 1 or 9999 in UTC
        raise ValueError(f"{path}: {text!r} is outside the years 1 to 9999 in UTC") from exc
    if ms > MAX_TIME_MS:  # 9999-12-31T23:59:59-01:00 is year 10000 in UTC
        raise ValueError(f"{path}: {text!r} is after {_MAX_TIME_TEXT}, the latest time the agent takes")
    return int(ms) if math.isfinite(ms) and ms > 0 else 0


def type_name(value: object) -> str:
    """A JSON value's type as an error message names it ("an object", "a string", ...)."""
    return {dict: "an object", list: "an array", str: "a string", int: "a number", float: "a number",
            bool: "a boolean", type(None): "null"}.get(type(value), type(value).__name__)


# -- the agent's alert model -------------------------------------------------------------------------------------
def snapshot(a: IntakeAlert) -> AlertSnapshot:
    """The alert as the agent's receivers see it (fingerprinted by its labels, like the agent's own)."""
    return AlertSnapshot(labels=dict(a.labels), annotations=dict(a.annotations), status=a.status,
                         starts_at_ms=a.starts_ms, ends_at_ms=a.ends_ms, value=math.nan,
                         generator_url=a.generator_url)


def _event(item: InboxItem) -> AlertEvent | None:
    """The rule-manager event for a transition: ``firing`` at startsAt, ``resolved`` at endsAt (only
    for an alert seen firing: a resolve of something never seen opens no incident)."""
    a = item.alert
    if a.status == "resolved" and item.was != "firing":
        return None
    resolved = a.status == "resolved"
    alert = Alert(labels=labels_from(None, a.labels), annotations=dict(a.annotations), value=math.nan,
                  state=AlertState.INACTIVE if resolved else AlertState.FIRING, active_at_ms=a.starts_ms,
                  fired_at_ms=a.starts_ms, resolved_at_ms=a.ends_ms)
    return AlertEvent(a.status, INTAKE_GROUP, a.labels.get("alertname", ""), alert,
                      a.ends_ms if resolved else a.starts_ms)


def evaluation(items: Iterable[InboxItem]) -> Evaluation:
    """Inbox transitions, oldest first, as one evaluation for :meth:`~agent.act.dispatch.Dispatcher.apply`:
    every transition an event (in order), the latest state of each alert a snapshot, none sent to an
    Alertmanager receiver (see the module docstring)."""
    events: list[AlertEvent] = []
    snaps: dict[str, AlertSnapshot] = {}
    for item in items:
        event = _event(item)
        if event is not None:
            events.append(event)
        snap = snapshot(item.alert)
        snaps.pop(snap.fingerprint, None)  # keep arrival order: the latest state of each alert last
        snaps[snap.fingerprint] = snap
    return Evaluation(INTAKE_GROUP, tuple(events), tuple(snaps.values()), (), interval_s=0.0,
                      to_alertmanagers=False)
