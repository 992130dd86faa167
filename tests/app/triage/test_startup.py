"""Tests for what the daemon says at start-up about the triage report's Slack links (server.external_url)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import structlog

from agent.app.daemon import Agent
from agent.app.logs import configure_logging
from agent.config import Config


def _config(tmp_path: Path, **server: str) -> Config:
    token = tmp_path / "token"
    token.write_text("xoxb-test")
    return Config.model_validate({
        "targets": [], "nvml": {"enabled": False}, "state": {"path": str(tmp_path / "s.db")},
        "server": {"listen": "127.0.0.1:0", **server},
        "receivers": [{"name": "slack", "slack": {"token_file": str(token), "channel": "C0123ABCD",
                                                  "api_url": "http://127.0.0.1:9/api/"}}],
        "route": {"receiver": "slack"}})


@pytest.mark.parametrize(("server", "says"), [({}, True), ({"external_url": "https://agent.example.test/"}, False)])
async def test_start_up_says_when_slack_messages_carry_no_report_link(tmp_path: Path, server: dict[str, str],
                                                                      says: bool) -> None:
    """With a Slack receiver and no server.external_url the agent logs at info level that there is no link."""
    agent = Agent(_config(tmp_path, **server))
    configure_logging("console", "info", stream=io.StringIO())  # whatever an earlier test left (conftest restores)
    with structlog.testing.capture_logs() as logs:
        await agent.start(serve_http=False)
        await agent.stop()
    found = [e for e in logs if "server.external_url is not set" in e["event"]]
    assert [e["log_level"] for e in found] == (["info"] if says else [])


def test_external_url_is_checked_and_loses_its_trailing_slash(tmp_path: Path) -> None:
    """server.external_url must be http(s) and safe inside a Slack link; a trailing slash is dropped."""
    assert _config(tmp_path, external_url="https://agent.example.test/").server.external_url == \
        "https://agent.example.test"
    for bad in ("agent.example.test", "https://a.test/x|y", "javascript:alert(1)"):
        with pytest.raises(ValueError, match="external_url"):
            _config(tmp_path, external_url=bad)
