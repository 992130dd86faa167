"""Slack Web API plumbing for the Slack sink: rate limits, 429 retries, error classes, a quiet logger.

:class:`~agent.act.sinks.slack.SlackSink` decides what to post and when; these are the parts
that sit between it and slack-sdk, none of which knows about alerts. :class:`ChannelLimiter`
spaces writes per channel (Slack allows about one message per second per channel) with the
sink's injected clock and sleep. :class:`RateLimitRetry` is slack-sdk's ``429`` handler made
to wait through that injected sleep, for exactly ``Retry-After``, and only when the wait is
short. :func:`api_error` turns a failed call into a :class:`~agent.errors.DeliveryError`,
permanent for the error codes in :data:`PERMANENT` and retryable otherwise. :func:`sdk_logger`
keeps slack-sdk from logging request URLs, one of which (an incoming webhook's) is a secret.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState

from agent.act.sinks.http import parse_retry_after
from agent.errors import DeliveryError

__all__ = ["PERMANENT", "ChannelLimiter", "RateLimitRetry", "api_error", "retry_after", "sdk_logger"]

#: Slack error codes (https://api.slack.com/methods/chat.postMessage#errors) a retry cannot fix.
PERMANENT = frozenset({
    "invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired", "no_permission",
    "missing_scope", "not_allowed_token_type", "ekm_access_denied", "invalid_blocks", "invalid_blocks_format",
    "invalid_arguments", "invalid_arg_name", "invalid_form_data", "invalid_json", "json_not_object",
    "invalid_metadata_format", "invalid_metadata_schema", "metadata_too_large", "channel_not_found",
    "not_in_channel", "is_archived", "msg_too_long", "no_text", "too_many_attachments", "restricted_action",
    "restricted_action_read_only_channel", "restricted_action_thread_only_channel", "team_access_not_granted",
    "method_deprecated", "deprecated_endpoint", "invalid_charset", "superfluous_charset",
})


def retry_after(value: object) -> float | None:
    """``Retry-After`` in seconds (Slack always sends delay-seconds); None when absent or bad."""
    if isinstance(value, list):
        value = value[0] if value else None
    return parse_retry_after(value, time.time()) if isinstance(value, str) else None


class RateLimitRetry(AsyncRateLimitErrorRetryHandler):
    """slack-sdk's 429 handler with two changes: it waits through the sink's injected
    ``sleep`` for exactly ``Retry-After`` (the library sleeps ``Retry-After`` + up to 1 s
    of jitter on the real loop), and only when that wait is short."""

    def __init__(self, sleep: Callable[[float], Awaitable[None]], max_retry_count: int, max_wait_s: float) -> None:
        super().__init__(max_retry_count=max_retry_count)
        self._sleep = sleep
        self._max_wait_s = max_wait_s

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        if response is None or response.status_code != 429:
            return False
        wait = retry_after(response.headers.get("Retry-After") or response.headers.get("retry-after"))
        return (1.0 if wait is None else wait) <= self._max_wait_s

    async def prepare_for_next_attempt_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> None:
        headers = response.headers if response is not None else {}
        wait = retry_after(headers.get("Retry-After") or headers.get("retry-after"))
        state.next_attempt_requested = True
        await self._sleep(1.0 if wait is None else wait)
        state.increment_current_attempt()


class ChannelLimiter:
    """Spaces writes to one channel ``1/rate`` seconds apart. A slot is reserved before
    waiting, so concurrent sends to one channel queue up instead of bursting."""

    def __init__(self, rate: float, clock: Callable[[], float], sleep: Callable[[float], Awaitable[None]]) -> None:
        self._interval = 1.0 / rate
        self._clock = clock
        self._sleep = sleep
        self._next: dict[str, float] = {}

    async def wait(self, channel: str) -> None:
        now = self._clock()
        start = max(now, self._next.get(channel, now))
        self._next[channel] = start + self._interval
        if start > now:
            await self._sleep(start - now)


def sdk_logger() -> logging.Logger:
    """slack-sdk writes request URLs and bodies at DEBUG whenever the logger it is given has
    its own level at DEBUG or unset — and an incoming webhook's URL is its secret. It gets
    a logger of ours held at INFO, so those lines are never even formatted."""
    logger = logging.getLogger("agent.act.sinks.slack.sdk")
    if logger.level < logging.INFO:
        logger.setLevel(logging.INFO)
    return logger


def api_error(method: str, response: Any) -> DeliveryError:
    """A failed Web API call as a DeliveryError: 429/``ratelimited`` and 5xx retryable with their
    ``Retry-After``, a code in :data:`PERMANENT` (or a 4xx without a code) permanent, else retryable.

    ``response`` is slack-sdk's response, or aiohttp's when the body was not JSON."""
    status = getattr(response, "status_code", None) or getattr(response, "status", 0) or 0
    data = getattr(response, "data", None)
    code = str(data.get("error") or "") if isinstance(data, dict) else ""
    headers: Mapping[str, str] = getattr(response, "headers", None) or {}
    message = f"slack {method}: " + (code or f"HTTP {status}")
    if isinstance(data, dict) and data.get("needed"):
        message += f" (needs scope {data['needed']})"
    if status == 429 or code == "ratelimited" or status >= 500:
        return DeliveryError(message, retry_after_s=retry_after(headers.get("Retry-After")))
    if code in PERMANENT or (not code and 400 <= status < 500):
        return DeliveryError(message, permanent=True)
    return DeliveryError(message)  # internal_error, fatal_error, service_unavailable, unknown: try again
