"""Outbox queue names: which FIFO queue of the outbox a notification waits in.

A queue is delivered by one sink, and one that is down blocks only itself. The names are
stored in the state database (the outbox's ``receiver`` column), so they must be spelled one
way everywhere: the receiver's name for most receivers, ``name[i]`` for the i-th URL of an
Alertmanager receiver (each Alertmanager of an HA cluster gets every alert, independently),
and ``scale:<service>`` for a scaling service's webhook. Build them here, never by hand.
"""

from __future__ import annotations

from typing import NewType

__all__ = ["QueueName", "alertmanager_queue", "forward_queue", "receiver_queue", "scale_queue"]

QueueName = NewType("QueueName", str)


def receiver_queue(receiver: str) -> QueueName:
    """The one queue of a console, Slack or webhook receiver."""
    return QueueName(receiver)


def alertmanager_queue(receiver: str, index: int) -> QueueName:
    """The queue of the ``index``-th URL of an Alertmanager receiver."""
    return QueueName(f"{receiver}[{index}]")


def scale_queue(service: str) -> QueueName:
    """The queue of a scaling service's scale-request webhook."""
    return QueueName(f"scale:{service}")


def forward_queue() -> QueueName:
    """The queue of findings forwarded to the central agent (``forward:``); ``:`` keeps it apart
    from receiver names, as in :func:`scale_queue`."""
    return QueueName("forward:central")
