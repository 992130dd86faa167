"""The agent's HTTP endpoint on the network side: the listening socket (TLS, backlog, the connection
guard's protocol), the open-file budget it needs, and what ``/api/v1/status`` and ``/metrics`` say
about it.

Why apart from :mod:`agent.app.server` (routes, handlers, middlewares): that module decides what a
request gets; this one decides how connections reach it, which the daemon sizes against
``ulimit -n`` before anything is served.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.app.connections import AcceptErrorLog, ConnectionGuard
from agent.app.hosts import HostPolicy
from agent.app.server import GUARD
from agent.config import ServerConfig
from agent.errors import ConfigError

__all__ = ["BACKLOG", "FD_RESERVE", "HttpCollector", "HttpServer", "descriptor_warning", "descriptors_needed", "serve",
           "server_status"]

#: The listen backlog, which asyncio also uses as the number of connections it accepts in one go,
#: before the guard sees any of them: so up to two batches beyond max_connections hold descriptors
#: for a moment (one being admitted, one accepted meanwhile while evicted ones are still closing).
BACKLOG = 64
#: Descriptors besides HTTP and scrape connections: state database, tailed logs, NVML, sinks, listener.
FD_RESERVE = 64


def _ssl_context(config: ServerConfig) -> ssl.SSLContext | None:
    if config.tls is None:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(config.tls.cert_file, config.tls.key_file)
    except OSError as exc:  # checked when the config loaded; the files changed since
        raise ConfigError(f"server.tls: cannot load the certificate and key: {exc}") from exc
    return ctx


@dataclass
class HttpServer:
    """A serving endpoint: ``port`` is the bound port (for ``listen: ...:0``); :meth:`close` stops it."""

    runner: web.AppRunner
    server: asyncio.Server
    guard: ConnectionGuard
    accept_log: AcceptErrorLog
    port: int

    async def close(self) -> None:
        self.server.close()
        await self.runner.cleanup()  # lets in-flight handlers finish, closes keep-alive connections
        self.guard.close_all()
        self.accept_log.uninstall()


async def serve(app: web.Application, config: ServerConfig, accept_log: AcceptErrorLog | None = None) -> HttpServer:
    """Start serving ``app`` (from :func:`build_app`) with the limits in ``config``."""
    guard = app[GUARD]
    accept_log = accept_log or AcceptErrorLog()
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=config.keepalive_timeout,
                           max_line_size=8190, max_field_size=8190, max_headers=100, lingering_time=2.0)
    await runner.setup()
    assert runner.server is not None
    loop = asyncio.get_running_loop()
    ctx = _ssl_context(config)
    try:
        server = await loop.create_server(
            guard.factory(runner.server), config.host, config.port, ssl=ctx, backlog=BACKLOG, reuse_address=True,
            ssl_handshake_timeout=config.header_timeout if ctx is not None else None,
        )
    except BaseException:
        await runner.cleanup()
        raise
    accept_log.install(loop)
    bound = int(server.sockets[0].getsockname()[1]) if server.sockets else config.port
    return HttpServer(runner, server, guard, accept_log, bound)


def descriptors_needed(config: ServerConfig, scrape_connections: int) -> int:
    """The open-file budget the endpoint and the scraper need together (compare with ``ulimit -n``)."""
    return config.max_connections + 2 * BACKLOG + scrape_connections + FD_RESERVE


def descriptor_warning(server: ServerConfig, concurrency: int, targets: int, soft_limit: int) -> str | None:
    """Why the file-descriptor budget does not fit under the soft ``ulimit -n`` (module docstring of
    :mod:`agent.app.connections`: HTTP connections + scrape connections + a reserve), or None."""
    # two pools of scrape.concurrency: targets that answered last time, and those that failed (no more
    # of those than there are targets; file_sd may bring more later, the first pool is counted whole)
    connections = concurrency + min(concurrency, targets) if concurrency else targets
    scraping = (f"{connections} scraping (scrape.concurrency {concurrency}, as many again for failing targets)"
                if concurrency else f"one per target with scrape.concurrency 0 ({targets})")
    need = descriptors_needed(server, connections)
    if soft_limit == resource.RLIM_INFINITY or need <= soft_limit:
        return None
    return (f"server.max_connections ({server.max_connections}) + 2 x {BACKLOG} accepted at once + "
            f"{scraping} + {FD_RESERVE} for files = {need} file descriptors, "
            f"over the open-file limit ({soft_limit}): raise ulimit -n, set scrape.concurrency "
            "or lower server.max_connections")


def server_status(config: ServerConfig, guard: ConnectionGuard | None) -> dict[str, Any]:
    """The endpoint's exposure and load for ``/api/v1/status`` (never the token)."""
    return {
        "listen": config.listen,
        "auth": "bearer" if config.auth.bearer_token is not None else "none",
        "protect_reads": config.auth.protect_reads,
        "tls": config.tls is not None,
        "allowed_hosts": HostPolicy.from_config(config, socket.gethostname()).shown(),
        "writes": ("bearer token" if config.auth.bearer_token is not None else
                   "any peer" if config.allow_unauthenticated_writes else "loopback peers only"),
        "warnings": config.warnings(),
        "connections": guard.open if guard is not None else 0,
        "max_connections": config.max_connections,
    }


class HttpCollector(Collector):
    """The endpoint's connections on /metrics: held now, and closed by the guard by reason."""

    def __init__(self, guard: ConnectionGuard, accept_log: AcceptErrorLog) -> None:
        self._guard = guard
        self._accept_log = accept_log

    def collect(self) -> Iterator[Metric]:
        g = self._guard
        held = GaugeMetricFamily("sre_agent_http_connections", "HTTP connections held now, by state.",
                                 labels=["state"])
        states = g.states()
        for state in ("head", "body", "busy", "idle"):
            held.add_metric([state], states.get(state, 0))
        closed = CounterMetricFamily("sre_agent_http_connections_closed",
                                     "HTTP connections the agent closed: header_timeout, evicted (for a newer "
                                     "one at server.max_connections) or rejected (all busy).", labels=["reason"])
        for reason in ("header_timeout", "evicted", "rejected"):
            closed.add_metric([reason], g.closed.get(reason, 0))
        accepted = CounterMetricFamily("sre_agent_http_connections_accepted", "HTTP connections accepted.")
        accepted.add_metric([], g.accepted)
        errors = CounterMetricFamily("sre_agent_http_accept_errors",
                                     "accept() failures for lack of file descriptors or memory.")
        errors.add_metric([], self._accept_log.errors)
        yield from (held, closed, accepted, errors)
