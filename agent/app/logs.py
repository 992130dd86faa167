"""Logging set-up: console lines for people, JSON lines for log pipelines, one pipeline for all.

Configured by the CLI from the validated config; modules only call
``structlog.get_logger(__name__)`` and bind context (``target=``, ``gpu=``). structlog hands
its events to stdlib :mod:`logging` (so each keeps its module name as ``logger``), and one
handler on the root logger renders them with structlog's ``ProcessorFormatter`` — the same
processors for structlog events and for the records of stdlib loggers (aiohttp's,
APScheduler's, where a failing job's traceback lands, slack-sdk's). With ``json`` every line
is one object with ``event``, ``level``, ``timestamp`` and ``logger``, a traceback in
``exception``; a log pipeline never sees a stray plain-text line.

The agent's own loggers (``agent.*``) log at the configured level; third-party loggers only
from ``warning`` up, so their chatter (aiohttp's access log) shows only when it matters.

Secrets are masked at the last line, for both formats and every logger:

* the value of any event key that looks secret (:data:`SECRET_KEY_HINTS`: ``token``,
  ``authorization``, ``webhook_url``, ...), also inside nested dicts, so a careless
  ``log.info(..., token=...)`` or ``headers={"Authorization": ...}`` cannot leak one;
* in the rendered line, whatever the message, field or traceback, the shapes in
  :data:`SECRET_PATTERNS`: Slack tokens (``xoxb-``, ``xoxp-``, ``xapp-``...), ``Bearer``
  credentials, Slack incoming-webhook paths, passwords in URLs, secret query parameters.

A secret of no known shape, logged as text under an innocent key, is not caught:
config secrets are :class:`pydantic.SecretStr` and print as ``**********`` anyway.

Logged values come from outside (an alertname from the unauthenticated intake): the console
format escapes control characters in every text field and key (:func:`agent.textsafe.escape`),
so a newline, ``\r``, an ANSI escape or U+2028 in one cannot forge a line (CWE-117); nested
values are shown with ``repr``, which escapes them itself. The JSON format needs nothing: JSON
escapes control characters, and U+2028/U+2029 too (``ensure_ascii``).
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO

import structlog
from structlog.typing import Processor

from agent.textsafe import escape

__all__ = ["MASK", "SECRET_KEY_HINTS", "SECRET_PATTERNS", "configure_logging", "mask_text"]

MASK = "**********"

#: An event key containing one of these (case-insensitive) has its value masked.
SECRET_KEY_HINTS = ("token", "secret", "password", "authorization", "api_key", "webhook_url", "cookie")

#: Secret shapes masked wherever they appear in a rendered line; group 1 is kept, the rest masked.
SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"\b((?:xox[a-z]|xapp)-)[A-Za-z0-9-]+"),  # Slack bot/user/app tokens
    re.compile(r"\b(Bearer\s+)[A-Za-z0-9._~+/=-]+", re.IGNORECASE),  # Authorization: Bearer <x>
    re.compile(r"(hooks\.slack(?:-gov)?\.com/)[A-Za-z0-9/_-]+"),  # an incoming webhook's secret path
    re.compile(r"(://[^/\s:@\"']+:)[^/\s@\"']+(?=@)"),  # https://user:password@host
    re.compile(r"([?&](?:access_token|token|api_key|apikey|secret|password|sig|signature)=)[^&\s\"'#]+",
               re.IGNORECASE),  # ?token=<x> in a logged URL
)


def mask_text(text: str) -> str:
    """``text`` with every :data:`SECRET_PATTERNS` match masked (its prefix kept)."""
    for pattern in SECRET_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


def _secret_key(key: object) -> bool:
    return isinstance(key, str) and any(h in key.lower() for h in SECRET_KEY_HINTS)


def _masked(value: Mapping[Any, Any]) -> dict[Any, Any]:
    return {k: MASK if _secret_key(k) else _masked(v) if isinstance(v, Mapping) else v for k, v in value.items()}


def _mask_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, value in list(event.items()):
        if _secret_key(key):
            event[key] = MASK
        elif isinstance(value, Mapping):
            event[key] = _masked(value)
    return event


def _escape_text(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """The console format's line-forging guard: text fields and keys escaped (see the module docstring)."""
    return {escape(k) if isinstance(k, str) else k: escape(v) if isinstance(v, str) else v
            for k, v in event.items()}


class _MaskingFormatter(structlog.stdlib.ProcessorFormatter):
    """structlog's formatter, with :func:`mask_text` over the finished line (tracebacks included)."""

    def format(self, record: logging.LogRecord) -> str:
        return mask_text(super().format(record))


def configure_logging(fmt: str = "console", level: str = "info", stream: TextIO | None = None) -> None:
    """Route structlog and every stdlib logger through one handler on the root logger, to
    ``stream`` (default: ``sys.stderr`` now). Safe to call again: it replaces, never adds."""
    out = stream or sys.stderr
    lvl = getattr(logging, level.upper())
    shared: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        _mask_secrets,
    ]
    rendering: list[Processor] = (
        [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
        if fmt == "json"
        else [_escape_text, structlog.dev.ConsoleRenderer(colors=out.isatty())]  # renders exc_info itself
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(_MaskingFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *rendering],
    ))
    root = logging.getLogger()
    root.handlers[:] = [handler]  # the agent owns the root logger: one handler, however often called
    root.setLevel(max(lvl, logging.WARNING))  # third-party chatter only when it matters
    logging.getLogger("agent").setLevel(lvl)
