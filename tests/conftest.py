"""Shared test helpers: where the shared conformance data lives, and real local HTTP servers."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import structlog
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
SHARED = REPO.parent / "shared"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def shared_path(*parts: str) -> Path:
    """A path under ../shared, skipping the test when a user's clone has no ../shared."""
    p = SHARED.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p.relative_to(SHARED.parent)} not present (conformance data lives beside the repo in CI)")
    return p


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """cli.main() binds structlog to the test's captured stderr; restore logging after each test."""
    saved, root, ours = structlog.get_config(), logging.getLogger(), logging.getLogger("agent")
    handlers, level, our_level = root.handlers[:], root.level, ours.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)
    ours.setLevel(our_level)


@pytest.fixture
async def http_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Start real aiohttp servers on 127.0.0.1 (port 0); returns each one's /metrics URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("*", "/metrics", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/metrics"

    yield start
    for r in runners:
        await r.cleanup()
