"""The agent's HTTP endpoint: its own ``/metrics``, health probes and a JSON API.

``/healthz`` answers 200 while the event loop runs (liveness); ``/readyz`` answers
200 once the first scrape cycle has finished (readiness), so a Kubernetes Service
does not route to an agent that has no data yet, and 503 ``degraded: ...`` while the agent
runs but cannot keep its promises (state database writes failing: notifications are held in
memory only), so it never reads healthy while every dispatch round fails. JSON endpoints use Prometheus' API
envelope ``{"status": "success", "data": ...}`` so tools that read Prometheus' API
read ours.

The endpoint is hardened because it shares a process with the scraper:

* **limits** (:mod:`agent.app.connections`): a deadline for each request head, a cap on
  connections, a keep-alive timeout, a body size cap and a body read deadline, so half-sent
  requests cannot take the file descriptors the scraper needs or keep ``/healthz`` from answering.
* **authentication**: with ``server.auth`` a bearer token (compared in constant time) is required
  for every mutating request, and for reads too with ``protect_reads``; ``/healthz`` and
  ``/readyz`` stay open. ``server.tls`` serves HTTPS. The web UI (:mod:`agent.app.ui`, at ``/``)
  logs a browser in with the same token into a cookie session that authorizes reads, and its
  forms check that session, a CSRF token and the Origin (:mod:`agent.app.ui.security`).
* **browsers on other sites**: a request whose ``Host`` names something the agent is not
  (a DNS-rebound name) is a 400 (:mod:`agent.app.hosts`); the JSON API refuses writes without a
  JSON ``Content-Type`` or with a cross-site Origin or Fetch-Metadata, and without ``server.auth``
  it takes writes from loopback peers only (:mod:`agent.app.writes`).
* **the Alertmanager webhook** (``POST /api/v1/alertmanager/webhook``, :mod:`agent.act.intake`) is
  answered 200 once its alerts are committed to the state database, 400 naming the problem for a
  payload that is not Alertmanager's version-4 webhook (Alertmanager does not retry a 4xx), and 503
  when the state database refused the write (Alertmanager retries a 5xx);
* **forwarded findings** (``POST /api/v1/findings``, :mod:`agent.act.finding_intake`): what node agents
  send (``forward:``), answered 200 once recorded in an incident, 400 naming the problem, 413 over
  :data:`~agent.act.finding_intake.MAX_BODY_BYTES`, 503 when the state database refused the write (the
  node agent's outbox retries);
* **bad input** is answered ``400`` naming the problem (or ``413``/``408`` for a body too big or
  too slow); numbers in paths and queries are ASCII digits only (:func:`_ascii_int`); an unexpected
  exception is logged once with its traceback and answered a generic ``500``, a path no input
  should reach.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import socket
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol

import structlog
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from agent.act.finding_intake import MAX_BODY_BYTES as FINDING_BODY_LIMIT
from agent.app.connections import ConnectionGuard, guard_middleware
from agent.app.hosts import HostPolicy, host_middleware
from agent.app.triage import CONTENT_TYPES, CSP, FORMATS
from agent.app.ui import UiView, add_ui, bypasses_bearer
from agent.app.writes import content_type_problem, writes_middleware
from agent.config import ServerConfig
from agent.errors import BusyError, NotFoundError, StateError

__all__ = ["GUARD", "AgentView", "build_app", "new_guard"]

log = structlog.get_logger(__name__)

_OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # probes never need the token
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MAX_INCIDENTS = 1000
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: The app's connection guard: its middleware marks requests, :func:`~agent.app.listener.serve` wraps
#: the protocol with it.
GUARD = web.AppKey("guard", ConnectionGuard)


class AgentView(UiView, Protocol):
    """The view of the daemon that the HTTP layer needs: what the UI pages read, and more."""

    @property
    def ready(self) -> bool: ...

    @property
    def degraded(self) -> str | None: ...

    async def accept_webhook(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def incident_report(self, incident_id: int, fmt: str) -> str: ...

    def webhook_refused(self) -> None: ...

    async def accept_finding(self, body: dict[str, Any]) -> dict[str, Any]: ...

    def finding_refused(self) -> None: ...


class _BadRequest(Exception):
    """A request the API refuses; answered with ``status`` and ``message`` (never escapes this module)."""

    def __init__(self, message: str, status: int = 400, kind: str = "bad_data") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


def _ok(data: Any) -> web.Response:
    return web.json_response({"status": "success", "data": data})


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"status": "error", "errorType": kind, "error": message}, status=status,
                             headers=headers)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def _type_name(value: object) -> str:
    return {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
            type(None): "null"}.get(type(value), type(value).__name__)


async def read_json_object(request: web.Request, *, timeout_s: float) -> dict[str, Any]:
    """The request body as a JSON object, or :class:`_BadRequest` saying what is wrong with it."""
    guard = request.app[GUARD]
    problem = content_type_problem(request)  # a missing one too: no-cors fetches send none (agent.app.writes)
    if problem is not None:
        raise _BadRequest(problem)
    guard.reading_body(request.transport, True)  # evictable at the connection cap meanwhile
    try:
        async with asyncio.timeout(timeout_s):
            raw = await request.read()  # over client_max_size: aiohttp raises 413
    except TimeoutError as exc:
        raise _BadRequest(f"the request body did not arrive within {timeout_s:g}s", 408, "timeout") from exc
    except ConnectionError as exc:  # the client went away, or the guard closed it for a newer one
        raise _BadRequest("the connection closed before the body arrived") from exc
    finally:
        guard.reading_body(request.transport, False)
    if not raw.strip():
        raise _BadRequest("the body is empty; expected a JSON object")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadRequest(f"the body is not UTF-8 (byte {raw[exc.start]:#04x} at offset {exc.start})") from exc
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise _BadRequest("the body's JSON is nested too deeply") from exc
    except ValueError as exc:  # json.JSONDecodeError, NaN/Infinity, integers over 4300 digits
        raise _BadRequest(f"the body is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise _BadRequest(f"the body must be a JSON object, not {_type_name(data)}")
    return data


def _ascii_int(text: str, *, digits: int) -> int | None:
    """``text`` as a non-negative integer when it is 1 to ``digits`` ASCII digits, else None.

    Not ``int()`` alone: it also takes Arabic-Indic and fullwidth digits, underscores, signs and
    surrounding spaces (so ``/incidents/\uff11`` would alias ``/incidents/1``), and ``str.isdigit()``
    passes superscripts that ``int()`` then refuses (a 500 where a 400 belongs).
    """
    if not 1 <= len(text) <= digits or not text.isascii() or not text.isdigit():
        return None
    return int(text)


def _limit(request: web.Request) -> int:
    text = request.query.get("limit", "50")
    limit = _ascii_int(text, digits=10)
    if limit is None or not 1 <= limit <= _MAX_INCIDENTS:
        raise _BadRequest(f"limit must be an integer from 1 to {_MAX_INCIDENTS}, not {text[:40]!r}")
    return limit


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Refusals become JSON errors; anything unexpected is logged once and answered a generic 500."""
    try:
        return await handler(request)
    except _BadRequest as exc:
        return _error(exc.status, exc.kind, str(exc))
    except web.HTTPException:  # aiohttp's own answers: 404, 405, 413 ...
        raise
    except Exception:
        log.exception("unexpected error answering a request", method=request.method, path=request.path)
        return _error(500, "internal", "internal error; the agent's log has the details")


