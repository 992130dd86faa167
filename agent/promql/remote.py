"""Instant queries against a Prometheus-compatible server, for rule evaluation in Prometheus mode.

The hot path of a remote evaluation: one form-POST to ``/api/v1/query`` per rule, on aiohttp
with an explicit timeout (also sent as the API's ``timeout=`` so the server stops working on a
query nobody waits for), at ``time`` = evaluation time − ``query_offset``. prometheus-api-client
does not fit here: it is synchronous, has no default timeout and drops ``warnings`` and
VictoriaMetrics' ``isPartial``, which decide whether an answer may be used.

The answer's shape is checked by :mod:`agent.promql.answer`, shared with the range queries. Every way the
answer can be unusable raises :class:`~agent.errors.SourceError` with the
reason (unreachable, timeout, HTTP status with the server's ``errorType``/``error``, a body that
is not the API's JSON, a partial answer under ``partial_response: abort``), so the rule manager
keeps the rule's alerts as they were. Under ``partial_response: warn`` a partial answer or
warnings are used, logged once per distinct message and counted (Thanos' semantics).
"""

from __future__ import annotations

import base64
import json
from collections import Counter

import aiohttp
import structlog

from agent.config.source import SourceConfig
from agent.errors import SourceError
from agent.promql.answer import MAX_ANSWER_BYTES, deadline_s, parse_query_response
from agent.series import Labels

__all__ = ["RemoteSource", "parse_query_response", "read_capped"]

log = structlog.get_logger(__name__)

MAX_RESPONSE_BYTES = MAX_ANSWER_BYTES


async def read_capped(content: aiohttp.StreamReader, limit: int) -> bytes:
    """The body up to ``limit`` bytes. ``StreamReader.read(n)`` returns what has arrived so far (at most
    ``n``), not ``n`` bytes: an answer of a thousand series comes in several chunks, and one read of it
    is a truncated JSON document."""
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


_BODY_EXCERPT = 200


class RemoteSource:
    """One server's instant-query API; create it on the event loop that will use it.

    ``failures`` counts failed queries by reason class and ``partial_answers`` the partial
    answers used under ``warn``, for the agent's ``/metrics``; ``up`` says whether the last
    query got a usable answer.
    """

    def __init__(self, config: SourceConfig) -> None:
        if config.url is None:
            raise SourceError("a remote source needs a URL")
        self.config = config
        self.url = f"{config.url}/api/v1/query"
        self.up = False
        self.failures: Counter[str] = Counter()
        self.partial_answers = 0
        self._session: aiohttp.ClientSession | None = None
        self._warned: set[str] = set()

    def _headers(self) -> dict[str, str]:
        headers = {**self.config.headers, "Accept": "application/json"}
        if self.config.bearer_token is not None:
            headers["Authorization"] = f"Bearer {self.config.bearer_token.get_secret_value()}"
        elif self.config.basic_auth is not None:
            ba = self.config.basic_auth
            pair = f"{ba.username}:{ba.password.get_secret_value()}"  # Go's SetBasicAuth
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        return headers

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ssl = self.config.tls.context() if self.url.startswith("https:") else False
            self._session = aiohttp.ClientSession(
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=deadline_s(self.config.timeout)),  # start to last byte
                connector=aiohttp.TCPConnector(ssl=ssl, limit=32),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def recording_rules(self) -> set[str]:
        """Names of the recording rules the server evaluates itself (``GET /api/v1/rules?type=record``:
        Prometheus, Thanos and Mimir rulers, VictoriaMetrics with ``-vmalert.proxyURL``).
        :class:`SourceError` when the server has no rules API or does not answer."""
        url = f"{self.config.url}/api/v1/rules"
        try:
            async with self._open().get(url, params={"type": "record"}) as resp:
                raw = await read_capped(resp.content, MAX_RESPONSE_BYTES + 1)
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise SourceError(f"{url}: {exc.__class__.__name__}: {exc}") from exc
        try:
            body = json.loads(raw)
            groups = body["data"]["groups"] if status < 400 and body.get("status") == "success" else None
            if groups is None:
                raise SourceError(f"{url}: HTTP {status}: {str(body.get('error', 'no rules API'))[:_BODY_EXCERPT]}")
            return {str(r["name"]) for g in groups for r in g.get("rules", []) if r.get("type") == "recording"}
        except (ValueError, UnicodeDecodeError, RecursionError, KeyError, TypeError, AttributeError) as exc:
            raise SourceError(f"{url}: HTTP {status}, not the rules API's JSON") from exc

    async def instant(self, query: str, at_ms: int) -> list[tuple[Labels, float]]:
        """The rule result of ``query`` at ``at_ms`` − ``query_offset``; :class:`SourceError` if unusable."""
        try:
            result = await self._instant(query, at_ms)
        except SourceError:
            self.up = False
            raise
        self.up = True
        return result

    async def _instant(self, query: str, at_ms: int) -> list[tuple[Labels, float]]:
        at = (at_ms - int(self.config.query_offset * 1000)) / 1000
        form = {"query": query, "time": f"{at:.3f}", "timeout": f"{self.config.timeout:g}s"}
        try:
            async with self._open().post(self.url, data=form) as resp:
                raw = await read_capped(resp.content, MAX_RESPONSE_BYTES + 1)
                status = resp.status
        except TimeoutError as exc:
            self.failures["timeout"] += 1
            raise SourceError(f"{self.url}: no answer within {deadline_s(self.config.timeout):g}s") from exc
        except aiohttp.ClientError as exc:
            self.failures["unreachable"] += 1
            raise SourceError(f"{self.url}: {exc.__class__.__name__}: {exc}") from exc
        if len(raw) > MAX_RESPONSE_BYTES:
            self.failures["too_large"] += 1
            raise SourceError(f"{self.url}: answer larger than {MAX_RESPONSE_BYTES >> 20} MiB")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nesting past the stack
            self.failures[f"http_{status}" if status >= 400 else "bad_response"] += 1
            excerpt = raw[:_BODY_EXCERPT].decode("utf-8", "replace")
            raise SourceError(f"{self.url}: HTTP {status}, not the query API's JSON: {excerpt!r}") from exc
        try:
            result, warnings, partial = parse_query_response(body)
        except SourceError as exc:
            self.failures[f"http_{status}" if status >= 400 else "bad_response"] += 1
            raise SourceError(f"{self.url}: HTTP {status}: {exc}") from exc
        if status >= 400:  # a success body with an error status: believe the status
            self.failures[f"http_{status}"] += 1
            raise SourceError(f"{self.url}: HTTP {status}")
        if partial or warnings:
            self._partial(query, warnings, partial)
        return result

    def _partial(self, query: str, warnings: list[str], partial: bool) -> None:
        what = "; ".join(warnings) or "partial result (isPartial)"
        if self.config.partial_response == "abort":
            self.failures["partial"] += 1
            raise SourceError(f"partial answer refused (partial_response: abort): {what[:_BODY_EXCERPT]}")
        self.partial_answers += 1
        if what not in self._warned and len(self._warned) < 1000:
            self._warned.add(what)
            log.warning("partial answer used (partial_response: warn)", query=query, warnings=what[:_BODY_EXCERPT],
                        is_partial=partial)
