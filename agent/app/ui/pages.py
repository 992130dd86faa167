"""The web UI's handlers: six server-rendered pages, the login, and the silence forms.

Pages (all ``GET``, each a template under ``templates/``): ``/alerts`` (also ``/``),
``/targets``, ``/rules``, ``/incidents`` (each row opens ``/incidents/{id}``, the triage
report), ``/silences`` and ``/status``. Form endpoints (``POST``, a redirect after success so
a reload never posts twice): ``/login``, ``/logout``, ``/silences`` (create) and
``/silences/{id}/expire``. Every form endpoint checks the request's Origin and its CSRF token,
and the silence forms a logged-in session when ``server.auth`` is set
(:mod:`agent.app.ui.security` explains why). ``/static/ui.css`` and ``/static/ui.js`` are
served from the package, from memory.

The pages show what the JSON API shows, read through the same daemon view, and poll
themselves (``static/ui.js`` refetches the page and swaps its ``data-refresh`` regions; without
JavaScript a ``<noscript>`` refresh reloads the pages that hold no form).
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urlsplit

import yaml
from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined
from multidict import MultiDictProxy
from prometheus_client import CollectorRegistry

from agent.app.ui.present import age, alert_rows, format_value, parse_time, safe_url, utc
from agent.app.ui.security import COOKIE, Sessions, same_origin, secure_headers
from agent.app.ui.throttle import LoginThrottle

__all__ = ["NAV", "SESSIONS", "UiView", "add_ui", "bypasses_bearer"]

SESSIONS = web.AppKey("ui_sessions", Sessions)
#: (path, title) of the pages in the navigation bar, in its order.
NAV = (("/alerts", "Alerts"), ("/targets", "Targets"), ("/rules", "Rules"), ("/incidents", "Incidents"),
       ("/silences", "Silences"), ("/status", "Status"))
_PAGES = frozenset({"/", "/login", *(p for p, _ in NAV)})
_FORMS = re.compile(r"^/(?:login|logout|silences|silences/[A-Za-z0-9_-]{1,64}/expire)$")
_STATIC = Path(__file__).parent / "static"
_STATIC_TYPES = {".css": "text/css", ".js": "text/javascript"}
_SAFE = frozenset({"GET", "HEAD"})
REFRESH_S = 5  # how often a page polls itself
_MAX_INCIDENTS = 200
_MAX_MATCHERS = 32
_MAX_NEXT = 2048  # a redirect target's length: a page's path and query, never a payload


class UiView(Protocol):
    """The daemon as the pages read it (a subset of :class:`agent.app.server.AgentView`)."""

    registry: CollectorRegistry

    def targets_json(self) -> list[dict[str, Any]]: ...

    def alerts_json(self) -> list[dict[str, Any]]: ...

    def rules_json(self) -> list[dict[str, Any]]: ...

    def status_json(self) -> dict[str, Any]: ...

    async def incidents_json(self, limit: int = 50) -> list[dict[str, Any]]: ...

    async def silences_json(self) -> list[dict[str, Any]]: ...

    async def add_silence(self, body: dict[str, Any]) -> dict[str, Any]: ...

    async def expire_silence(self, silence_id: str) -> bool: ...


def bypasses_bearer(request: web.Request) -> bool:
    """Whether the API's bearer-token middleware should pass ``request`` on without the header.

    UI pages and static files decide for themselves (a login page must load without a login);
    UI form posts check session, CSRF token and Origin themselves; and any other read is
    authorized by a logged-in UI session, as the bearer token would (the triage reports under
    ``protect_reads``). A session never authorizes a JSON API write: those still need the token.
    """
    sessions = request.app.get(SESSIONS)
    if sessions is None:
        return False
    path = request.path
    if request.method in _SAFE and (path in _PAGES or path.startswith("/static/")):
        return True
    if request.method == "POST" and _FORMS.match(path):
        return True
    return request.method in _SAFE and sessions.logged_in(request.cookies.get(COOKIE))


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("agent.app.ui", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["value"] = format_value
    env.filters["yaml"] = lambda v: yaml.safe_dump(v, sort_keys=False, default_flow_style=False, width=100)
    return env


def _static_files() -> dict[str, tuple[bytes, str]]:
    return {p.name: (p.read_bytes(), _STATIC_TYPES[p.suffix]) for p in _STATIC.iterdir() if p.suffix in _STATIC_TYPES}


def _local_path(text: str | None) -> str:
    """A redirect target from a form or a query (``next``): a path on this agent, never another site.

    A browser reads a URL more loosely than :func:`urllib.parse.urlsplit` does: it drops tabs
    and newlines anywhere (``/<TAB>/evil.example`` is ``//evil.example``, another host), strips
    leading control characters and spaces, reads ``\\`` as ``/``, and takes three slashes or
    ``http:evil.example`` as absolute; aiohttp drops the tab too when it writes ``Location``.
    Rather than mimic every rule (Django's ``url_has_allowed_host_and_scheme`` lists them), a
    target is kept only when it is printable ASCII with no space or backslash, so that a browser
    has nothing to drop or fold, and then begins with exactly one ``/`` and has no scheme and no
    host. A percent-escape stays an escape (a browser never decodes ``%2F`` into the host), and
    the agent's own links arrive escaped (:meth:`_Ui.guard_read`). Anything else goes to ``/alerts``.
    """
    if not text or len(text) > _MAX_NEXT or any(not "!" <= c <= "~" or c == "\\" for c in text):
        return "/alerts"
    parts = urlsplit(text)
    if not text.startswith("/") or text.startswith("//") or parts.scheme or parts.netloc:
        return "/alerts"
    return text


class _Ui:
    def __init__(self, agent: UiView, sessions: Sessions, body_timeout_s: float,
                 clock: Callable[[], float]) -> None:
        self.agent = agent
        self.sessions = sessions
        self.env = _environment()
        self.static = _static_files()
        self.body_timeout_s = body_timeout_s
        self.clock = clock
        self.throttle = LoginThrottle()

    # -- rendering ---------------------------------------------------------------------------------
    def render(self, request: web.Request, template: str, code: int = 200, **context: Any) -> web.Response:
        sid = request.cookies.get(COOKIE)
        fresh = not sid
        if not sid:
            sid = self.sessions.new_id()
        body = self.env.get_template(template).render(
            nav=NAV, path=request.path, csrf=self.sessions.csrf_for(sid), now_utc=utc(self.clock()),
            login_required=self.sessions.login_required, logged_in=self.sessions.logged_in(sid),
            refresh_s=REFRESH_S, **context)
        response = web.Response(text=body, status=code, content_type="text/html", charset="utf-8")
        if fresh:  # an anonymous session, so that a form's CSRF token is bound to something
            self.sessions.set_cookie(response, request, sid)
        return secure_headers(response)

    def refuse(self, request: web.Request, status: int, message: str) -> web.Response:
        return self.render(request, "error.html", code=status, title="Refused", message=message)

    def guard_read(self, request: web.Request) -> None:
        """Under ``protect_reads`` a browser without a session goes to the login, and back after it."""
        if self.sessions.may_read(request):
            return
        back = request.rel_url.raw_path_qs if request.path != "/login" else "/alerts"
        raise web.HTTPSeeOther(f"/login?{urlencode({'next': back}, safe='/')}", headers={"Cache-Control": "no-store"})

    async def form(self, request: web.Request, *, acting: bool) -> MultiDictProxy[Any] | web.Response:
        """The posted form, or the refusal: cross-site, a CSRF token that does not match, not logged in."""
        if not same_origin(request):
            return self.refuse(request, 403, "Cross-site request refused: this form only works from the "
                                             "agent's own pages.")
        try:
            async with asyncio.timeout(self.body_timeout_s):
                form = await request.post()
        except TimeoutError:
            return self.refuse(request, 408, "The form did not arrive in time.")
        sid = request.cookies.get(COOKIE)
        csrf = form.get("csrf")
        if not self.sessions.csrf_ok(sid, csrf if isinstance(csrf, str) else None):
            return self.refuse(request, 403, "The form's security token does not match this browser session (it "
                                             "may have expired, or the agent restarted): reload the page and retry.")
        if acting and not self.sessions.logged_in(sid):
            return self.refuse(request, 401, "Log in with the agent's API token first.")
        return form

    # -- pages ----------------------------------------------------------------------------------------
    async def root(self, _: web.Request) -> web.Response:
        raise web.HTTPFound("/alerts")

    async def alerts(self, request: web.Request) -> web.Response:
        self.guard_read(request)
        rows = alert_rows(self.agent.alerts_json(), await self.agent.silences_json(), self.clock())
        return self.render(request, "alerts.html", title="Alerts", alerts=rows,
                           firing=sum(r.state == "firing" for r in rows),
                           pending=sum(r.state == "pending" for r in rows))

    async def targets(self, request: web.Request) -> web.Response:
        self.guard_read(request)
        now = self.clock()
        rows = sorted(self.agent.targets_json(), key=lambda t: (t["health"] == "up", t["job"], t["url"]))
        for t in rows:
            t["last_scrape_age"], t["last_scrape_utc"] = age(t["last_scrape"], now), utc(t["last_scrape"])
            t["label_pairs"] = sorted({"job": t["job"], "instance": t["instance"], **t["labels"]}.items())
        return self.render(request, "targets.html", title="Targets", targets=rows,
                           down=sum(t["health"] != "up" for t in rows))

    async def rules(self, request: web.Request) -> web.Response:
        self.guard_read(request)
        now = self.clock()
        groups = self.agent.rules_json()
        for g in groups:
            g["last_age"] = age(parse_time(g["lastEvaluation"]), now)
            for r in g["rules"]:
                r["last_age"] = age(parse_time(r["lastEvaluation"]), now)
                r["runbook"] = safe_url(r.get("annotations", {}).get("runbook_url"))
        return self.render(request, "rules.html", title="Rules", groups=groups,
                           unhealthy=sum(r["health"] != "ok" for g in groups for r in g["rules"]))

    async def incidents(self, request: web.Request) -> web.Response:
        self.guard_read(request)
        now = self.clock()
        rows = await self.agent.incidents_json(_MAX_INCIDENTS)
        for i in rows:
            i["started_age"], i["started_utc"] = age(i["started_ms"] / 1000, now), utc(i["started_ms"] / 1000)
            i["lasted"] = age(i["started_ms"] / 1000, (i["resolved_ms"] / 1000) if i["resolved_ms"] else now)
        return self.render(request, "incidents.html", title="Incidents", incidents=rows)

    async def silences(self, request: web.Request, *, status: int = 200, error: str = "",
                       values: dict[str, str] | None = None) -> web.Response:
        self.guard_read(request)
        now = self.clock()
        rows = await self.agent.silences_json()
        order = {"active": 0, "pending": 1, "expired": 2}
        rows.sort(key=lambda s: (order.get(s["status"]["state"], 3), s["endsAt"]))
        for s in rows:
            ends = parse_time(s["endsAt"])
            s["ends_utc"], s["ends_age"], s["ends_in"] = utc(ends), age(ends, now), age(now, ends or now)
            s["matcher_texts"] = [_matcher_text(m) for m in s["matchers"]]
        if values is None:
            values = {"matchers": "\n".join(request.query.getall("matcher", []))[:8192],
                      "duration": "2h", "comment": "", "createdBy": ""}
        return self.render(request, "silences.html", code=status, title="Silences", silences=rows, error=error,
                           values=values, created=request.query.get("created", "")[:64],
                           expired=request.query.get("expired", "")[:64])

    async def status(self, request: web.Request) -> web.Response:
        self.guard_read(request)
        status = self.agent.status_json()
        config = status["config"]
        return self.render(request, "status.html", title="Status", status=status, config=config,
                           source=config.get("source", {}), remote_write=config.get("remote_write", []),
                           remote_write_metrics=list(_remote_write_metrics(self.agent.registry)))

    async def login_page(self, request: web.Request) -> web.Response:
        return self.render(request, "login.html", title="Log in", error="",
                           next=_local_path(request.query.get("next")))

    async def static_file(self, request: web.Request) -> web.Response:
        found = self.static.get(request.match_info["name"])
        if found is None:
            raise web.HTTPNotFound()
        body, ctype = found
        response = web.Response(body=body, content_type=ctype, charset="utf-8",
                                headers={"Cache-Control": "public, max-age=300"})
        return secure_headers(response)

    # -- forms ----------------------------------------------------------------------------------------
    async def login(self, request: web.Request) -> web.Response:
        form = await self.form(request, acting=False)
        if isinstance(form, web.Response):
            return form
        target = _local_path(str(form.get("next", "")))
        if not self.sessions.login_required:
            raise web.HTTPSeeOther(target)
        client = request.remote or ""
        wait = self.throttle.wait_s(client)
        if wait > 0:  # not checked at all: a guess inside the wait neither counts nor tells anything
            return self._slow_down(request, target, wait)
        if not self.sessions.token_ok(str(form.get("token", ""))):
            wait = self.throttle.failed(client)
            if wait > 0:
                return self._slow_down(request, target, wait, code=401)
            return self.render(request, "login.html", code=401, title="Log in", next=target,
                               error="That is not the agent's API token (server.auth).")
        self.throttle.succeeded(client)
        self.sessions.logout(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther(target)
        self.sessions.set_cookie(response, request, self.sessions.login())
        raise response

    def _slow_down(self, request: web.Request, target: str, wait_s: float, code: int = 429) -> web.Response:
        seconds = max(1, math.ceil(wait_s))
        response = self.render(request, "login.html", code=code, title="Log in", next=target,
                               error=f"Too many wrong tokens from this address: try again in {seconds} s.")
        response.headers["Retry-After"] = str(seconds)
        return response

    async def logout(self, request: web.Request) -> web.Response:
        form = await self.form(request, acting=False)
        if isinstance(form, web.Response):
            return form
        self.sessions.logout(request.cookies.get(COOKIE))
        response = web.HTTPSeeOther("/alerts")
        response.del_cookie(COOKIE, path="/")
        raise response

    async def create_silence(self, request: web.Request) -> web.Response:
        form = await self.form(request, acting=True)
        if isinstance(form, web.Response):
            return form
        values = {k: str(form.get(k, ""))[:8192] for k in ("matchers", "duration", "comment", "createdBy")}
        matchers = [line.strip() for line in values["matchers"].splitlines() if line.strip()]
        if not matchers or len(matchers) > _MAX_MATCHERS:
            return await self.silences(request, status=400, values=values, error=f"Give one to {_MAX_MATCHERS} "
                                       "matchers, one per line, like alertname=\"X\".")
        body = {"matchers": matchers, "duration": values["duration"].strip() or "2h",
                "comment": values["comment"], "createdBy": values["createdBy"].strip() or "web UI"}
        try:
            created = await self.agent.add_silence(body)
        except ValueError as exc:  # the act layer names what is wrong
            return await self.silences(request, status=400, values=values, error=str(exc))
        raise web.HTTPSeeOther(f"/silences?created={created['silenceID']}")

    async def expire_silence(self, request: web.Request) -> web.Response:
        form = await self.form(request, acting=True)
        if isinstance(form, web.Response):
            return form
        silence_id = request.match_info["id"]
        if not await self.agent.expire_silence(silence_id):
            return self.refuse(request, 404, "No active or pending silence with that id.")
        raise web.HTTPSeeOther(f"/silences?expired={silence_id}")


def _matcher_text(m: dict[str, Any]) -> str:
    op = ("=~" if m["isEqual"] else "!~") if m["isRegex"] else ("=" if m["isEqual"] else "!=")
    value = str(m["value"]).replace("\\", "\\\\").replace('"', '\\"')
    return f'{m["name"]}{op}"{value}"'


def _remote_write_metrics(registry: CollectorRegistry) -> Iterable[tuple[str, str, str]]:
    """The remote-write queues' own series (sent, failed, pending, dropped) as (name, labels, value)."""
    for family in registry.collect():
        if not family.name.startswith("sre_agent_remote_write_"):
            continue
        for s in family.samples:
            labels = ", ".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            yield s.name, labels, format_value(s.value)


def add_ui(app: web.Application, agent: UiView, *, token: str | None, protect_reads: bool,
           body_timeout_s: float = 30.0, clock: Callable[[], float] = time.time) -> None:
    """Register the UI's routes on ``app`` (the API's application) and its sessions under :data:`SESSIONS`."""
    sessions = Sessions(token, protect_reads=protect_reads)
    ui = _Ui(agent, sessions, body_timeout_s, clock)
    app[SESSIONS] = sessions
    app.router.add_get("/", ui.root)
    for path, handler in (("/alerts", ui.alerts), ("/targets", ui.targets), ("/rules", ui.rules),
                          ("/incidents", ui.incidents), ("/silences", ui.silences), ("/status", ui.status),
                          ("/login", ui.login_page), ("/static/{name}", ui.static_file)):
        app.router.add_get(path, handler)
    app.router.add_post("/login", ui.login)
    app.router.add_post("/logout", ui.logout)
    app.router.add_post("/silences", ui.create_silence)
    app.router.add_post("/silences/{id}/expire", ui.expire_silence)
