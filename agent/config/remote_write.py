"""``remote_write:``, where the agent writes what its rules produce: Prometheus' remote-write protocol.

In Prometheus mode the bundled alerts read the agent's recording rules (``job_model:…``), so the
server must hold their results: either the server runs the recording rules itself, or the agent
evaluates them and writes the results back here, with ``ALERTS`` and ``ALERTS_FOR_STATE`` (setup
(b) of Prometheus mode). In embedded mode it is how dashboards in a central Prometheus or
VictoriaMetrics see the agent's results, and, with ``write: [..., scraped]``, what it scraped.

Each entry has its own persistent queue in the state database (``queue.capacity`` samples; when
full the oldest are dropped and counted). Credentials (``bearer_token_file``/``_env`` or
``basic_auth``) come from files or the environment only, like every secret, and print as
``**********``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from agent.config.collect import Credentials, check_headers, check_target_url
from agent.config.source import SourceTLSConfig
from agent.config.types import ConfigModel, Duration
from agent.series import is_label_name

__all__ = ["RemoteWriteConfig", "RemoteWriteQueueConfig", "WriteWhat"]

WriteWhat = Literal["recording", "alerts", "scraped"]
DEFAULT_WRITE: tuple[WriteWhat, ...] = ("recording", "alerts")

# Headers the agent sets itself (the protocol's and the credentials'): a user value would break the request.
_RESERVED_HEADERS = frozenset({
    "authorization", "content-type", "content-length", "content-encoding", "host", "user-agent",
    "x-prometheus-remote-write-version",
})


class RemoteWriteQueueConfig(ConfigModel):
    """How a remote's queue batches, retries and bounds itself (names as in Prometheus' ``queue_config``)."""

    # Pending samples kept in the state database for this remote. At about 130 bytes a sample
    # (labels included, before compression) 500,000 are ~65 MB on disk: with the bundled rules on
    # 100 targets (~300 samples an evaluation) that is hours of a remote that is down.
    capacity: int = Field(default=500_000, ge=1)
    # Samples in one request: 2,000 are ~250 KB before snappy, ~40 KB after.
    max_samples_per_send: int = Field(default=2000, ge=1)
    min_backoff: Duration = 0.03  # the first retry; doubles per failure up to max_backoff (Prometheus' defaults)
    max_backoff: Duration = 5.0

    @model_validator(mode="after")
    def _backoff(self) -> RemoteWriteQueueConfig:
        if self.min_backoff <= 0 or self.max_backoff < self.min_backoff:
            raise ValueError("backoff: need 0 < min_backoff <= max_backoff")
        if self.max_samples_per_send > self.capacity:
            raise ValueError("max_samples_per_send cannot exceed capacity")
        return self


class RemoteWriteConfig(Credentials):
    """One remote-write endpoint: Prometheus (``/api/v1/write`` with ``--web.enable-remote-write-receiver``),
    VictoriaMetrics (``/api/v1/write``), Mimir, Thanos Receive, or a vmagent."""

    url: str
    # The queue's identity (state database, logs, the remote_name label); defaults to the URL. Two entries
    # writing to one URL (two Mimir tenants through headers) need names.
    name: str = ""
    headers: dict[str, str] = Field(default_factory=dict)  # e.g. X-Scope-OrgID for Mimir/Cortex tenants
    tls: SourceTLSConfig = SourceTLSConfig()
    timeout: Duration = 30.0  # per request (Prometheus' remote_timeout)
    # Added to every series written here where the series lacks the label (after rules.external_labels,
    # which apply too): a replica label lets Mimir or VictoriaMetrics de-duplicate an HA pair.
    external_labels: dict[str, str] = Field(default_factory=dict)
    # recording: recording-rule results; alerts: ALERTS and ALERTS_FOR_STATE; scraped: every stored sample
    # of a scrape (embedded mode only: in Prometheus mode the server scrapes).
    write: list[WriteWhat] = Field(default_factory=lambda: list(DEFAULT_WRITE), min_length=1)
    queue: RemoteWriteQueueConfig = RemoteWriteQueueConfig()

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_target_url(v)  # no user:pass@ either: URLs are printed and are metric labels

    @field_validator("headers")
    @classmethod
    def _headers(cls, v: dict[str, str]) -> dict[str, str]:
        return check_headers(v, _RESERVED_HEADERS, " (remote write's own headers, or credentials: give those as "
                                                   "bearer_token_file, bearer_token_env or basic_auth)")

    @field_validator("external_labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not is_label_name(name) or name.startswith("__"):
                raise ValueError(f"invalid external label name {name!r}")
            if not value:
                raise ValueError(f"external label {name!r}: an empty value means no label; leave it out")
        return v

    @field_validator("timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("timeout must be positive")
        return v

    @field_validator("write")
    @classmethod
    def _unique(cls, v: list[WriteWhat]) -> list[WriteWhat]:
        if len(set(v)) != len(v):
            raise ValueError("write: each kind once")
        return v

    @property
    def queue_name(self) -> str:
        return self.name or self.url
