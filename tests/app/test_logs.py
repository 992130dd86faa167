"""Tests for agent.app.logs: structlog and stdlib loggers share one pipeline, so with ``json``
every line is one JSON object naming its logger (a traceback in ``exception``), the console
format covers stdlib loggers too, reconfiguring never duplicates lines, and secrets are
masked for every logger under both formats.

Output goes to a StringIO given as ``stream`` (or to capsys' stderr, the default); the
autouse ``_restore_logging`` fixture in tests/conftest.py puts logging back after each test.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from typing import Any

import pytest
import structlog
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from agent.app.logs import MASK, configure_logging, mask_text

SLACK_TOKEN = "xoxb-1234567890-0987654321-AbCdEfGhIjKlMnOp"
BEARER = "eyJhbGciOiJIUzI1NiJ9.c2VjcmV0.dGhpcy1pcy1ub3Q"
WEBHOOK = "https://hooks.slack.com/services/T0000/B0000/XXXXXXXXXXXXXXXXXXXXXXXX"


def _json_lines(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_stdlib_exception_is_one_json_line_with_the_traceback_in_a_field() -> None:
    """A stdlib logger's exception (APScheduler's executor) is one JSON line: logger, level, event, traceback."""
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    try:
        raise RuntimeError("scrape exploded")
    except RuntimeError:
        logging.getLogger("apscheduler.executors.default").exception('Job "%s" raised an exception', "nightly")
    [line] = _json_lines(out)
    assert line["logger"] == "apscheduler.executors.default"
    assert line["level"] == "error"
    assert line["event"] == 'Job "nightly" raised an exception'
    assert line["exception"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: scrape exploded" in line["exception"]
    assert "timestamp" in line


async def test_a_failing_apscheduler_job_is_logged_as_json() -> None:
    """A job that raises inside a real AsyncIOScheduler lands as one JSON error line with its traceback."""
    out = io.StringIO()
    configure_logging("json", "info", stream=out)

    async def job() -> None:
        raise ValueError("job failed")

    scheduler = AsyncIOScheduler()
    scheduler.add_job(job, "date", id="failing")
    scheduler.start()
    try:
        deadline = time.monotonic() + 10
        while "job failed" not in out.getvalue() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        scheduler.shutdown(wait=False)
    [line] = _json_lines(out)  # the scheduler's info chatter stays below the third-party threshold
    assert line["logger"].startswith("apscheduler.executors")
    assert line["level"] == "error"
    assert "ValueError: job failed" in line["exception"]


def test_aiohttp_logger_line_is_json_with_its_name() -> None:
    """An aiohttp logger's warning is a JSON line with the aiohttp logger's name; its info chatter is dropped."""
    out = io.StringIO()
    configure_logging("json", "debug", stream=out)
    logging.getLogger("aiohttp.access").info("127.0.0.1 GET /metrics 200")
    logging.getLogger("aiohttp.server").warning("Error handling request from %s", "10.0.0.1")
    [line] = _json_lines(out)
    assert line["logger"] == "aiohttp.server"
    assert line["event"] == "Error handling request from 10.0.0.1"
    assert line["level"] == "warning"


def test_structlog_logger_keeps_its_module_name() -> None:
    """A structlog logger's line carries its module name as ``logger`` and obeys the configured level."""
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    log = structlog.get_logger("agent.collect.scrape")
    log.debug("not shown")
    log.info("scrape failed", target="http://a:8000/metrics")
    structlog.get_logger().warning("unnamed")  # structlog names it after the calling module
    first, second = _json_lines(out)
    assert first == {"event": "scrape failed", "target": "http://a:8000/metrics", "level": "info",
                     "logger": "agent.collect.scrape", "timestamp": first["timestamp"]}
    assert second["logger"] == __name__


def test_structlog_exception_is_a_field() -> None:
    """``log.exception`` from structlog renders the traceback into ``exception`` on the same JSON line."""
    out = io.StringIO()
    configure_logging("json", "info", stream=out)
    try:
        raise KeyError("gpu")
    except KeyError:
        structlog.get_logger("agent.act.outbox").exception("sink raised an unexpected error", receiver="slack")
    [line] = _json_lines(out)
    assert line["receiver"] == "slack" and line["level"] == "error"
    assert "KeyError: 'gpu'" in line["exception"]


def test_configuring_twice_does_not_duplicate_lines(capsys: pytest.CaptureFixture[str]) -> None:
    """configure_logging called again (main's warning set-up, then the command's) leaves one handler, one line each."""
    configure_logging("console", "warning")
    configure_logging("json", "info")
    assert len(logging.getLogger().handlers) == 1
    structlog.get_logger("agent.app.daemon").info("serving", listen="127.0.0.1:9100")
    logging.getLogger("apscheduler.scheduler").error("scheduler stopped")
    lines = capsys.readouterr().err.splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["serving", "scheduler stopped"]


