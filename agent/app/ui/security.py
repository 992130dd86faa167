"""How the web UI authenticates a browser and refuses cross-site requests, and the headers it sends.

The JSON API authenticates with ``Authorization: Bearer <token>`` (``server.auth``). A browser
cannot put that header on a plain navigation or a form post, and a token kept where page
scripts can read it (``sessionStorage``) is one injected script away from leaking. So the UI
keeps its own **cookie session**:

* ``POST /login`` takes the API token once, compares it in constant time and, when it matches,
  starts a session: a fresh random id (never the one the browser had before: no session
  fixation) in an ``HttpOnly; SameSite=Strict`` cookie (``Secure`` over HTTPS) that page scripts
  cannot read. The token itself is never stored, echoed or rendered into any page.
* Sessions live in this process only (:class:`Sessions`), expire after :data:`SESSION_TTL_S`,
  are capped at :data:`MAX_SESSIONS` (the oldest goes first) and end on ``POST /logout`` or a
  restart (log in again).
* A valid session authorizes **reads** like the bearer token does (pages, and under
  ``protect_reads`` the JSON API and the incident reports). It never authorizes a mutating
  request by itself: the UI's own form endpoints each check, besides the
  session, a **CSRF token** bound to it and the request's **Origin**
  (:mod:`agent.app.ui.pages` lists them).

Cross-site posts. A form on another site can make the browser post to the agent, and with
``SameSite=Strict`` the cookie stays behind, but older browsers and same-site subdomains are
why there are two more checks: the form's hidden ``csrf`` field must equal
HMAC-SHA256(process secret, session id), which another origin cannot read or compute; and the
``Origin`` header, which browsers send on every cross-origin post, must name the agent itself
(``Sec-Fetch-Site: cross-site`` is refused too). Without ``server.auth`` every browser gets an
anonymous session id on its first page, so the CSRF token is bound to something all the same.
The JSON API keeps its own defence (:mod:`agent.app.writes`): it takes only bodies declared
``application/json`` (a missing ``Content-Type`` too is refused: a ``no-cors`` fetch sends none),
answers no CORS preflight, and refuses writes whose Origin or ``Sec-Fetch-Site`` is another site's.
``POST /login`` gives each client address a few wrong tokens, then makes it wait
(:mod:`agent.app.ui.throttle`); its ``next`` is kept only when no browser could read it as
another host (:func:`agent.app.ui.pages._local_path`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar
from urllib.parse import urlsplit

from aiohttp import web

__all__ = [
    "COOKIE",
    "CSP",
    "MAX_SESSIONS",
    "SECURITY_HEADERS",
    "SESSION_TTL_S",
    "Sessions",
    "same_origin",
    "secure_headers",
]

COOKIE = "sre_agent_session"
SESSION_TTL_S = 12 * 3600.0  # a working day of on-call, then log in again
MAX_SESSIONS = 256  # logged-in browsers one agent serves; beyond that the oldest session ends

#: No inline script or style, nothing from another origin, no framing (clickjacking), no plugins.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate CSP 2
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",  # pages show live state and carry a CSRF token
}


_R = TypeVar("_R", bound=web.StreamResponse)


def secure_headers(response: _R) -> _R:
    """Put :data:`SECURITY_HEADERS` on a UI response (keeping a Cache-Control it already set)."""
    for name, value in SECURITY_HEADERS.items():
        if name not in response.headers:
            response.headers[name] = value
    return response


def same_origin(request: web.Request) -> bool:
    """Whether a state-changing request comes from the agent's own pages, by ``Origin`` (or ``Referer``).

    Browsers send ``Origin`` on every POST; a request with neither header is not a cross-site
    browser request (curl, a script with the cookie), and the CSRF token still has to match.
    """
    if request.headers.get("Sec-Fetch-Site", "same-origin") not in ("same-origin", "none"):
        return False
    claimed = request.headers.get("Origin") or request.headers.get("Referer")
    if claimed is None:
        return True
    if claimed == "null":  # sandboxed frames, file: pages, some redirects: never our own page
        return False
    parts = urlsplit(claimed)
    # host[:port] only, not the scheme: behind a proxy that terminates TLS the page is https and the
    # request reaching the agent http; the Host header the proxy forwards still names the agent
    return parts.scheme in ("http", "https") and parts.netloc.lower() == request.host.lower()


class Sessions:
    """The UI's browser sessions: which ids are logged in, and the CSRF token of any id.

    ``token`` is the API's bearer token (None: no authentication configured, every browser may
    read and act, and only cross-site requests are refused). ``clock`` is monotonic seconds.
    """

    def __init__(self, token: str | None, *, protect_reads: bool = False,
                 clock: Callable[[], float] = time.monotonic, max_sessions: int = MAX_SESSIONS,
                 ttl_s: float = SESSION_TTL_S) -> None:
        self._token = token.encode() if token is not None else None
        self.protect_reads = protect_reads and token is not None
        self._clock = clock
        self._max = max_sessions
        self._ttl_s = ttl_s
        self._secret = secrets.token_bytes(32)  # per process: a restart invalidates every CSRF token
        self._live: OrderedDict[str, float] = OrderedDict()  # logged-in session id -> expiry (monotonic)

    @property
    def login_required(self) -> bool:
        """Whether acting (and with ``protect_reads`` reading) needs a login: a token is configured."""
        return self._token is not None

    # -- ids and CSRF tokens ---------------------------------------------------------------------
    @staticmethod
    def new_id() -> str:
        return secrets.token_urlsafe(32)

    def csrf_for(self, session_id: str) -> str:
        """The CSRF token bound to ``session_id``: HMAC(process secret, id), so nothing needs storing."""
        return hmac.new(self._secret, session_id.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session_id: str | None, given: str | None) -> bool:
        if not session_id or not given:
            return False
        return hmac.compare_digest(self.csrf_for(session_id).encode(), given.encode("utf-8", "replace"))

    # -- logging in and out ---------------------------------------------------------------------
    def token_ok(self, given: str) -> bool:
        """Whether ``given`` is the API token (constant time); always False without one."""
        if self._token is None:
            return False
        return hmac.compare_digest(given.strip().encode("utf-8", "replace"), self._token)

    def login(self) -> str:
        """Start a logged-in session; returns its new id (the caller sets the cookie)."""
        self._expire()
        while len(self._live) >= self._max:
            self._live.popitem(last=False)
        sid = self.new_id()
        self._live[sid] = self._clock() + self._ttl_s
        return sid

    def logout(self, session_id: str | None) -> None:
        if session_id:
            self._live.pop(session_id, None)

    def logged_in(self, session_id: str | None) -> bool:
        """Whether ``session_id`` is a live logged-in session (without a token: always)."""
        if self._token is None:
            return True
        if not session_id:
            return False
        expiry = self._live.get(session_id)
        if expiry is None:
            return False
        if expiry <= self._clock():
            del self._live[session_id]
            return False
        return True

    def may_read(self, request: web.Request) -> bool:
        """Whether ``request`` may read UI pages: always, unless ``protect_reads`` and not logged in."""
        return not self.protect_reads or self.logged_in(request.cookies.get(COOKIE))

    def _expire(self) -> None:
        now = self._clock()
        for sid in [s for s, exp in self._live.items() if exp <= now]:
            del self._live[sid]

    def set_cookie(self, response: web.StreamResponse, request: web.Request, session_id: str) -> None:
        response.set_cookie(COOKIE, session_id, httponly=True, samesite="Strict", secure=request.secure,
                            path="/", max_age=int(self._ttl_s))