def _auth(token: str, protect_reads: bool) -> Any:
    expected = token.encode()

    @web.middleware
    async def auth(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.path in _OPEN_PATHS or (request.method in _SAFE_METHODS and not protect_reads):
            return await handler(request)
        if bypasses_bearer(request):  # the web UI's own session, CSRF and Origin checks (agent.app.ui.security)
            return await handler(request)
        scheme, _, given = request.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8", "replace"), expected):
            return _error(401, "unauthorized", "this endpoint needs 'Authorization: Bearer <token>' "
                          "with the token in server.auth", headers={"WWW-Authenticate": 'Bearer realm="sre-agent"'})
        return await handler(request)

    return auth


def new_guard(config: ServerConfig) -> ConnectionGuard:
    return ConnectionGuard(max_connections=config.max_connections, header_timeout_s=config.header_timeout)


def build_app(agent: AgentView, config: ServerConfig | None = None,
              guard: ConnectionGuard | None = None) -> web.Application:
    cfg = config or ServerConfig()
    guard = guard or new_guard(cfg)
    body_timeout = cfg.body_timeout

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
        return _ok({"incidents": await agent.incidents_json(_limit(request))})

    async def silences(_: web.Request) -> web.Response:
        return _ok({"silences": await agent.silences_json()})

    async def add_silence(request: web.Request) -> web.Response:
        body = await read_json_object(request, timeout_s=body_timeout)
        try:
            return _ok(await agent.add_silence(body))
        except ValueError as exc:  # a bad matcher, duration or time range, named by the act layer
            raise _BadRequest(str(exc)) from exc

    async def expire_silence(request: web.Request) -> web.Response:
        if await agent.expire_silence(request.match_info["id"]):
            return _ok({"expired": request.match_info["id"]})
        return _error(404, "not_found", "no active or pending silence with that id")

    async def alertmanager_webhook(request: web.Request) -> web.Response:
        try:
            body = await read_json_object(request, timeout_s=body_timeout)
            return _ok(await agent.accept_webhook(body))
        except _BadRequest:
            agent.webhook_refused()
            raise
        except ValueError as exc:  # not Alertmanager's version-4 webhook, named by agent.act.intake
            agent.webhook_refused()
            raise _BadRequest(str(exc)) from exc
        except StateError:  # logged by the act layer; a 5xx makes Alertmanager retry
            return _error(503, "unavailable", "the state database refused the write; retry later")

    async def incident_report(request: web.Request) -> web.Response:
        """The triage report (agent.app.triage): HTML by default, ``?format=md`` or ``json``."""
        fmt = request.query.get("format", "html")
        text = request.match_info["id"]
        if fmt not in FORMATS:
            raise _BadRequest(f"format must be one of {', '.join(FORMATS)}, not {fmt[:20]!r}")
        incident_id = _ascii_int(text, digits=18)
        if incident_id is None:
            raise _BadRequest(f"an incident id is a positive integer in ASCII digits, not {text[:40]!r}")
        try:
            body = await agent.incident_report(incident_id, fmt)
        except NotFoundError as exc:
            if fmt == "json":
                return _error(404, "not_found", str(exc))
            return web.Response(status=404, text=f"{exc}\n")
        except BusyError as exc:  # every report slot taken (agent.app.workpool): come back, never queue
            return _error(503, "unavailable", str(exc), headers={"Retry-After": str(exc.retry_after_s)})
        headers = {"Content-Type": CONTENT_TYPES[fmt], "Content-Security-Policy": CSP,
                   "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
        return web.Response(text=body, headers=headers)

    async def findings(request: web.Request) -> web.Response:
        try:
            if (request.content_length or 0) > FINDING_BODY_LIMIT:
                raise _BadRequest(f"a forwarded finding is at most {FINDING_BODY_LIMIT} bytes; this one declares "
                                  f"{request.content_length}", 413, "too_large")
            body = await read_json_object(request, timeout_s=body_timeout)
            if len(await request.read()) > FINDING_BODY_LIMIT:  # chunked: no length declared
                raise _BadRequest(f"a forwarded finding is at most {FINDING_BODY_LIMIT} bytes", 413, "too_large")
            return _ok(await agent.accept_finding(body))
        except _BadRequest:
            agent.finding_refused()
            raise
        except web.HTTPRequestEntityTooLarge:  # over server.body_limit, refused by aiohttp itself
            agent.finding_refused()
            raise
        except ValueError as exc:  # not the findings intake format, named by agent.act.finding_intake
            agent.finding_refused()
            raise _BadRequest(str(exc)) from exc
        except StateError:  # logged by the act layer; a 5xx makes the node agent's outbox retry
            return _error(503, "unavailable", "the state database refused the write; retry later")

    policy = HostPolicy.from_config(cfg, socket.gethostname())
    middlewares: list[Any] = [guard_middleware(guard), _errors, host_middleware(policy, _OPEN_PATHS),
                              writes_middleware(cfg)]
    token = cfg.auth.bearer_token
    if token is not None:
        middlewares.append(_auth(token.get_secret_value(), cfg.auth.protect_reads))
    app = web.Application(middlewares=middlewares, client_max_size=cfg.body_limit)
    app[GUARD] = guard
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
    app.router.add_post("/api/v1/alertmanager/webhook", alertmanager_webhook)
    add_ui(app, agent, token=token.get_secret_value() if token is not None else None,
           protect_reads=cfg.auth.protect_reads, body_timeout_s=body_timeout)  # the web UI at /
    app.router.add_get("/incidents/{id}", incident_report)
    app.router.add_post("/api/v1/findings", findings)
    return app
