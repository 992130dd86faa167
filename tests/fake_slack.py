"""A local stand-in for Slack's Web API and incoming webhooks, served by aiohttp on 127.0.0.1.

It answers the calls the Slack sink makes the way Slack documents them
(https://api.slack.com/methods): ``chat.postMessage``, ``chat.update``,
``conversations.history``, ``conversations.list`` and ``auth.test`` under ``/api/``, and
an incoming webhook under ``/services/...``. What makes it worth more than a mock:

* channel names (``#alerts``) resolve to IDs for posting, and replies carry the ID;
  ``chat.update`` and ``conversations.history`` need the ID (a name gets
  ``channel_not_found``, like Slack) and ``chat.update`` an existing ts
  (``message_not_found``);
* messages are stored (text, blocks, metadata, thread_ts, edits), so a test asserts
  what a user would see, and ``conversations.history`` reads them back (top-level
  only, newest first, metadata only with ``include_all_metadata``);
* ``Authorization: Bearer xoxb-...`` is required (``not_authed`` / ``invalid_auth``);
* Block Kit limits are checked (``invalid_blocks``), so a too-long header fails here too;
* bodies are read as JSON, form-encoded or query parameters, as slack-sdk sends them
  (JSON for chat.*, a GET query for conversations.*, a POST query for auth.test);
* faults are queued per method: an ``ok: false`` error, HTTP 429 with ``Retry-After``,
  HTTP 5xx with an HTML body, a hang (released when the server stops), or a flood: a 200 JSON
  reply streamed without end up to ``flood`` bytes (``flood_sent`` counts what got out before
  the client hung up).

Use :func:`running_fake_slack` (an async context manager) in a fixture::

    @pytest.fixture
    async def slack() -> AsyncIterator[FakeSlack]:
        async with running_fake_slack() as fake:
            yield fake

then point a receiver at ``fake.api_url`` (token ``fake.token``) or ``fake.webhook_url``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

__all__ = ["FakeSlack", "Fault", "SlackCall", "SlackMessage", "running_fake_slack"]

DEFAULT_CHANNELS = {"alerts": "C0123ABCD", "general": "C0GENERAL1"}
WEBHOOK_PATH = "/services/T0FAKE/B0FAKE/fakewebhooksecret"
BOT_ID = "B0FAKEBOT"


@dataclass
class SlackCall:
    """One request as received: the API method (``webhook`` for the webhook) and its parameters."""

    method: str
    body: dict[str, Any]
    http_method: str = "POST"


@dataclass
class SlackMessage:
    """One message as a channel member would see it."""

    channel: str  # the channel ID
    ts: str
    text: str
    blocks: list[dict[str, Any]]
    metadata: dict[str, Any] | None = None
    thread_ts: str | None = None
    edits: int = 0
    via: str = "api"  # or "webhook"
    received: float = field(default_factory=time.time)  # when it was posted (wall clock), for latencies

    def header(self) -> str:
        """The text of the first header block ('' when there is none)."""
        for block in self.blocks:
            if block.get("type") == "header":
                return str(block["text"]["text"])
        return ""


@dataclass
class Fault:
    """A canned answer for the next request to ``method`` (None: any method)."""

    method: str | None = None
    status: int = 200
    error: str | None = None  # Web API: the ok:false code; webhook: the body text
    retry_after: float | None = None
    hang: bool = False
    body: str | None = None  # raw body instead of the default for the status
    flood: int = 0  # stream a JSON reply of this many bytes (never finished as JSON)


@dataclass
class FakeSlack:
    """The fake's state; every attribute is meant to be read (and ``faults`` appended to) by tests."""

    token: str = "xoxb-fake-token"
    channels: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_CHANNELS))  # name -> ID
    archived: set[str] = field(default_factory=set)  # channel IDs
    webhook_channel: str = "C0123ABCD"
    messages: list[SlackMessage] = field(default_factory=list)
    calls: list[SlackCall] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    base_url: str = ""
    flood_sent: int = 0  # bytes of flood replies written before the client closed the connection
    _seq: int = 0
    _release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def api_url(self) -> str:
        """What goes into the receiver's ``api_url``."""
        return f"{self.base_url}/api/"

    @property
    def webhook_url(self) -> str:
        return f"{self.base_url}{WEBHOOK_PATH}"

    def fail(self, method: str | None = None, *, error: str | None = None, status: int = 200,
             retry_after: float | None = None, hang: bool = False, body: str | None = None, times: int = 1,
             flood: int = 0) -> None:
        """Queue ``times`` faults for ``method`` (``chat.postMessage``, ``webhook``, ... or None for any)."""
        for _ in range(times):
            self.faults.append(Fault(method, status, error, retry_after, hang, body, flood))

    def calls_to(self, method: str) -> list[SlackCall]:
        return [c for c in self.calls if c.method == method]

    def in_channel(self, channel_id: str) -> list[SlackMessage]:
        """Top-level messages of a channel, oldest first."""
        return [m for m in self.messages if m.channel == channel_id and m.thread_ts in (None, m.ts)]

    def replies(self, thread_ts: str) -> list[SlackMessage]:
        return [m for m in self.messages if m.thread_ts == thread_ts and m.ts != thread_ts]

    def find(self, ts: str) -> SlackMessage | None:
        return next((m for m in self.messages if m.ts == ts), None)

    def release(self) -> None:
        """Let hanging requests finish."""
        self._release.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/api/{method}", self._api)
        app.router.add_post(WEBHOOK_PATH, self._webhook)
        return app

    # --- handlers -------------------------------------------------------------------

    async def _api(self, request: web.Request) -> web.StreamResponse:
        method = request.match_info["method"]
        params = await _read_params(request)
        self.calls.append(SlackCall(method, params, request.method))
        fault = await self._fault(method)
        if fault is not None and fault.flood:
            return await self._flood(request, fault.flood)
        if fault is not None:
            return _fault_response(fault, webhook=False)
        auth = request.headers.get("Authorization", "")
        token = auth.removeprefix("Bearer ") if auth.startswith("Bearer ") else str(params.get("token", ""))
        if not token:
            return _error("not_authed")
        if token != self.token or not token.startswith("xoxb-"):
            return _error("invalid_auth")
        handler = {
            "chat.postMessage": self._post_message,
            "chat.update": self._update,
            "conversations.history": self._history,
            "conversations.list": self._list,
            "auth.test": self._auth_test,
        }.get(method)
        if handler is None:
            return _error("unknown_method")
        return handler(params)

    def _post_message(self, p: dict[str, Any]) -> web.Response:
        channel = self._resolve(str(p.get("channel", "")))
        if channel is None:
            return _error("channel_not_found")
        if channel in self.archived:
            return _error("is_archived")
        problem = _content_problem(p)
        if problem:
            return _error(problem)
        message = self._store(channel, p, via="api")
        return _ok({"channel": channel, "ts": message.ts, "message": _message_json(message, metadata=True)})

    def _update(self, p: dict[str, Any]) -> web.Response:
        channel = str(p.get("channel", ""))
        if channel not in self.channels.values():  # Slack wants the ID here, not a name
            return _error("channel_not_found")
        message = next((m for m in self.messages if m.channel == channel and m.ts == p.get("ts")), None)
        if message is None:
            return _error("message_not_found")
        if channel in self.archived:
            return _error("is_archived")
        problem = _content_problem(p)
        if problem:
            return _error(problem)
        message.text = str(p.get("text", ""))
        message.blocks = list(p.get("blocks") or [])
        if p.get("metadata"):
            message.metadata = dict(p["metadata"])
        message.edits += 1
        return _ok({"channel": channel, "ts": message.ts, "text": message.text,
                    "message": _message_json(message, metadata=True)})

    def _history(self, p: dict[str, Any]) -> web.Response:
        channel = str(p.get("channel", ""))
        if channel not in self.channels.values():
            return _error("channel_not_found")
        limit = int(p.get("limit") or 100)
        with_metadata = str(p.get("include_all_metadata", "")).lower() in ("1", "true")
        newest_first = list(reversed(self.in_channel(channel)))
        page = [_message_json(m, metadata=with_metadata) for m in newest_first[:limit]]
        return _ok({"messages": page, "has_more": len(newest_first) > limit, "pin_count": 0,
                    "response_metadata": {"next_cursor": ""}})

    def _list(self, p: dict[str, Any]) -> web.Response:
        skip_archived = str(p.get("exclude_archived", "")).lower() in ("1", "true")
        channels = [{"id": cid, "name": name, "is_channel": True, "is_archived": cid in self.archived}
                    for name, cid in self.channels.items() if not (skip_archived and cid in self.archived)]
        return _ok({"channels": channels, "response_metadata": {"next_cursor": ""}})

    def _auth_test(self, p: dict[str, Any]) -> web.Response:
        return _ok({"url": f"{self.base_url}/", "team": "Fake Team", "user": "sre-agent", "team_id": "T0FAKE",
                    "user_id": "U0FAKE", "bot_id": BOT_ID})

    async def _webhook(self, request: web.Request) -> web.StreamResponse:
        raw = await request.text()
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        self.calls.append(SlackCall("webhook", body if isinstance(body, dict) else {"raw": raw}))
        fault = await self._fault("webhook")
        if fault is not None and fault.flood:
            return await self._flood(request, fault.flood)
        if fault is not None:
            return _fault_response(fault, webhook=True)
        if not isinstance(body, dict):
            return web.Response(status=400, text="invalid_payload", content_type="text/html")
        if self.webhook_channel in self.archived:
            return web.Response(status=410, text="channel_is_archived", content_type="text/html")
        problem = _content_problem(body)
        if problem:
            return web.Response(status=400, text=problem, content_type="text/html")
        self._store(self.webhook_channel, body, via="webhook")
        return web.Response(text="ok", content_type="text/html")

    # --- helpers --------------------------------------------------------------------

    async def _flood(self, request: web.Request, size: int) -> web.StreamResponse:
        """A 200 JSON reply (``{"ok": true, "pad": "xxx...``) streamed in 64 KiB chunks up to ``size`` bytes,
        counting in :attr:`flood_sent` what was written before the client went away."""
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        chunk = b"x" * 65536
        try:
            await resp.write(b'{"ok": true, "pad": "')
            while self.flood_sent < size:
                await resp.write(chunk)
                self.flood_sent += len(chunk)
        except (ConnectionError, RuntimeError):  # the client closed: what it read is bounded
            pass
        return resp

    async def _fault(self, method: str) -> Fault | None:
        for i, fault in enumerate(self.faults):
            if fault.method in (None, method):
                del self.faults[i]
                if fault.hang:
                    await self._release.wait()
                return fault
        return None

    def _resolve(self, channel: str) -> str | None:
        if channel in self.channels.values():
            return channel
        return self.channels.get(channel.removeprefix("#"))

    def _store(self, channel: str, p: dict[str, Any], *, via: str) -> SlackMessage:
        self._seq += 1
        ts = f"1700000000.{self._seq * 100:06d}"
        thread_ts = p.get("thread_ts")
        message = SlackMessage(channel=channel, ts=ts, text=str(p.get("text", "")), blocks=list(p.get("blocks") or []),
                               metadata=dict(p["metadata"]) if p.get("metadata") else None,
                               thread_ts=str(thread_ts) if thread_ts else None, via=via)
        self.messages.append(message)
        return message


