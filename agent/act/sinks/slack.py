"""Slack receiver: one Block Kit message per alert group, updated in place until it resolves.

Two modes, picked by :class:`~agent.config.SlackReceiverConfig`:

* **Bot token** (``xoxb-``, scopes ``chat:write`` and, for the duplicate check below,
  ``channels:history``/``groups:history`` and ``channels:read``/``groups:read``). An alert
  group's first notification is a ``chat.postMessage``; its channel ID and ``ts`` are
  kept in :class:`~agent.act.sinks.MessageRefs` (the state database), and every later
  notification for that group — more alerts firing, some resolving, all resolved — is a
  ``chat.update`` of the same message, so a channel shows one line per incident whose
  header turns from ``[FIRING:n]`` to ``[RESOLVED]``. After the all-resolved update the
  ref is dropped, so the group's next firing starts a new message. If the message is
  gone (``message_not_found``, ``cant_update_message``, ``channel_not_found``) a new
  one is posted. Findings go into the group message's thread.
* **Incoming webhook**: the same blocks, but a webhook can neither update nor thread,
  so every notification (a resolve, a finding) is a new message.

Exactly once. Slack has no idempotency key, so every message carries Slack message
metadata ``{"event_type": "sre_agent_alert", "event_payload": {"key": <notification
key>, "group": <group hash>}}`` (``chat.update`` rewrites it with the newest key). When
the dispatcher retries (``attempt`` > 0) and no ref is stored, an earlier try may have
posted before the agent crashed or the reply was lost; the sink then reads the last 50
messages of the channel (``conversations.history`` with ``include_all_metadata``) and
adopts one whose key matches instead of posting a duplicate. Limits, chosen to stay
simple: the check needs the channel ID — the configured ``channel`` if it is an ID,
else the ID learned from an earlier reply in this process, else a
``conversations.list`` lookup by name (first 10 pages); it only sees the newest 50
top-level messages; without the read scopes it logs a warning and posts (at least
once). Findings in a thread are not checked (``conversations.history`` does not list
thread replies): a duplicate finding after a crash is possible, a lost one is not.

Rate limits. Slack allows about one message per second per channel; the sink spaces
its writes per channel (``max_messages_per_second``) with the injected clock and sleep.
A ``429`` is retried inside one call by slack-sdk's
``AsyncRateLimitErrorRetryHandler`` (up to :data:`RATE_LIMIT_RETRIES` times, when
``Retry-After`` is at most :data:`MAX_INLINE_RETRY_AFTER_S`); beyond that the error
goes back to the dispatcher with ``retry_after_s``. Connection errors are *not*
retried inside the call (slack-sdk's default would): a reset after Slack accepted a
post would duplicate it, so they go back to the dispatcher, whose next attempt checks.

Errors become :class:`~agent.errors.DeliveryError`: auth, payload and channel problems
(``invalid_auth``, ``invalid_blocks``, ``is_archived``, ...) are permanent; rate limits,
5xx, timeouts, connection errors and unknown error codes are retried. The token and the
webhook URL (which is itself a secret) are never logged. The rate limiter, the 429 handler
and the error classification are in :mod:`agent.act.sinks.slack_api`.

Replies are bounded. slack-sdk reads each reply whole (``res.json()``); the session the sink opens
reads through :class:`~agent.act.sinks.http.BoundedResponse`, so a reply past
:data:`~agent.act.sinks.http.REPLY_LIMIT` (1 MiB; a broken proxy, a hostile endpoint) closes the
connection and is a retryable error instead of the agent's memory. An injected session (tests)
is the caller's and is used as it is.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import structlog
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from agent.act.notification import Notification, group_key_hash
from agent.act.sinks import MessageRefs
from agent.act.sinks.http import BoundedResponse, user_agent
from agent.act.sinks.slack_api import ChannelLimiter, RateLimitRetry, api_error, retry_after, sdk_logger
from agent.act.sinks.slack_blocks import alert_blocks, escape, finding_blocks, scale_blocks, truncate
from agent.config import SlackReceiverConfig
from agent.errors import DeliveryError

__all__ = [
    "ALERT_EVENT_TYPE",
    "FINDING_EVENT_TYPE",
    "HISTORY_LIMIT",
    "MAX_INLINE_RETRY_AFTER_S",
    "RATE_LIMIT_RETRIES",
    "SCALE_EVENT_TYPE",
    "SlackSink",
    "alert_blocks",
    "escape",
    "finding_blocks",
    "truncate",
]

log = structlog.get_logger(__name__)

ALERT_EVENT_TYPE = "sre_agent_alert"
FINDING_EVENT_TYPE = "sre_agent_finding"
SCALE_EVENT_TYPE = "sre_agent_scale"
HISTORY_LIMIT = 50  # messages read back for the duplicate check
RATE_LIMIT_RETRIES = 2  # 429s slack-sdk retries inside one send
MAX_INLINE_RETRY_AFTER_S = 5.0  # longer waits go back to the dispatcher's backoff
_LIST_PAGES = 10  # conversations.list pages searched for the channel name
# Web API calls one send may make: the channel lookup's pages, the duplicate check, an update, a post.
_MAX_CALLS_PER_SEND = _LIST_PAGES + 3

# chat.update answers that mean "that message is no longer there to update": post anew.
_UPDATE_GONE = frozenset({"message_not_found", "cant_update_message", "channel_not_found", "edit_window_closed"})
# Answers to the read calls of the duplicate check that mean "cannot check": warn and post.
_CANNOT_CHECK = frozenset({"missing_scope", "not_in_channel", "channel_not_found", "not_allowed_token_type",
                           "no_permission"})
_CHANNEL_ID = re.compile(r"^[CGD][A-Z0-9]{6,}$")


class SlackSink:
    """One Slack receiver (see the module docstring for what it posts and when)."""

    def __init__(
        self,
        name: str,
        config: SlackReceiverConfig,
        refs: MessageRefs,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        session: aiohttp.ClientSession | None = None,
        report_url: str = "",
    ) -> None:
        self.name = name
        self._config = config
        self._report_url = report_url  # server.external_url: messages link the triage reports
        self.deadline_s = _MAX_CALLS_PER_SEND * (
            config.timeout * (1 + RATE_LIMIT_RETRIES) + RATE_LIMIT_RETRIES * MAX_INLINE_RETRY_AFTER_S
            + 1 / config.max_messages_per_second)
        self._refs = refs
        self._sleep = sleep
        self._limiter = ChannelLimiter(config.max_messages_per_second, clock, sleep)
        self._session = session  # None: the sink opens (and closes) its own on first use
        self._owns_session = session is None
        self._web: AsyncWebClient | None = None
        self._hook: AsyncWebhookClient | None = None
        self._channel_ids: dict[str, str] = {}  # configured channel name -> ID, from replies
        self._log = log.bind(receiver=name)

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        """Post or update the notification's message; raise DeliveryError unless Slack took it."""
        if self._config.webhook_url is not None:
            await self._send_webhook(notification)
            return None
        if notification.kind == "alerts":
            return await self._send_alerts(notification, attempt)
        if notification.kind == "finding":
            return await self._send_finding(notification, attempt)
        text, blocks = scale_blocks(notification.scale or {})
        return await self._post(text, blocks, self._metadata(SCALE_EVENT_TYPE, notification))

    async def close(self) -> None:
        """Close the HTTP session the sink opened (an injected one belongs to the caller)."""
        if self._owns_session and self._session is not None:
            await self._session.close()
        self._session = None
        self._web = None
        self._hook = None

    # --- bot-token mode -------------------------------------------------------------

    async def _send_alerts(self, n: Notification, attempt: int) -> dict[str, Any]:
        text, blocks = alert_blocks(n, self._config.dashboard_url, self._report_url)
        metadata = self._metadata(ALERT_EVENT_TYPE, n)
        ref = await self._refs.get_ref(self.name, n.group_key)
        if ref is None and attempt > 0:
            ref = await self._find_posted(n.key)
            if ref is not None:
                self._log.info("slack adopting message an earlier attempt posted", key=n.key, channel=ref[0],
                               ts=ref[1])
                await self._refs.put_ref(self.name, n.group_key, ref[0], ref[1])
        reply: dict[str, Any] | None = None
        if ref is not None:
            channel, ts = ref
            body = {"channel": channel, "ts": ts, "text": text, "blocks": blocks, "metadata": metadata}
            reply = await self._call("chat.update", channel=channel, json=body, tolerate=_UPDATE_GONE)
            if reply.get("ok"):
                self._log.info("slack message updated", key=n.key, status=n.status, channel=channel, ts=ts)
            else:
                self._log.info("slack message gone, posting a new one", key=n.key, channel=channel, ts=ts,
                               error=reply.get("error"))
                await self._refs.delete_ref(self.name, n.group_key)
                reply = None
        if reply is None:
            reply = await self._post(text, blocks, metadata)
            channel_id, ts_new = reply.get("channel"), reply.get("ts")
            if n.status == "firing" and isinstance(channel_id, str) and isinstance(ts_new, str):
                await self._refs.put_ref(self.name, n.group_key, channel_id, ts_new)
            self._log.info("slack message posted", key=n.key, status=n.status, channel=channel_id, ts=ts_new)
        if n.status == "resolved":
            await self._refs.delete_ref(self.name, n.group_key)
        return reply

    async def _send_finding(self, n: Notification, attempt: int) -> dict[str, Any]:
        text, blocks = finding_blocks(n.finding or {}, self._config.dashboard_url)
        metadata = self._metadata(FINDING_EVENT_TYPE, n)
        ref = await self._refs.get_ref(self.name, n.group_key) if n.group_key else None
        if ref is not None:
            return await self._post(text, blocks, metadata, channel=ref[0], thread_ts=ref[1])
        if attempt > 0:
            found = await self._find_posted(n.key)
            if found is not None:
                self._log.info("slack finding already posted by an earlier attempt", key=n.key, ts=found[1])
                return {"ok": True, "channel": found[0], "ts": found[1]}
        return await self._post(text, blocks, metadata)

    async def _post(
        self, text: str, blocks: list[dict[str, Any]], metadata: dict[str, Any], *, channel: str | None = None,
        thread_ts: str | None = None,
    ) -> dict[str, Any]:
        target = channel or self._config.channel
        body: dict[str, Any] = {"channel": target, "text": text, "blocks": blocks, "metadata": metadata}
        if thread_ts is not None:
            body["thread_ts"] = thread_ts
        reply = await self._call("chat.postMessage", channel=target, json=body)
        if target == self._config.channel and isinstance(reply.get("channel"), str):
            self._channel_ids[target] = reply["channel"]
        return reply

    async def _find_posted(self, key: str) -> tuple[str, str] | None:
        """(channel ID, ts) of a recent message whose metadata carries ``key``, if any."""
        channel_id = await self._channel_id()
        if channel_id is None:
            return None
        params = {"channel": channel_id, "limit": HISTORY_LIMIT, "include_all_metadata": True}
        reply = await self._call("conversations.history", params=params, tolerate=_CANNOT_CHECK)
        if not reply.get("ok"):
            self._log.warning("slack history not readable; posting without the duplicate check",
                              error=reply.get("error"), needed=reply.get("needed"))
            return None
        for message in reply.get("messages") or []:
            payload = (message.get("metadata") or {}).get("event_payload") or {}
            if payload.get("key") == key and isinstance(message.get("ts"), str):
                return channel_id, message["ts"]
        return None

    async def _channel_id(self) -> str | None:
        """The configured channel's ID: as configured, learned from a reply, or looked up by name."""
        channel = self._config.channel
        if _CHANNEL_ID.match(channel):
            return channel
        if channel in self._channel_ids:
            return self._channel_ids[channel]
        name, cursor = channel.lstrip("#"), ""
        for _ in range(_LIST_PAGES):
            params: dict[str, Any] = {"types": "public_channel,private_channel", "exclude_archived": True,
                                      "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            reply = await self._call("conversations.list", params=params, tolerate=_CANNOT_CHECK)
            if not reply.get("ok"):
                break
            for found in reply.get("channels") or []:
                if found.get("name") == name and isinstance(found.get("id"), str):
                    self._channel_ids[channel] = found["id"]
                    return str(found["id"])
            cursor = (reply.get("response_metadata") or {}).get("next_cursor") or ""
            if not cursor:
                break
        self._log.warning("slack channel ID unknown; posting without the duplicate check", channel=channel)
        return None

    async def _call(
        self, method: str, *, channel: str | None = None, json: dict[str, Any] | None = None,
        params: dict[str, Any] | None = None, tolerate: frozenset[str] = frozenset(),
    ) -> dict[str, Any]:
        """One Web API call (a write when ``channel`` is given: rate-limited per channel).
        An error code in ``tolerate`` comes back as ``{"ok": False, "error": code}``."""
        if channel is not None:
            configured = self._config.channel
            same = channel in (configured, self._channel_ids.get(configured))
            await self._limiter.wait(configured if same else channel)  # name and ID of one channel: one limit
        client = self._web_client()
        try:
            if json is not None:
                response = await client.api_call(method, json=json)
            else:
                response = await client.api_call(method, http_verb="GET", params=params)
        except SlackApiError as exc:
            data = getattr(exc.response, "data", None)
            code = data.get("error") if isinstance(data, dict) else None
            if code in tolerate:
                return dict(data) if isinstance(data, dict) else {"ok": False, "error": code}
            raise api_error(method, exc.response) from exc
        except TimeoutError as exc:
            raise DeliveryError(f"slack {method}: no answer within {self._config.timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            raise DeliveryError(f"slack {method}: {type(exc).__name__}: {exc}") from exc
        data = response.data
        return dict(data) if isinstance(data, dict) else {}

    def _web_client(self) -> AsyncWebClient:
        if self._web is None:
            token = self._config.token.get_secret_value() if self._config.token is not None else None
            self._web = AsyncWebClient(token=token, base_url=self._config.api_url, **self._client_options())
        return self._web

    def _client_options(self) -> dict[str, Any]:
        """What both slack-sdk clients share: timeout, our session and logger, User-Agent, 429 handler."""
        return {
            "timeout": max(1, math.ceil(self._config.timeout)),
            "session": self._http(),
            "logger": sdk_logger(),
            "user_agent_prefix": user_agent(),
            "retry_handlers": [RateLimitRetry(self._sleep, RATE_LIMIT_RETRIES, MAX_INLINE_RETRY_AFTER_S)],
        }

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self._config.timeout),
                                                  response_class=BoundedResponse)  # replies read to REPLY_LIMIT
        return self._session

    def _metadata(self, event_type: str, n: Notification) -> dict[str, Any]:
        return {"event_type": event_type,
                "event_payload": {"key": n.key, "group": group_key_hash(self.name, n.group_key)}}

    # --- incoming-webhook mode --------------------------------------------------------

    async def _send_webhook(self, n: Notification) -> None:
        if n.kind == "alerts":
            text, blocks = alert_blocks(n, self._config.dashboard_url, self._report_url)
        elif n.kind == "finding":
            text, blocks = finding_blocks(n.finding or {}, self._config.dashboard_url)
        else:
            text, blocks = scale_blocks(n.scale or {})
        await self._limiter.wait("webhook")  # a webhook posts into one fixed channel
        hook = self._webhook_client()
        try:
            response = await hook.send(text=text, blocks=blocks, unfurl_links=False)
        except TimeoutError as exc:
            raise DeliveryError(f"slack webhook: no answer within {self._config.timeout:g}s") from exc
        except aiohttp.ClientError as exc:
            detail = str(exc).replace(hook.url, "<webhook_url>")  # the URL is the secret
            raise DeliveryError(f"slack webhook: {type(exc).__name__}: {detail}") from exc
        status, body = response.status_code, (response.body or "").strip()
        if 200 <= status < 300:
            self._log.info("slack webhook message posted", key=n.key, kind=n.kind, status=n.status)
            return
        message = f"slack webhook: HTTP {status}" + (f": {truncate(body, 200)}" if body else "")
        if status == 429 or status >= 500:
            raise DeliveryError(message, retry_after_s=retry_after(response.headers.get("Retry-After")))
        raise DeliveryError(message, permanent=True)  # invalid_payload, no_text, channel_is_archived, ...

    def _webhook_client(self) -> AsyncWebhookClient:
        if self._hook is None:
            url = self._config.webhook_url.get_secret_value() if self._config.webhook_url is not None else ""
            self._hook = AsyncWebhookClient(url, **self._client_options())
        return self._hook
