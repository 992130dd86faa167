"""Tests for agent.act.sinks.http: the one ``Retry-After`` parser and its cap, shared by every sink and
the remote-write queue."""

from __future__ import annotations

import pytest

from agent.act.remote_write import queue as remote_write_queue
from agent.act.sinks.http import RETRY_AFTER_CAP_S, check_status, parse_retry_after
from agent.errors import DeliveryError

NOW = 1_700_000_000.0  # Tue, 14 Nov 2023 22:13:20 GMT

RETRY_AFTER = [
    ("delta seconds", "120", 120.0),
    ("delta with spaces", "  7 ", 7.0),
    ("fractional delta", "1.5", 1.5),
    ("zero", "0", 0.0),
    ("negative", "-30", 0.0),
    ("huge delta", str(10**10), RETRY_AFTER_CAP_S),
    ("a 400-digit delta", "9" * 400, RETRY_AFTER_CAP_S),
    ("a huge float", "1e308", RETRY_AFTER_CAP_S),
    ("infinity", "inf", None),
    ("-infinity", "-Infinity", None),
    ("NaN", "NaN", None),
    ("HTTP date a minute ahead", "Tue, 14 Nov 2023 22:14:20 GMT", 60.0),
    ("HTTP date in the past", "Tue, 14 Nov 2023 22:00:00 GMT", 0.0),
    ("HTTP date in year 9999", "Fri, 31 Dec 9999 23:59:59 GMT", RETRY_AFTER_CAP_S),
    ("HTTP date without a zone", "Tue, 14 Nov 2023 22:14:20", 60.0),
    ("garbage", "soon, please", None),
    ("empty", "", None),
    ("absent", None, None),
    ("a date with a nonsense day", "Tue, 99 Nov 2023 22:14:20 GMT", None),
]


@pytest.mark.parametrize("what, value, seconds", RETRY_AFTER, ids=[r[0] for r in RETRY_AFTER])
def test_retry_after_is_read_in_both_forms_and_capped(what: str, value: str | None, seconds: float | None) -> None:
    """Delta seconds and HTTP dates are read; the past and negatives are 0, anything longer than the cap is the
    cap (a wrong header must not park a queue for decades), garbage, NaN and infinities are None (the backoff
    decides)."""
    assert parse_retry_after(value, NOW) == seconds


def test_the_remote_write_queue_shares_the_cap() -> None:
    """One cap for every sender: the remote-write queue's is the sinks' own."""
    assert remote_write_queue.RETRY_AFTER_CAP_S is RETRY_AFTER_CAP_S


@pytest.mark.parametrize("status", [408, 429, 500, 503])
def test_a_retryable_reply_carries_the_capped_hint(status: int) -> None:
    """A 408, 429 or 5xx with a Retry-After decades ahead is retryable within the cap."""
    with pytest.raises(DeliveryError) as err:
        check_status(status, "", {"Retry-After": "Fri, 31 Dec 9999 23:59:59 GMT"}, what="x", now=NOW)
    assert not err.value.permanent and err.value.retry_after_s == RETRY_AFTER_CAP_S
