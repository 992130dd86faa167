"""Matching alerts with the ``ALERTS_FOR_STATE`` series a server holds, in time linear in both.

Prometheus' ``RestoreForState`` asks the server once per alert, with the alert's labels as
matchers, so a series matches an alert when it carries every label of the alert (a server adds
its own, such as ``replica``). The agent asks once per rule and matches here: comparing every
alert with every series is N x M label-set comparisons, which for 5,000 alerts and 5,000 series
held start-up for tens of seconds. Instead the series are indexed once per distinct set of
alert label *names* (a rule's alerts nearly always share one: the labels its ``by`` keeps), by
the values of those names, and each alert is one dictionary lookup: O((N + M) x S) for S
distinct name sets. The caller runs it in a worker thread (:func:`asyncio.to_thread`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from agent.series import Labels

__all__ = ["earliest_active_at"]


def earliest_active_at(keys: Iterable[Labels], series: Iterable[tuple[Labels, float]]) -> dict[Labels, float]:
    """For each alert (its label set, ``key``), the smallest finite value among the ``series`` whose labels
    include all of the key's; alerts with no such series are left out. Values are ``activeAt`` seconds."""
    by_names: dict[tuple[str, ...], list[Labels]] = {}
    for key in keys:
        by_names.setdefault(tuple(name for name, _ in key), []).append(key)
    found = [(dict(labels), value) for labels, value in series if math.isfinite(value)]
    out: dict[Labels, float] = {}
    for names, group in by_names.items():
        index: dict[tuple[str, ...], float] = {}
        for labels, value in found:
            try:
                values = tuple(labels[name] for name in names)
            except KeyError:  # the series lacks one of the alert's labels: not this alert's
                continue
            if values not in index or value < index[values]:
                index[values] = value
        for key in group:
            earliest = index.get(tuple(value for _, value in key))
            if earliest is not None:
                out[key] = earliest
    return out
