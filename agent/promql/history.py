"""Range queries on the rule source, for diagnostics in Prometheus mode.

In Prometheus mode the agent's store holds only its own series, so a diagnosis that needs a
GPU's memory over the last 15 minutes (the OOM context) asks the server instead. This is where
prometheus-api-client fits: a synchronous ``query_range`` now and then, run in a worker thread
(:func:`asyncio.to_thread`) so it never blocks the event loop, with the source's credentials,
TLS settings and timeout. The answer is loaded into a small :class:`~agent.store.Store`, so the
diagnosis code reads it exactly as it reads the embedded store.

The rule evaluation hot path does not use it (see :mod:`agent.promql.remote` for why).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import requests
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from agent.config.source import SourceConfig
from agent.errors import SourceError
from agent.series import labels_from
from agent.store import Store

__all__ = ["RemoteHistory"]

_RETENTION_MS = 24 * 3600 * 1000  # the scratch store keeps whatever range was asked for


class RemoteHistory:
    """Range queries against ``config.url``; every method is blocking (call it in a thread)."""

    def __init__(self, config: SourceConfig) -> None:
        if config.url is None:
            raise SourceError("a remote source needs a URL")
        session = requests.Session()
        tls = config.tls
        session.verify = False if tls.insecure_skip_verify else (tls.ca_file or True)
        if tls.cert_file is not None and tls.key_file is not None:
            session.cert = (tls.cert_file, tls.key_file)
        headers = dict(config.headers)
        auth: tuple[str, str] | None = None
        if config.bearer_token is not None:
            headers["Authorization"] = f"Bearer {config.bearer_token.get_secret_value()}"
        elif config.basic_auth is not None:
            auth = (config.basic_auth.username, config.basic_auth.password.get_secret_value())
        self.url = config.url
        self._client = PrometheusConnect(url=config.url, headers=headers, auth=auth, session=session,
                                         disable_ssl=tls.insecure_skip_verify, timeout=config.timeout)

    def query_range(self, expr: str, start_ms: int, end_ms: int, *, step_s: float = 15.0
                    ) -> list[tuple[dict[str, str], list[int], list[float]]]:
        """One range query: each series' labels, times (ms) and values, as the server answered.

        :class:`SourceError` when the server does not answer or refuses the query (the triage report
        then draws that plot empty and says why)."""
        start, end = (datetime.fromtimestamp(ms // 1000, UTC) for ms in (start_ms, end_ms))
        try:
            matrix: Any = self._client.custom_query_range(expr, start_time=start, end_time=end, step=f"{step_s:g}s")
        except (PrometheusApiClientException, requests.RequestException, ValueError) as exc:
            raise SourceError(f"{self.url}: range query {expr!r} failed: {exc}") from exc
        out = []
        for series in matrix or []:
            labels = {str(k): str(v) for k, v in series.get("metric", {}).items()}
            points = series.get("values", [])
            out.append((labels, [int(float(t) * 1000) for t, _ in points], [float(v) for _, v in points]))
        return out

    def fetch(self, selectors: list[str], start_ms: int, end_ms: int, *, step_s: float = 15.0) -> Store:
        """Every series ``selectors`` select between ``start_ms`` and ``end_ms``, at ``step_s``, in a new store.

        :class:`SourceError` when the server does not answer or refuses a query; the caller
        diagnoses without the history then.
        """
        store = Store(_RETENTION_MS)
        # whole seconds, rounded down: the client rounds to the nearest second, which could ask past end_ms
        start, end = (datetime.fromtimestamp(ms // 1000, UTC) for ms in (start_ms, end_ms))
        for selector in selectors:
            try:
                matrix: Any = self._client.custom_query_range(selector, start_time=start, end_time=end,
                                                              step=f"{step_s:g}s")
            except (PrometheusApiClientException, requests.RequestException, ValueError) as exc:
                raise SourceError(f"{self.url}: range query {selector!r} failed: {exc}") from exc
            for series in matrix or []:
                labels = labels_from(None, {str(k): str(v) for k, v in series.get("metric", {}).items()})
                for ts, value in series.get("values", []):
                    store.append(labels, int(float(ts) * 1000), float(value))
        return store
