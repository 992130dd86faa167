"""The HTTP delivery policy every HTTP sink shares: one POST, errors classified.

Why one module: the webhook, Alertmanager, Slack and scale sinks must agree on what a
reply means, or one receiver's outage is retried and another's is dropped. A delivery is
one POST, no redirects followed (a redirect is a configuration error, said so), and the
answer mapped onto :class:`~agent.errors.DeliveryError`: 2xx ok; 408, 429, 5xx, timeouts and
connection errors retryable with ``Retry-After`` honoured (within :data:`RETRY_AFTER_CAP_S`); any
other status permanent (a 4xx: the receiver refused this payload, and will again).
Error messages name the receiver, never the body or headers (they may carry signatures).
"""

from __future__ import annotations

import email.utils
import json
import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC
from typing import Any

import aiohttp
import structlog

import agent
from agent.errors import DeliveryError, RenderError

__all__ = ["REPLY_LIMIT", "RETRY_AFTER_CAP_S", "BoundedResponse", "ReplyTooLarge", "check_status", "encode_json",
           "parse_retry_after", "post_json", "user_agent"]

log = structlog.get_logger(__name__)

#: The longest ``Retry-After`` honoured (seconds), for every sink and the remote-write queue: one wrong header
#: (a proxy's, a date in year 9999) must not park a queue for decades behind its head.
RETRY_AFTER_CAP_S = 300.0
_ERROR_TEXT_LIMIT = 64 * 1024  # bytes of an error reply read for the message
_ERROR_TEXT_SHOWN = 500  # characters of it put into the DeliveryError


#: The largest reply a client library reads through :class:`BoundedResponse` (slack-sdk's whole-body reads):
#: Slack's biggest answer here, ``conversations.history`` with 50 messages and their blocks, is a few hundred KB.
REPLY_LIMIT = 1024 * 1024


class ReplyTooLarge(aiohttp.ClientPayloadError):
    """A reply went past :attr:`BoundedResponse.limit`; an ``aiohttp.ClientError``, so callers that
    translate those into a retryable DeliveryError need nothing new."""


class BoundedResponse(aiohttp.ClientResponse):
    """aiohttp's response with a bounded :meth:`read` (and so ``text()`` and ``json()``, which read through it).

    Why: a client library that reads a whole reply (slack-sdk's ``AsyncWebClient`` and ``AsyncWebhookClient``
    call ``res.json()`` / ``res.text()``) would hold a reply of hundreds of MB from a broken proxy or a
    hostile endpoint in memory. A session made with ``response_class=BoundedResponse`` reads at most
    :attr:`limit` bytes, then closes the connection and raises :class:`ReplyTooLarge`.
    """

    limit = REPLY_LIMIT

    async def read(self) -> bytes:
        """The body, read in chunks up to :attr:`limit` (aiohttp's own ``read`` with ``content.read()``
        replaced by a bounded loop; the rest as aiohttp 3.x does it)."""
        if self._body is None:
            body = bytearray()
            try:
                while chunk := await self.content.read(64 * 1024):
                    body += chunk
                    if len(body) > self.limit:
                        raise ReplyTooLarge(f"the reply is larger than the {self.limit} bytes read")
            except BaseException:
                self.close()
                raise
            self._body = bytes(body)
        elif self._released:
            raise aiohttp.ClientConnectionError("Connection closed")
        protocol = self._connection and self._connection.protocol
        if protocol is None or not protocol.upgraded:
            await self._wait_released()
        return self._body


def user_agent() -> str:
    """``sre-agent/<version>``, the User-Agent of every HTTP sink."""
    return f"sre-agent/{agent.__version__}"


def encode_json(payload: Any) -> bytes:
    """The exact bytes sent: compact UTF-8 JSON; NaN/Infinity are refused (not JSON)."""
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise RenderError(f"the notification cannot be rendered as JSON: {exc}") from exc


def parse_retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` (delay seconds or an HTTP date) -> seconds from ``now``, from 0 (a negative delay, a
    date past) to :data:`RETRY_AFTER_CAP_S` (a huge delay, a date in year 9999); None if absent or neither
    a finite number nor a date (NaN, ``inf``, garbage): the caller's own backoff decides then."""
    if not value:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # RFC 9110's delay-seconds, however many digits
        return RETRY_AFTER_CAP_S if len(value) > 9 else min(float(value), RETRY_AFTER_CAP_S)
    try:
        seconds = float(value)  # tolerated: "1.5", "-30", "1e308"
    except ValueError:
        pass
    else:
        return min(max(0.0, seconds), RETRY_AFTER_CAP_S) if math.isfinite(seconds) else None
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max(0.0, when.timestamp() - now), RETRY_AFTER_CAP_S)


def check_status(status: int, text: str, headers: Mapping[str, str], *, what: str, now: float) -> None:
    """Raise the DeliveryError a non-2xx reply deserves (see the module docstring)."""
    if 200 <= status < 300:
        return
    detail = _error_text(text)[:_ERROR_TEXT_SHOWN]
    message = f"{what}: HTTP {status}" + (f": {detail}" if detail else "")
    if status in (408, 429) or status >= 500:
        raise DeliveryError(message, retry_after_s=parse_retry_after(headers.get("Retry-After"), now))
    if 300 <= status < 400:
        message += f" (redirect to {headers.get('Location', '?')!r} not followed; configure that URL)"
    raise DeliveryError(message, permanent=True)


def _error_text(text: str) -> str:
    """The reason in an error reply: Alertmanager sends a JSON string, others ``{"message": ...}``."""
    text = text.strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text
    if isinstance(data, str):
        return data
    if isinstance(data, dict):
        for key in ("message", "error"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return text


async def post_json(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    timeout_s: float,
    verify_tls: bool = True,
    what: str,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any] | None:
    """POST ``body`` once; return the JSON object replied, if any, or raise DeliveryError.

    ``what`` names the receiver in error messages (never the body or headers,
    which may carry signatures).
    """
    try:
        async with session.post(
            url, data=body, headers=dict(headers), timeout=aiohttp.ClientTimeout(total=timeout_s),
            ssl=verify_tls, allow_redirects=False,
        ) as resp:
            raw = await resp.content.read(_ERROR_TEXT_LIMIT)
            status, reply_headers = resp.status, resp.headers
            content_type = resp.content_type
    except TimeoutError as exc:
        raise DeliveryError(f"{what}: no answer within {timeout_s:g}s") from exc
    except aiohttp.ClientError as exc:
        raise DeliveryError(f"{what}: {type(exc).__name__}: {exc}") from exc
    text = raw.decode("utf-8", errors="replace")
    check_status(status, text, reply_headers, what=what, now=clock())
    log.debug("receiver accepted", receiver=what, status=status)
    if content_type == "application/json" and text:
        try:
            reply = json.loads(text)
        except ValueError:
            return None
        return reply if isinstance(reply, dict) else None
    return None
