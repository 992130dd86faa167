"""Console receiver: notifications as short human-readable lines on a text stream.

The default receiver, so ``sre-agent run`` shows something useful with no
configuration and ``sre-agent demo`` can be followed in a terminal. Lines look like
Alertmanager's default titles::

    2026-11-29 18:40:02Z [FIRING:2] VLLMKVCacheSaturated (severity=warning) — KV cache is nearly full.
        instance="gpu-a:8000" model_name="llama" value=0.97
        instance="gpu-b:8000" model_name="llama" value=0.96
    2026-11-29 18:52:02Z [RESOLVED] VLLMKVCacheSaturated (severity=warning) — KV cache is nearly full.
    2026-11-29 18:40:05Z [FINDING] gpu-oom-runtime: CUDA OOM while loading → set --gpu-memory-utilization to 0.85 (https://…)
    2026-11-29 18:41:00Z [SCALE] vllm-llama out 2 → 3 (VLLMQueueGrowing)

The stream is flushed after every notification so ``| tee`` and log shippers see it
at once. The header carries ``alertname`` and ``severity``; each alert line carries the
rest of its labels (the ones that tell alerts of one group apart) and its value. Every
line goes through :func:`agent.textsafe.escape`: an alertname or a summary from the
unauthenticated intake cannot forge a line, move the cursor or colour the terminal (CWE-117).
"""

from __future__ import annotations

import math
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from agent.act.notification import AlertSnapshot, Notification
from agent.errors import DeliveryError
from agent.textsafe import escape

__all__ = ["ConsoleSink", "format_notification"]

_HEADER_LABELS = ("alertname", "severity")


def format_notification(notification: Notification) -> list[str]:
    """The lines printed for one notification (no trailing newlines, no control characters)."""
    return [escape(line) for line in _lines(notification)]


def _lines(notification: Notification) -> list[str]:
    stamp = datetime.fromtimestamp(notification.created_ms // 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S") + "Z"
    if notification.kind == "finding":
        return [f"{stamp} {_finding_line(notification.finding or {})}"]
    if notification.kind == "scale":
        return [f"{stamp} {_scale_line(notification.scale or {})}"]
    return [f"{stamp} {_alerts_header(notification)}"] + [
        "    " + _alert_line(a, notification.status) for a in notification.alerts]


def _alerts_header(n: Notification) -> str:
    common = n.common_labels()
    tag = f"[FIRING:{len(n.firing)}]" if n.status == "firing" else "[RESOLVED]"
    name = common.get("alertname") or n.group_labels.get("alertname") or _group_text(n.group_labels) or "(no name)"
    severity = common.get("severity")
    summary = n.common_annotations().get("summary", "")
    if not summary:
        summary = next((a.annotations["summary"] for a in n.alerts if a.annotations.get("summary")), "")
    return tag + " " + name + (f" (severity={severity})" if severity else "") + (f" — {summary}" if summary else "")


def _group_text(labels: dict[str, str]) -> str:
    return " ".join(f"{k}={_quote(v)}" for k, v in sorted(labels.items()))


def _alert_line(alert: AlertSnapshot, group_status: str) -> str:
    labels = _group_text({k: v for k, v in alert.labels.items() if k not in _HEADER_LABELS})
    parts = [labels] if labels else []
    if not math.isnan(alert.value):  # an alert an Alertmanager posted carries no value
        parts.append(f"value={_number(alert.value)}")
    if alert.status == "resolved" and group_status == "firing":
        parts.append("(resolved)")
    return " ".join(parts)


def _finding_line(finding: dict[str, Any]) -> str:
    text = f"[FINDING] {finding.get('kind', '?')}: {finding.get('summary', '')}"
    setting, value = finding.get("setting"), finding.get("suggested_value")
    if setting and value:
        text += f" → set {setting} to {value}"
    elif setting:
        text += f" → check {setting}"
    if finding.get("runbook_url"):
        text += f" ({finding['runbook_url']})"
    return text


def _scale_line(scale: dict[str, Any]) -> str:
    """``[SCALE] service out 2 → 3 (reason)``; tolerant of missing fields."""
    current = _first(scale, "from_replicas", "current_replicas")
    desired = _first(scale, "to_replicas", "replicas", "desired_replicas")
    direction = scale.get("direction")
    if not direction and isinstance(current, int) and isinstance(desired, int):
        direction = "out" if desired > current else "in"
    text = f"[SCALE] {scale.get('service', '?')} {direction or '?'} {_or_q(current)} → {_or_q(desired)}"
    if scale.get("reason"):
        text += f" ({scale['reason']})"
    if scale.get("dry_run"):
        text += " [dry run]"
    return text


def _first(data: dict[str, Any], *keys: str) -> Any:
    return next((data[k] for k in keys if data.get(k) is not None), None)


def _or_q(value: Any) -> str:
    return "?" if value is None else str(value)


def _quote(value: str) -> str:
    """A label value as PromQL writes it, so spaces and newlines cannot break the line."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _number(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.6g}"


CONSOLE_DEADLINE_S = 10.0  # a write and a flush; only a stream nobody reads (a full pipe) takes longer


class ConsoleSink:
    """Writes notifications to a text stream (stdout by default) and flushes."""

    def __init__(self, name: str, stream: TextIO | None = None) -> None:
        self.name = name
        self._stream = stream if stream is not None else sys.stdout
        self.deadline_s = CONSOLE_DEADLINE_S

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        """Print the notification's lines; DeliveryError only if the stream is closed or broken."""
        text = "".join(line + "\n" for line in format_notification(notification))
        try:
            try:
                self._stream.write(text)
            except UnicodeEncodeError:  # an ASCII-only terminal: keep the line, escape the rest
                self._stream.write(text.encode("ascii", "backslashreplace").decode("ascii"))
            self._stream.flush()
        except ValueError as exc:  # closed stream: it will not reopen
            raise DeliveryError(f"console {self.name}: cannot write: {exc}", permanent=True) from exc
        except OSError as exc:  # broken pipe, full disk: maybe transient
            raise DeliveryError(f"console {self.name}: cannot write: {exc}") from exc
        return None

    async def close(self) -> None:
        """The stream belongs to the caller (stdout): nothing to close."""
