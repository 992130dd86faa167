"""Who may change the agent's state over HTTP besides a holder of the token: the JSON API's
cross-site (CSRF) defence, and the refusal of unauthenticated writes from other machines.

**Cross-site requests to the JSON API** (``POST``/``PUT``/``PATCH``/``DELETE`` under ``/api/``).
A page on another site can make the operator's browser send a request the browser does not
ask the agent about first (no CORS preflight): a form, or ``fetch(url, {mode: 'no-cors',
method: 'POST', body: new Blob([...])})``, which sends a JSON text with no ``Content-Type`` at
all. The browser then drops the answer, but the silence is made. Refused here, as OWASP's CSRF
cheat sheet recommends, are requests whose

* ``Content-Type`` is missing or not JSON (``400``): a page may only send ``application/json``
  after a preflight, and the agent answers none;
* ``Origin`` (or, without one, ``Referer``) names another host than ``Host``, or is ``null``
  (``403``);
* ``Sec-Fetch-Site`` (Fetch Metadata, sent by current browsers) is ``cross-site`` or
  ``same-site`` (``403``): another port or subdomain of the same site is not the agent.

Programs that are not browsers (Alertmanager's webhook, node agents forwarding findings
(:mod:`agent.act.sinks.forward`), ``curl -H 'Content-Type: application/json'``) send JSON
with none of those headers and pass. The UI's own forms are not under ``/api/``: they check
a CSRF token, the Origin and the session themselves (:mod:`agent.app.ui.security`).

**Writes beyond loopback.** Without ``server.auth``, a mutating request from a peer that is
not this machine (not ``127.0.0.1`` or ``::1``) is refused ``403`` and the first refusal per peer is logged, unless
``server.allow_unauthenticated_writes: true`` says something in front of the agent
authenticates; Prometheus gates its admin API behind a flag the same way. Reads stay open,
as they were. The peer is the TCP peer: behind a reverse proxy on the same machine every
request comes from loopback, so such a proxy must authenticate, or the agent have a token.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web

from agent.app.ui.security import same_origin
from agent.config import ServerConfig

__all__ = ["MUTATING", "api_refusal", "content_type_problem", "is_json_type", "local_peer", "writes_middleware"]

MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_BODIES = frozenset({"POST", "PUT", "PATCH"})
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_MAX_LOGGED = 32  # distinct refused peers logged per process

log = structlog.get_logger(__name__)


def is_json_type(request: web.Request) -> bool:
    """Whether the request declares a JSON body: ``application/json`` or ``application/<x>+json``.

    A missing header does not count: aiohttp reads it as ``application/octet-stream``.
    """
    if "Content-Type" not in request.headers:
        return False
    ctype = request.content_type
    return ctype == "application/json" or (ctype.startswith("application/") and ctype.endswith("+json"))


def content_type_problem(request: web.Request) -> str | None:
    """Why the request's body is not declared JSON, for a 400; None when it is."""
    if is_json_type(request):
        return None
    given = repr(request.content_type) if "Content-Type" in request.headers else "missing"
    return (f"Content-Type must be application/json, not {given} "
            "(with curl: -H 'Content-Type: application/json')")


def api_refusal(request: web.Request) -> tuple[int, str] | None:
    """(status, message) refusing a mutating JSON API request a browser sent from another site; None: pass."""
    if not same_origin(request):
        claimed = request.headers.get("Origin") or request.headers.get("Referer") or ""
        site = request.headers.get("Sec-Fetch-Site", "")
        return 403, (f"cross-site request refused (Origin {claimed[:80]!r}, Sec-Fetch-Site {site[:20]!r}): the "
                     "JSON API takes writes from programs and the agent's own pages only")
    if request.method in _BODIES:
        problem = content_type_problem(request)
        if problem is not None:
            return 400, problem
    return None


#: The peers that are this machine's own clients: ``127.0.0.1`` and ``::1`` only, not all of 127/8. A
#: service mesh's sidecar (Istio's inbound passthrough) connects from ``127.0.0.6`` on behalf of any pod
#: in the mesh; counting it as local would open unauthenticated writes to the whole cluster.
_LOCAL_PEERS = frozenset({ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")})


def local_peer(remote: str | None) -> bool:
    """Whether the TCP peer ``remote`` (``request.remote``) is a client on this machine: ``127.0.0.1``
    or ``::1``, also written as an IPv4-mapped IPv6 address (``::ffff:127.0.0.1``)."""
    if not remote:
        return False
    try:
        ip = ipaddress.ip_address(remote)
    except ValueError:
        return False
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return ip in _LOCAL_PEERS or mapped in _LOCAL_PEERS


def _error(request: web.Request, status: int, kind: str, message: str) -> web.Response:
    """The refusal in the JSON API's envelope under ``/api/``, as text for the UI's forms."""
    if request.path.startswith("/api/"):
        return web.json_response({"status": "error", "errorType": kind, "error": message}, status=status)
    return web.Response(status=status, text=f"{message}\n")


def writes_middleware(config: ServerConfig) -> Any:
    """The middleware applying both refusals of the module docstring to ``config``'s endpoint."""
    gated = config.auth.bearer_token is None and not config.allow_unauthenticated_writes
    logged: set[str] = set()  # peers whose refused write was logged; a flood of peers logs no more

    @web.middleware
    async def guard_writes(request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.method not in MUTATING:
            return await handler(request)
        if gated and not local_peer(request.remote):
            peer = str(request.remote)[:64]
            if len(logged) < _MAX_LOGGED and peer not in logged:  # a sender that drops 4xx loses its posts
                logged.add(peer)
                log.warning("refused a write from another machine: the endpoint has no server.auth",
                            remote=peer, method=request.method, path=request.path[:200])
            return _error(request, 403, "forbidden", "writes from other machines need server.auth (a bearer "
                          "token), or server.allow_unauthenticated_writes: true where something in front "
                          "authenticates")
        if request.path.startswith("/api/"):
            refused = api_refusal(request)
            if refused is not None:
                return _error(request, refused[0], "forbidden" if refused[0] == 403 else "bad_data", refused[1])
        return await handler(request)

    return guard_writes
