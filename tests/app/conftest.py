"""Fixtures of the app tests: a plain agent serving its HTTP API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.app.daemon import Agent
from agent.config import Config


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[Agent]:
    """An agent with no targets, no NVML and no auth, serving HTTP on 127.0.0.1:0 (state in tmp_path)."""
    a = Agent(Config.model_validate({"targets": [], "server": {"listen": "127.0.0.1:0"}, "nvml": {"enabled": False},
                                     "state": {"path": str(tmp_path / "s.db")}}))
    await a.start()
    yield a
    await a.stop()