@asynccontextmanager
async def running_fake_slack(**kwargs: Any) -> AsyncIterator[FakeSlack]:
    """Serve a :class:`FakeSlack` on 127.0.0.1 (a free port) for the duration of the block."""
    fake = FakeSlack(**kwargs)
    runner = web.AppRunner(fake.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.base_url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield fake
    finally:
        fake.release()
        await runner.cleanup()


async def _read_params(request: web.Request) -> dict[str, Any]:
    """Query parameters plus a JSON or form body; JSON-looking form values (blocks, metadata) decoded."""
    params: dict[str, Any] = dict(request.query)
    if request.can_read_body:
        if request.content_type == "application/json":
            body = await request.json()
            if isinstance(body, dict):
                params.update(body)
        else:
            form = await request.post()
            params.update({k: v for k, v in form.items() if isinstance(v, str)})
    for key in ("blocks", "metadata"):
        value = params.get(key)
        if isinstance(value, str) and value[:1] in ("[", "{"):
            params[key] = json.loads(value)
    return params


def _content_problem(p: dict[str, Any]) -> str:
    """Slack's answer to a message body it would refuse ('' when it is fine)."""
    text, blocks = p.get("text"), p.get("blocks")
    if not text and not blocks:
        return "no_text"
    if isinstance(text, str) and len(text) > 40_000:
        return "msg_too_long"
    if blocks is not None and not _blocks_ok(blocks):
        return "invalid_blocks"
    return ""


def _blocks_ok(blocks: Any) -> bool:
    """The Block Kit limits the sink must respect (https://api.slack.com/reference/block-kit/blocks)."""
    if not isinstance(blocks, list) or len(blocks) > 50:
        return False
    for block in blocks:
        kind = block.get("type")
        if kind == "header":
            text = block["text"]
            if text.get("type") != "plain_text" or not 0 < len(text["text"]) <= 150:
                return False
        elif kind == "section":
            text, fields = block.get("text"), block.get("fields")
            if text is None and not fields:
                return False
            if text is not None and not 0 < len(text["text"]) <= 3000:
                return False
            if fields is not None and (len(fields) > 10 or any(not 0 < len(f["text"]) <= 2000 for f in fields)):
                return False
        elif kind == "context":
            elements = block.get("elements") or []
            if not 0 < len(elements) <= 10 or any(len(e.get("text", "")) > 3000 for e in elements):
                return False
        elif kind == "actions":
            elements = block.get("elements") or []
            if not 0 < len(elements) <= 25:
                return False
            for button in elements:
                if len(button["text"]["text"]) > 75 or len(button.get("url", "")) > 3000:
                    return False
        elif kind != "divider":
            return False
    return True


def _message_json(m: SlackMessage, *, metadata: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "message", "subtype": "bot_message", "bot_id": BOT_ID, "text": m.text,
                           "blocks": m.blocks, "ts": m.ts}
    if m.thread_ts:
        out["thread_ts"] = m.thread_ts
    if m.edits:
        out["edited"] = {"user": "U0FAKE", "ts": m.ts}
    if metadata and m.metadata:
        out["metadata"] = m.metadata
    return out


def _ok(payload: dict[str, Any]) -> web.Response:
    return web.json_response({"ok": True, **payload})


def _error(code: str) -> web.Response:
    return web.json_response({"ok": False, "error": code})


def _fault_response(fault: Fault, *, webhook: bool) -> web.Response:
    headers = {"Retry-After": f"{fault.retry_after:g}"} if fault.retry_after is not None else {}
    if fault.body is not None:
        return web.Response(status=fault.status, text=fault.body, headers=headers, content_type="text/html")
    if webhook:
        text = fault.error or ("rate_limited" if fault.status == 429 else "ok" if fault.status == 200 else "error")
        return web.Response(status=fault.status, text=text, headers=headers, content_type="text/html")
    if fault.status >= 500:
        return web.Response(status=fault.status, text=f"<html><body>{fault.status}</body></html>", headers=headers,
                            content_type="text/html")
    code = fault.error or ("ratelimited" if fault.status == 429 else "fatal_error")
    return web.json_response({"ok": False, "error": code}, status=fault.status, headers=headers)
