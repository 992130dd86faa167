"""HMAC-SHA256 request signatures for webhooks and scale requests.

The scheme is Slack's and Stripe's: the sender puts the Unix time in
``X-SRE-Agent-Timestamp`` and ``v1=<hex HMAC-SHA256(secret, "<timestamp>." + body)>`` in
``X-SRE-Agent-Signature``. Signing the timestamp with the body lets a receiver reject
replays (a captured request re-sent later fails the age check), and the ``v1=`` prefix
leaves room to rotate the scheme. A receiver verifies with :func:`verify` or these
lines in any language: recompute the HMAC over ``timestamp + "." + raw body`` and
compare in constant time.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "sign", "signature_headers", "verify"]

SIGNATURE_HEADER = "X-SRE-Agent-Signature"
TIMESTAMP_HEADER = "X-SRE-Agent-Timestamp"
MAX_AGE_S = 300  # a receiver should refuse older requests (Slack uses the same 5 minutes)


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    digest = hmac.new(secret, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"v1={digest}"


def signature_headers(secret: bytes, timestamp: int, body: bytes) -> dict[str, str]:
    return {TIMESTAMP_HEADER: str(timestamp), SIGNATURE_HEADER: sign(secret, timestamp, body)}


def verify(secret: bytes, timestamp: str, body: bytes, signature: str, *, now: float, max_age_s: float = MAX_AGE_S
           ) -> bool:
    """True if ``signature`` is ours for this body and the timestamp is recent."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs(now - ts) > max_age_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature)