def test_console_format_includes_stdlib_loggers() -> None:
    """The console format renders stdlib records too: message, level and logger name on a readable line."""
    out = io.StringIO()
    configure_logging("console", "info", stream=out)
    logging.getLogger("apscheduler.scheduler").warning("Run time of job %r was missed", "nightly")
    structlog.get_logger("agent.app.daemon").info("serving", listen="127.0.0.1:9100")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert "Run time of job 'nightly' was missed" in lines[0]
    assert "warning" in lines[0] and "apscheduler.scheduler" in lines[0]
    assert "serving" in lines[1] and "listen=127.0.0.1:9100" in lines[1] and "agent.app.daemon" in lines[1]
    assert not lines[0].startswith("{")


@pytest.mark.parametrize("fmt", ["json", "console"])
def test_secrets_are_masked_for_every_logger(fmt: str) -> None:
    """Tokens in event fields, nested headers, stdlib messages and tracebacks never reach the output, either format."""
    out = io.StringIO()
    configure_logging(fmt, "info", stream=out)
    log = structlog.get_logger("agent.act.sinks.slack")
    log.info("posting", token=SLACK_TOKEN, headers={"Authorization": f"Bearer {BEARER}"}, webhook_url=WEBHOOK)
    log.warning("retrying", detail=f"sent Authorization: Bearer {BEARER}")
    logging.getLogger("agent.act.sinks.slack.sdk").warning("POST %s with token %s", WEBHOOK, SLACK_TOKEN)
    try:
        raise ConnectionError(f"cannot reach {WEBHOOK}")
    except ConnectionError:
        logging.getLogger("apscheduler.executors.default").exception("Job raised")
    text = out.getvalue()
    for secret in (SLACK_TOKEN, BEARER, WEBHOOK, "XXXXXXXXXXXXXXXXXXXXXXXX", "0987654321-AbCdEfGhIjKlMnOp"):
        assert secret not in text
    assert MASK in text and "posting" in text and "POST https://hooks.slack.com/" in text
    if fmt == "json":
        lines = _json_lines(out)  # masking keeps every line valid JSON
        assert lines[0]["token"] == MASK and lines[0]["headers"] == {"Authorization": MASK}
        assert lines[2]["event"] == f"POST https://hooks.slack.com/{MASK} with token xoxb-{MASK}"


@pytest.mark.parametrize(("raw", "masked"), [
    ("token xoxp-11-22-abc", f"token xoxp-{MASK}"),
    ("app xapp-1-A0-99-ff", f"app xapp-{MASK}"),
    ("Authorization: Bearer abc.def/ghi=", f"Authorization: Bearer {MASK}"),
    ("POST https://hooks.slack.com/services/T1/B2/c3 failed", f"POST https://hooks.slack.com/{MASK} failed"),
    ("GET https://user:hunter2@host:8000/metrics", f"GET https://user:{MASK}@host:8000/metrics"),
    ("GET https://host/metrics?job=x&access_token=s3cr3t#f", f"GET https://host/metrics?job=x&access_token={MASK}#f"),
    ("GET https://host:8000/metrics 200", "GET https://host:8000/metrics 200"),
    ("max_tokens=128 scrape ok", "max_tokens=128 scrape ok"),
])
def test_mask_text_covers_the_documented_shapes(raw: str, masked: str) -> None:
    """mask_text masks each documented secret shape, keeping its prefix, and leaves ordinary text alone."""
    assert mask_text(raw) == masked


FORGERS = ["\n", "\r", "\x1b[2J", "\x00", "\u2028", "\u2029", "\x85", "\u202e"]


@pytest.mark.parametrize("fmt", ["console", "json"])
@pytest.mark.parametrize("bad", FORGERS, ids=[ascii(b) for b in FORGERS])
def test_control_characters_in_logged_values_cannot_forge_a_line(fmt: str, bad: str) -> None:
    """An alertname with a control character, logged by structlog or a stdlib logger, stays on its one line
    in either format, and no raw control character reaches the stream."""
    out = io.StringIO()
    configure_logging(fmt, "info", stream=out)
    name = f"Evil{bad}2026-01-01 [info] forged"
    structlog.get_logger("agent.act.intake").info(f"processed{bad}", alertname=name, labels={"a": name})
    logging.getLogger("aiohttp.server").warning("bad request: %s", name)
    text = out.getvalue()
    assert text.count("\n") == 2, text
    assert not any(c in text.replace("\n", "") for c in "\r\x1b\x00\u2028\u2029\x85\u202e")
    if fmt == "json":
        assert _json_lines(out)[0]["alertname"] == name  # JSON keeps the value exact, only encoded
