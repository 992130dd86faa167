"""structlog set-up: console lines for people, JSON lines for log pipelines.

Configured once by the CLI from the validated config; modules only call
``structlog.get_logger(__name__)`` and bind context (``target=``, ``gpu=``).
A last-line-of-defence processor masks any event key that looks like a secret, so
a careless ``log.info(..., token=...)`` cannot leak one.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

__all__ = ["configure_logging"]

_SECRET_HINTS = ("token", "secret", "password", "authorization", "api_key")


def _mask_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key in list(event):
        if any(h in key.lower() for h in _SECRET_HINTS):
            event[key] = "**********"
    return event


def configure_logging(fmt: str = "console", level: str = "info", stream: TextIO | None = None) -> None:
    """Route structlog (and stdlib logging, e.g. aiohttp's and APScheduler's) to ``stream``."""
    out = stream or sys.stderr
    lvl = getattr(logging, level.upper())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=out.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _mask_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(lvl, logging.WARNING))  # third-party chatter only when it matters
