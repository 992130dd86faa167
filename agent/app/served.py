"""``max_model_len`` of live vLLM replicas, for the daemon's capacity advice.

vLLM's ``vllm:cache_config_info`` says how many KV blocks a replica has, not how long a
sequence may be: ``max_model_len`` belongs to its ModelConfig and is not in ``/metrics``. The
OpenAI-compatible server does say it: ``GET /v1/models`` lists each served model with its
``max_model_len``. The capacity advice needs it to speak of full-length sequences ("= 16
full-length sequences of 8,192 tokens") and to suggest a shorter ``--max-model-len``, so when
a KV-saturation or scale-out alert fires the daemon asks each named replica once
(:class:`ServedLengths`), with a short timeout, and remembers the answer for a while (a
replica's ``max_model_len`` changes only when it restarts). A replica that does not answer
(LMDeploy, a metrics-only port, an older vLLM) gives ``None`` and the advice leaves the
full-length figures out, as before.

The replica is a scrape target, not a trusted peer: its answer is read up to :data:`MAX_ANSWER_BYTES`
(a models list is a few hundred bytes; a reply of hundreds of MB is cut, not held), and a length that
is not a positive integer (``1e400``, ``NaN``, ``true``, a string, nesting deep enough to exhaust
the JSON parser's recursion) counts as no answer.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import replace

import aiohttp
import structlog

from agent.diagnose.plan.fleet import ReplicaCapacity
from agent.promql.remote import read_capped

__all__ = ["CACHE_S", "TIMEOUT_S", "ServedLengths", "models_url", "served_lengths", "with_served_length"]

log = structlog.get_logger(__name__)

TIMEOUT_S = 2.0  # the alert's finding should not wait long for an optional figure
MAX_ANSWER_BYTES = 1 << 20  # a /v1/models answer is a few hundred bytes per served model
CACHE_S = 600.0  # answers (and failures) are remembered this long per instance

Fetch = Callable[[str], Awaitable[bytes]]


def models_url(instance: str) -> str:
    """``/v1/models`` on a scrape target's ``instance`` (``host:port``, or a URL)."""
    base = instance if "://" in instance else f"http://{instance}"
    return base.rstrip("/").removesuffix("/metrics") + "/v1/models"


async def _fetch(url: str) -> bytes:
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as resp:
        resp.raise_for_status()
        raw = await read_capped(resp.content, MAX_ANSWER_BYTES + 1)
    if len(raw) > MAX_ANSWER_BYTES:
        raise ValueError(f"the answer is over {MAX_ANSWER_BYTES} bytes")
    return raw


class ServedLengths:
    """Asks replicas their ``max_model_len`` (``url`` maps an ``instance`` label to its
    ``/v1/models`` URL; ``fetch`` and ``clock`` are injectable), caching per instance."""

    def __init__(self, *, url: Callable[[str], str] = models_url, fetch: Fetch = _fetch,
                 clock: Callable[[], float]) -> None:
        self._url, self._fetch, self._clock = url, fetch, clock
        self._cache: dict[str, tuple[float, int | None]] = {}

    def source(self, instance: str) -> str:
        """Where the figure came from, for the finding's evidence."""
        return self._url(instance)

    async def max_model_len(self, instance: str, model: str = "") -> int | None:
        """The replica's ``max_model_len`` (of ``model`` when it serves several), or ``None``."""
        now = self._clock()
        if (hit := self._cache.get(instance)) is not None and now - hit[0] < CACHE_S:
            return hit[1]
        value: int | None = None
        url = self._url(instance)
        try:
            cards = json.loads(await self._fetch(url))["data"]
            card = next((c for c in cards if c.get("id") == model), cards[0]) if cards else {}
            value = _length(card.get("max_model_len"))
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError, TypeError, AttributeError,
                IndexError, RecursionError) as exc:
            log.info("no max_model_len from the replica; capacity advice without full-length sequences",
                     url=url, error=str(exc) or type(exc).__name__)
        self._cache[instance] = (now, value)
        return value


def _length(raw: object) -> int | None:
    """A served ``max_model_len``: a positive integer (JSON's ``8192``, not ``8192.5``, ``true`` or ``"8192"``)."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw <= 0:
        raise ValueError(f"max_model_len is not a positive integer: {str(raw)[:40]!r}")
    return raw


async def served_lengths(served: ServedLengths, replicas: Iterable[ReplicaCapacity]) -> dict[str, tuple[int, str]]:
    """``instance -> (max_model_len, where it came from)`` for the replicas that answer."""
    out: dict[str, tuple[int, str]] = {}
    for r in replicas:
        if (n := await served.max_model_len(r.instance, r.model)) is not None:
            out[r.instance] = (n, served.source(r.instance))
    return out


def with_served_length(r: ReplicaCapacity, lengths: Mapping[str, tuple[int, str]]) -> ReplicaCapacity:
    """``r`` with the ``max_model_len`` its instance served, unless it already has one."""
    if r.max_model_len or r.instance not in lengths:
        return r
    n, source = lengths[r.instance]
    return replace(r, max_model_len=n, max_model_len_source=source)
