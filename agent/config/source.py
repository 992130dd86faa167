"""Where rules get their data: the agent's own store (``embedded``) or a Prometheus-compatible
server's HTTP API (``prometheus``: Prometheus, VictoriaMetrics, Thanos, Mimir).

Teams that already scrape vLLM and dcgm-exporter with Prometheus point the agent at it instead
of scraping a second time. The agent then evaluates the same ``rules/`` through
``/api/v1/query`` and adds what only it knows (diagnosis, runbooks, scaling) to the alerts.
Groups named in ``local_groups`` still run over the agent's own store: the ``sre-agent``
group watches the agent and its source, and must keep working while the server is down.
"""

from __future__ import annotations

import ssl
from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent.config.collect import Credentials, check_headers, check_target_url
from agent.config.types import ConfigModel, Duration

__all__ = ["SourceConfig", "SourceTLSConfig"]

# Headers the agent sets itself: a user value would silently replace (or duplicate) them.
_RESERVED_HEADERS = frozenset({"authorization", "content-type", "content-length", "host"})


class SourceTLSConfig(ConfigModel):
    """TLS toward the server: a private CA, a client certificate, or (for a lab) no verification."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False

    @model_validator(mode="after")
    def _loadable(self) -> SourceTLSConfig:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("give cert_file and key_file together (a client certificate needs its key)")
        try:
            self.context()
        except OSError as exc:  # ssl.SSLError is an OSError too
            raise ValueError(f"cannot load the TLS files: {exc.strerror or exc}") from exc
        return self

    def context(self) -> ssl.SSLContext:
        """The client SSL context these settings describe (checked once, when the config loads)."""
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None and self.key_file is not None:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


class SourceConfig(Credentials):
    """``source:``, the rule data source. Credentials (``bearer_token_file``/``_env`` or
    ``basic_auth``) come from files or the environment only, like every secret."""

    type: Literal["embedded", "prometheus"] = "embedded"
    url: str | None = None  # the server's base URL: http://prometheus:9090, http://vm:8428, .../prometheus for Mimir
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. X-Scope-OrgID for Mimir/Cortex tenants
    tls: SourceTLSConfig = SourceTLSConfig()
    timeout: Duration = 10.0  # per query; also sent as the API's timeout= so the server gives up too
    # Evaluate at "now - query_offset" (Prometheus' rule query_offset, vmalert's -rule.evalDelay):
    # data that arrives late, such as remote-written samples, is then complete when queried.
    # 0 for a server that scrapes itself; about 30s when vLLM's samples reach it by remote write.
    query_offset: Duration = 0.0
    # A partial answer (VictoriaMetrics' isPartial, Thanos' or Prometheus' warnings): "abort"
    # fails the evaluation (no alert changes, like a failed query); "warn" uses it, logs and counts.
    partial_response: Literal["abort", "warn"] = "abort"
    local_groups: list[str] = Field(default_factory=lambda: ["sre-agent"])
    # Where the bundled recording rules run. "server": loaded into the server (``sre-agent rules export``
    # or the PrometheusRule); the agent evaluates only alerting rules. "agent": the agent evaluates
    # them and remote_write sends the results back. "auto": "server" if the server's rules API lists
    # every one of them, else "agent".
    recording_rules: Literal["auto", "server", "agent"] = "auto"

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return None if v is None else check_target_url(v).rstrip("/")  # no user:pass@ either

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        return check_headers(v, _RESERVED_HEADERS, "; give credentials as bearer_token_file, bearer_token_env or "
                                                   "basic_auth")

    @field_validator("timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("timeout must be positive")
        return v

    @field_validator("query_offset")
    @classmethod
    def _not_negative(cls, v: float) -> float:
        if v < 0:
            raise ValueError("query_offset cannot be negative")
        return v

    @model_validator(mode="after")
    def _url_for_remote(self) -> SourceConfig:
        if self.type == "prometheus" and self.url is None:
            raise ValueError("url: type prometheus needs the server's URL (e.g. http://prometheus:9090)")
        if self.type == "embedded" and self.url is not None:
            raise ValueError("url is only used with type: prometheus (embedded evaluates over the agent's own store)")
        return self

    @property
    def remote(self) -> bool:
        return self.type == "prometheus"
