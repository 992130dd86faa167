"""Receivers: one interface, one module per kind (console, Slack, Alertmanager, webhook).

The dispatcher (``agent.act.dispatch``, delivering through ``agent.act.outbox``) owns retries,
ordering and the outbox; a sink only
turns one :class:`~agent.act.notification.Notification` into one delivery attempt. It
returns when the receiver acknowledged, and raises
:class:`~agent.errors.DeliveryError` otherwise (``permanent=True`` when a retry cannot
help, ``retry_after_s`` when the receiver said when to come back). It never retries by
itself, except where the receiver's client library does so as part of one call
(slack-sdk's rate-limit handler).
"""

from __future__ import annotations

from typing import Any, Protocol

from agent.act.notification import Notification

__all__ = ["MessageRefs", "Sink"]


class Sink(Protocol):
    """One configured receiver.

    ``deadline_s`` is the longest one :meth:`send` can take by the sink's own configured
    timeouts (every HTTP call it may make, each at its full timeout, and its rate-limit
    waits). The outbox cancels a send that outlives it (plus a second's grace) as a
    retryable failure, so a sink with a bug cannot hold its queue forever, and no hidden
    cap cuts short a timeout the operator configured.
    """

    name: str
    deadline_s: float

    async def send(self, notification: Notification, *, attempt: int = 0) -> dict[str, Any] | None:
        """Deliver once; raise DeliveryError unless the receiver acknowledged.

        ``attempt`` > 0 means an earlier try may have reached the receiver (it timed
        out, or the agent crashed mid-send): a sink without server-side idempotency
        (Slack) checks before posting again. Returns the receiver's JSON reply, if any.
        """

    async def close(self) -> None:
        """Release HTTP sessions."""


class MessageRefs(Protocol):
    """Where a receiver remembers what it posted per alert group (Slack: channel ID + ts),
    so a later notification for the same group updates that message. Backed by the
    state database, so it survives a restart; asynchronous, because in the daemon those
    reads and writes run on the state database's writer thread, not on the event loop."""

    async def get_ref(self, receiver: str, group_key: str) -> tuple[str, str] | None: ...

    async def put_ref(self, receiver: str, group_key: str, channel: str, ts: str) -> None: ...

    async def delete_ref(self, receiver: str, group_key: str) -> None: ...
