"""What to scrape and how: targets, file_sd, their credentials, and the per-target limits.

Apart from :mod:`agent.config` because the collection settings carry most of the rules a
hostile or broken target meets first: credentials are never part of a URL (it is printed
everywhere), only one ``Authorization`` per target, and the cardinality limits that keep one
target from growing the agent's memory without bound.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from agent.config.types import ByteSize, ConfigModel, Duration, check_url, format_duration

__all__ = ["BasicAuthConfig", "Credentials", "FileSDConfig", "ScrapeConfig", "ShardConfig", "TargetConfig",
           "check_headers", "check_target_url"]

_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class BasicAuthConfig(ConfigModel):
    """HTTP basic authentication for a target (Prometheus' ``basic_auth``); the password comes
    from ``password_file`` or ``password_env`` only, like every other secret."""

    username: str = Field(min_length=1)
    password: SecretStr

    @field_validator("username")
    @classmethod
    def _no_colon(cls, v: str) -> str:
        if ":" in v:
            raise ValueError("a basic_auth username cannot contain ':' (RFC 7617)")
        return v

    SECRETS = ("password",)


class Credentials(ConfigModel):
    """How a scrape authenticates: a bearer token (``bearer_token_file``/``_env``) or basic auth,
    at most one of them (a request has one ``Authorization`` header)."""

    bearer_token: SecretStr | None = None
    basic_auth: BasicAuthConfig | None = None

    SECRETS = ("bearer_token",)

    @model_validator(mode="after")
    def _one_authorization(self) -> Credentials:
        if self.bearer_token is not None and self.basic_auth is not None:
            raise ValueError("give bearer_token or basic_auth, not both (a request has one Authorization header)")
        return self


class TargetConfig(Credentials):
    """One static scrape target: a vLLM or LMDeploy ``/metrics`` URL.

    Credentials in the URL (``http://user:pass@host/metrics``) are refused: a URL is what logs,
    ``/api/v1/targets``, ``run --once --json`` and incidents print, and redacting it in every one
    of them is a promise one forgotten path breaks. ``basic_auth`` takes the password from a file
    or the environment instead, and prints as ``**********``.
    """

    url: str
    job: str = "vllm"
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_target_url(v)

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _LABEL_NAME_RE.fullmatch(name) or name.startswith("__"):  # fullmatch: "$" passes "a\n"
                raise ValueError(f"invalid label name {name!r}")
        return v


def check_headers(v: dict[str, str], reserved: frozenset[str], why: str) -> dict[str, str]:
    """Extra HTTP headers for an outgoing request, refusing those the agent sets itself (``reserved``,
    lower case): a user value would silently replace or duplicate them. ``why`` ends the message."""
    for name in v:
        if name.lower() in reserved:
            raise ValueError(f"header {name!r} is set by the agent{why}")
    return v


def check_target_url(v: str) -> str:
    """:func:`check_url` for a scrape target, which also refuses credentials in the URL."""
    if "@" in re.split(r"[/?#]", v.partition("://")[2], maxsplit=1)[0]:  # before check_url: its errors quote the URL
        raise ValueError(
            "credentials in the URL are refused (the URL is shown in logs, /api/v1/targets and incidents); "
            "remove them and use basic_auth: {username: ..., password_file: ...} (or password_env)"
        )
    return check_url(v)


class FileSDConfig(Credentials):
    """Prometheus ``file_sd`` files (JSON or YAML lists of ``{targets, labels}``). ``bearer_token``
    and ``basic_auth`` apply to every target the files list (a target address with credentials,
    ``user:pass@host:port``, is refused like a static URL with them)."""

    files: list[str] = Field(min_length=1)
    job: str = "vllm"
    refresh_interval: Duration = 300.0


class ShardConfig(ConfigModel):
    """``scrape.shards``: this agent scrapes the targets whose Prometheus ``hashmod`` of ``__address__``
    (md5, modulo ``total``) equals its index, so N agents (or N Prometheus servers with the same
    relabelling) split a fleet the same way. The index is given as ``index`` or read from
    ``index_env``: a number, or a StatefulSet pod name ending in its ordinal (``sre-agent-shard-2``)."""

    total: int = Field(ge=1, le=10_000)
    index: int | None = Field(default=None, ge=0)
    index_env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _index_from_env(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or data.get("index_env") is None:
            return data
        if data.get("index") is not None:
            raise ValueError("give index or index_env, not both")
        name = data["index_env"]
        environ: Mapping[str, str] = (info.context or {}).get("environ", {})
        if not isinstance(name, str) or name not in environ:
            raise ValueError(f"index_env: environment variable {name!r} is not set")
        m = re.search(r"(\d+)$", environ[name])
        if m is None:
            raise ValueError(f"index_env: {name}={environ[name]!r} does not end in a shard number "
                             "(a number, or a StatefulSet pod name like sre-agent-shard-2)")
        return {**data, "index": int(m.group(1))}

    @model_validator(mode="after")
    def _index_below_total(self) -> ShardConfig:
        if self.index is None:
            raise ValueError("give index (0 to total - 1) or index_env")
        if self.index >= self.total:
            raise ValueError(f"index {self.index} is not below total {self.total}")
        return self


class ScrapeConfig(ConfigModel):
    interval: Duration = 15.0
    timeout: Duration = 10.0
    body_limit: ByteSize = 16 * 2**20
    # Scrapes in flight at once (the slowest targets of the last cycle start first), in two pools of this
    # size: targets that answered last time and those that failed, so those that hang until the timeout
    # never hold the others' slots; 0 = every target at once, as Prometheus' goroutine per
    # target. Measured at 1,000 targets on 2 vCPUs: 64 with 100 hanging targets ran 4 of 12 cycles in a
    # minute; 0 with no hanging target but a busy loop timed out 3,644 healthy scrapes a minute (replies
    # that had arrived waited behind other targets' parsing); 256 timed out no healthy scrape, and ran 7
    # of 12 cycles (6 with the 100 hanging targets).
    concurrency: int = Field(default=256, ge=0, le=100_000,
                             description="scrapes in flight at once, and as many again for targets whose last "
                                         "scrape failed; 0 = every target at once")
    # Per-target limits, Prometheus' scrape_config names and messages; over one, the scrape fails and
    # the target is down with the reason. 0 = unlimited. The defaults are far above what a vLLM or
    # LMDeploy server sends (its widest series, vllm:cache_config_info, has about 25 labels counting
    # job and instance; its longest values are model paths and LoRA adapter lists) and low enough
    # that one broken or hostile target cannot grow the agent's memory without bound.
    sample_limit: int = Field(default=0, ge=0, description="kept samples per scrape; Prometheus' default, 0")
    label_limit: int = Field(default=64, ge=0, description="labels per series, __name__ and target labels included")
    label_name_length_limit: int = Field(default=256, ge=0, description="bytes per label name")
    label_value_length_limit: int = Field(default=4096, ge=0, description="bytes per label value")
    # Series new to the store per target per scrape (Prometheus has no such limit; its TSDB grows
    # until it is out of memory). 10,000 is three times a data-parallel-8 vLLM V1 server's whole
    # payload (about 400 series per engine), so a first scrape always passes, while a target that
    # mints tens of thousands of new series every scrape (a request ID or a counter in a label)
    # fails every scrape instead of adding them until retention drops them.
    new_series_limit: int = Field(default=10_000, ge=0, description="series new to the store per target per scrape")
    shards: ShardConfig | None = None  # None: scrape every target

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> ScrapeConfig:
        if self.interval <= 0:
            raise ValueError("interval must be positive")
        if not 0 < self.timeout <= self.interval:
            raise ValueError(
                f"timeout ({format_duration(self.timeout)}) must be positive and not longer than "
                f"interval ({format_duration(self.interval)})"
            )
        return self
