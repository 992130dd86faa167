"""The agent's HTTP endpoint: its own ``/metrics``, health probes and a JSON API.

``/healthz`` answers 200 while the event loop runs (liveness); ``/readyz`` answers
200 once the first scrape cycle has finished (readiness), so a Kubernetes Service
does not route to an agent that has no data yet, and 503 ``degraded: ...`` while the agent
runs but cannot keep its promises (state database writes failing: notifications are held in
memory only), so it never reads healthy while every dispatch round fails. JSON endpoints use Prometheus' API
envelope ``{"status": "success", "data": ...}`` so tools that read Prometheus' API
read ours.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

__all__ = ["AgentView", "build_app", "serve"]


class AgentView(Protocol):
    """The read-only view of the daemon that the HTTP layer needs."""

    registry: CollectorRegistry

    @property
    def ready(self) -> bool: ...

    @property
    def degraded(self) -> str | None: ...

    def targets_json(self) -> list[dict[str, Any]]: ...

    def alerts_json(self) -> list[dict[str, Any]]: ...

    def rules_json(self) -> list[dict[str, Any]]: ...

    def status_json(self) -> dict[str, Any]: ...

    async def incidents_json(self, limit: int = 50) -> list[dict[str, Any]]: ...

    async def silences_json(self) -> list[dict[str, Any]]: ...

    async def add_silence(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def expire_silence(self, silence_id: str) -> bool: ...


def _ok(data: Any) -> web.Response:
    return web.json_response({"status": "success", "data": data})


def _error(status: int, kind: str, message: str) -> web.Response:
    return web.json_response({"status": "error", "errorType": kind, "error": message}, status=status)


def build_app(agent: AgentView) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(agent.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_: web.Request) -> web.Response:
        if not agent.ready:
            return web.Response(status=503, text="not ready: first scrape cycle has not finished\n")
        problem = agent.degraded
        if problem is not None:
            return web.Response(status=503, text=f"degraded: {problem}\n")
        return web.Response(text="ready\n")

    async def targets(_: web.Request) -> web.Response:
        return _ok({"targets": agent.targets_json()})

    async def alerts(_: web.Request) -> web.Response:
        return _ok({"alerts": agent.alerts_json()})

    async def rules(_: web.Request) -> web.Response:
        return _ok({"groups": agent.rules_json()})

    async def status(_: web.Request) -> web.Response:
        return _ok(agent.status_json())

    async def incidents(request: web.Request) -> web.Response:
        try:
            limit = int(request.query.get("limit", "50"))
        except ValueError:
            return _error(400, "bad_data", "limit must be an integer")
        return _ok({"incidents": await agent.incidents_json(max(1, min(limit, 1000)))})

    async def silences(_: web.Request) -> web.Response:
        return _ok({"silences": await agent.silences_json()})

    async def add_silence(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "bad_data", "body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "bad_data", "body must be a JSON object")
        try:
            return _ok(await agent.add_silence(body))
        except ValueError as exc:
            return _error(400, "bad_data", str(exc))

    async def expire_silence(request: web.Request) -> web.Response:
        if await agent.expire_silence(request.match_info["id"]):
            return _ok({"expired": request.match_info["id"]})
        return _error(404, "not_found", "no active or pending silence with that id")

    async def index(_: web.Request) -> web.Response:
        return web.Response(
            text="sre-agent\n\n/metrics  /healthz  /readyz  /api/v1/targets  /api/v1/alerts  /api/v1/rules  "
            "/api/v1/status  /api/v1/incidents  /api/v1/silences\n"
        )

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/api/v1/targets", targets)
    app.router.add_get("/api/v1/alerts", alerts)
    app.router.add_get("/api/v1/rules", rules)
    app.router.add_get("/api/v1/status", status)
    app.router.add_get("/api/v1/incidents", incidents)
    app.router.add_get("/api/v1/silences", silences)
    app.router.add_post("/api/v1/silences", add_silence)
    app.router.add_delete("/api/v1/silences/{id}", expire_silence)
    return app


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (to clean up) and the bound port (for port 0)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, int(bound)
