"""The agent's one typed configuration, loaded from YAML and validated once at start.

Every problem is reported with its key path and the bad value
(``targets[2].url: not a URL: 'foo'``), all problems at once, so a user fixes the file
in one pass. Secrets are never written inline: a secret field is given as
``<name>_file`` (read from a file, the Kubernetes-secret way) or ``<name>_env`` (read
from an environment variable); both are resolved here, the only place the process
environment is read, and the value is held as a :class:`pydantic.SecretStr` that
prints as ``**********`` in logs, ``sre-agent check`` and ``/api`` output.

Durations are written the Prometheus way (``15s``, ``5m``, ``1h30m``, ``100ms``);
sizes as ``16MiB``, ``512KiB``, ``1GB`` or plain bytes.
"""

from __future__ import annotations

import difflib
import ipaddress
import re
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agent.config.act import (
    ActionConfig,
    AlertmanagerReceiverConfig,
    ConsoleReceiverConfig,
    DiagnosticsConfig,
    NcclDiagnosisConfig,
    NotifyConfig,
    OomDiagnosisConfig,
    ReceiverConfig,
    RouteConfig,
    ScaleWebhookConfig,
    ScalingConfig,
    ScalingServiceConfig,
    SlackReceiverConfig,
    WebhookReceiverConfig,
    default_actions,
    default_route,
)
from agent.config.types import (
    ByteSize,
    ConfigModel,
    Duration,
    check_url,
    format_duration,
    parse_duration,
    parse_size,
    resolve_secret,
)
from agent.errors import ConfigError
from agent.gocompat import yamlv3

__all__ = [
    "ActionConfig",
    "AlertmanagerReceiverConfig",
    "BasicAuthConfig",
    "Config",
    "ConsoleReceiverConfig",
    "DiagnosticsConfig",
    "FileSDConfig",
    "NcclDiagnosisConfig",
    "NotifyConfig",
    "NvmlConfig",
    "OomDiagnosisConfig",
    "ReceiverConfig",
    "RouteConfig",
    "ScaleWebhookConfig",
    "ScalingConfig",
    "ScalingServiceConfig",
    "ScrapeConfig",
    "ServerAuthConfig",
    "ServerConfig",
    "ServerTLSConfig",
    "SlackReceiverConfig",
    "StoreConfig",
    "TargetConfig",
    "WebhookReceiverConfig",
    "bundled_rules_dir",
    "check_target_url",
    "format_duration",
    "load_config",
    "parse_duration",
    "parse_size",
]

DEFAULT_TARGET = "http://127.0.0.1:8000/metrics"  # vLLM's default port (vllm serve --port 8000)
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

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        return resolve_secret(dict(data), "password", info) if isinstance(data, dict) else data


class TargetConfig(ConfigModel):
    """One static scrape target: a vLLM or LMDeploy ``/metrics`` URL.

    Credentials in the URL (``http://user:pass@host/metrics``) are refused: a URL is what logs,
    ``/api/v1/targets``, ``run --once --json`` and incidents print, and redacting it in every one
    of them is a promise one forgotten path breaks. ``basic_auth`` takes the password from a file
    or the environment instead, and prints as ``**********``.
    """

    url: str
    job: str = "vllm"
    labels: dict[str, str] = Field(default_factory=dict)
    bearer_token: SecretStr | None = None
    basic_auth: BasicAuthConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        return resolve_secret(dict(data), "bearer_token", info) if isinstance(data, dict) else data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_target_url(v)

    @model_validator(mode="after")
    def _one_authorization(self) -> TargetConfig:
        if self.bearer_token is not None and self.basic_auth is not None:
            raise ValueError("give bearer_token or basic_auth, not both (a request has one Authorization header)")
        return self

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _LABEL_NAME_RE.match(name) or name.startswith("__"):
                raise ValueError(f"invalid label name {name!r}")
        return v


def check_target_url(v: str) -> str:
    """:func:`check_url` for a scrape target, which also refuses credentials in the URL."""
    if "@" in re.split(r"[/?#]", v.partition("://")[2], maxsplit=1)[0]:  # before check_url: its errors quote the URL
        raise ValueError(
            "credentials in the URL are refused (the URL is shown in logs, /api/v1/targets and incidents); "
            "remove them and use basic_auth: {username: ..., password_file: ...} (or password_env)"
        )
    return check_url(v)


class FileSDConfig(ConfigModel):
    """Prometheus ``file_sd`` files (JSON or YAML lists of ``{targets, labels}``). ``bearer_token``
    and ``basic_auth`` apply to every target the files list (a target address with credentials,
    ``user:pass@host:port``, is refused like a static URL with them)."""

    files: list[str] = Field(min_length=1)
    job: str = "vllm"
    refresh_interval: Duration = 300.0
    bearer_token: SecretStr | None = None
    basic_auth: BasicAuthConfig | None = None

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        return resolve_secret(dict(data), "bearer_token", info) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _one_authorization(self) -> FileSDConfig:
        if self.bearer_token is not None and self.basic_auth is not None:
            raise ValueError("give bearer_token or basic_auth, not both (a request has one Authorization header)")
        return self


class ScrapeConfig(ConfigModel):
    interval: Duration = 15.0
    timeout: Duration = 10.0
    body_limit: ByteSize = 16 * 2**20
    concurrency: int = Field(default=64, ge=1, le=10_000)
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


class NvmlConfig(ConfigModel):
    enabled: Literal["auto", "true", "false"] | bool = "auto"
    interval: Duration = 15.0

    @property
    def mode(self) -> str:
        return str(self.enabled).lower()


class ServerAuthConfig(ConfigModel):
    """An optional bearer token for the HTTP API (``bearer_token_file`` or ``bearer_token_env``).

    With a token, mutating requests (POST, PUT, PATCH, DELETE: silences, and any intake endpoint)
    need ``Authorization: Bearer <token>``; ``protect_reads`` extends that to every read except
    ``/healthz`` and ``/readyz``, which stay open for probes.
    """

    bearer_token: SecretStr | None = None
    protect_reads: bool = False

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        return resolve_secret(dict(data), "bearer_token", info) if isinstance(data, dict) else data

    @field_validator("bearer_token")
    @classmethod
    def _not_empty(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and not v.get_secret_value():
            raise ValueError("the bearer token is empty")
        if v is not None and any(c.isspace() or not c.isprintable() for c in v.get_secret_value()):
            raise ValueError("the bearer token must be one line of printable characters without spaces")
        return v


class ServerTLSConfig(ConfigModel):
    """Serve HTTPS from a PEM certificate (chain) and its private key; checked when the config loads."""

    cert_file: str
    key_file: str

    @model_validator(mode="after")
    def _loadable(self) -> ServerTLSConfig:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(self.cert_file, self.key_file)
        except OSError as exc:  # ssl.SSLError is an OSError too
            raise ValueError(f"cannot load the certificate and key ({self.cert_file}, {self.key_file}): "
                             f"{exc.strerror or exc}") from exc
        return self


class ServerConfig(ConfigModel):
    """The HTTP endpoint and its resource limits.

    The limits protect the process, not just the endpoint: every connection holds a file
    descriptor, and the scraper needs ``scrape.concurrency`` of them from the same budget
    (``ulimit -n``, often 1024). A request head must arrive within ``header_timeout`` and a body
    within ``body_timeout``; at ``max_connections`` the oldest connection that is idle or still
    sending its head is closed to make room.
    """

    listen: str = "127.0.0.1:9400"
    max_connections: int = Field(default=256, ge=8, le=100_000)
    header_timeout: Duration = 10.0
    body_timeout: Duration = 30.0
    keepalive_timeout: Duration = 60.0
    body_limit: ByteSize = 2**20
    auth: ServerAuthConfig = ServerAuthConfig()
    tls: ServerTLSConfig | None = None

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        _, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"not host:port: {v!r}")
        return v

    @field_validator("header_timeout", "body_timeout", "keepalive_timeout")
    @classmethod
    def _positive(cls, v: float) -> float:
        if not 0 < v <= 3600:
            raise ValueError("must be positive and at most 1h")
        return v

    @field_validator("body_limit")
    @classmethod
    def _body_limit(cls, v: int) -> int:
        if not 1024 <= v <= 64 * 2**20:
            raise ValueError("must be between 1KiB and 64MiB")
        return v

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])

    @property
    def loopback_only(self) -> bool:
        """True when only this machine can connect (127.0.0.0/8, ::1, ``localhost``)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: it may resolve to anything
            return False

    def warnings(self) -> list[str]:
        """What an operator should hear about this endpoint's exposure (logged at start, in /api/v1/status)."""
        out = []
        if not self.loopback_only and self.auth.bearer_token is None:
            out.append(f"listening on {self.listen} beyond loopback without authentication: anyone who can "
                       "reach it can add and expire silences (set server.auth.bearer_token_file)")
        if not self.loopback_only and self.auth.bearer_token is not None and self.tls is None:
            out.append(f"listening on {self.listen} beyond loopback without TLS: the bearer token travels "
                       "in clear text (set server.tls)")
        return out


def bundled_rules_dir() -> Path:
    """The project's ``rules/`` directory (beside the package in a checkout or editable install)."""
    return Path(__file__).resolve().parents[2] / "rules"


class RulesConfig(ConfigModel):
    """Prometheus rule files (globs allowed) and how to evaluate them. Default: the bundled
    health rules, so an agent with no config still pages on what the guides document.

    After a restart, alert state comes back from the state database (like Prometheus'
    ``ALERTS_FOR_STATE``): firing alerts stay firing; pending alerts resume their ``for``
    with the time already spent, if the agent was down no longer than ``outage_tolerance``.
    """

    files: list[str] = Field(default_factory=lambda: [str(bundled_rules_dir() / "*.rules.yaml")])
    evaluation_interval: Duration = 15.0  # default for groups without their own interval
    external_labels: dict[str, str] = Field(default_factory=dict)
    external_url: str = ""
    outage_tolerance: Duration = 3600.0  # Prometheus' --rules.alert.outage-tolerance

    @field_validator("evaluation_interval")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("evaluation_interval must be positive")
        return v


class StateConfig(ConfigModel):
    path: str = "sre-agent.db"


class StoreConfig(ConfigModel):
    retention: Duration = 3600.0
    keep: list[str] = Field(default_factory=list, description="metric families to store besides the defaults")
    keep_all: bool = False
    # Series that scraped targets may create in all (the agent's own series are not counted against
    # it); beyond it new scraped series are refused, counted in sre_agent_store_refused_series_total
    # and alerted on (SREAgentStoreSeriesLimitReached). 1,000,000: a thousand vLLM servers at about
    # a thousand stored series each (a full V1 payload with keep_all; the default keep-list stores
    # far fewer). About 5 KiB a series with 1h of 15s samples (1 KiB of labels and objects, measured
    # by bench/cardinality.py, plus 16 bytes a sample): ~5 GiB at the cap.
    max_series: int = Field(default=1_000_000, ge=0, description="0 = unlimited")

    @field_validator("retention")
    @classmethod
    def _at_least_an_hour(cls, v: float) -> float:
        if v < 3600:
            raise ValueError("retention must be at least 1h (rules look back up to an hour)")
        return v


class LogConfig(ConfigModel):
    format: Literal["console", "json"] = "console"
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(ConfigModel):
    """Everything the daemon needs; build it with :func:`load_config`."""

    targets: list[TargetConfig] = Field(default_factory=lambda: [TargetConfig(url=DEFAULT_TARGET)])
    file_sd: list[FileSDConfig] = Field(default_factory=list)
    scrape: ScrapeConfig = ScrapeConfig()
    nvml: NvmlConfig = NvmlConfig()
    server: ServerConfig = ServerConfig()
    rules: RulesConfig = RulesConfig()
    state: StateConfig = StateConfig()
    store: StoreConfig = StoreConfig()
    receivers: list[ReceiverConfig] = Field(default_factory=lambda: [ReceiverConfig(name="console",
                                                                                    console=ConsoleReceiverConfig())])
    route: RouteConfig = Field(default_factory=default_route)
    actions: list[ActionConfig] = Field(default_factory=default_actions)
    notify: NotifyConfig = NotifyConfig()
    scaling: ScalingConfig = ScalingConfig()
    diagnostics: DiagnosticsConfig = DiagnosticsConfig()
    log: LogConfig = LogConfig()

    @model_validator(mode="after")
    def _unique_targets(self) -> Config:
        seen: set[str] = set()
        for i, t in enumerate(self.targets):
            if t.url in seen:
                raise ValueError(f"targets[{i}].url: duplicate target {t.url!r}")
            seen.add(t.url)
        names = [r.name for r in self.receivers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"receivers: duplicate name(s) {', '.join(dupes)}")
        if self.route.receiver is None:
            raise ValueError("route.receiver: the root route needs a receiver")
        for path, route in _walk_routes(self.route, "route"):
            if route.receiver is not None and route.receiver not in names:
                raise ValueError(f"{path}.receiver: no receiver named {route.receiver!r} "
                                 f"(receivers: {', '.join(names) or 'none'})")
        services = [s.name for s in self.scaling.services]
        for i, action in enumerate(self.actions):
            if action.service is not None and action.service not in services:
                raise ValueError(f"actions[{i}].service: no scaling service named {action.service!r}")
        return self

    def redacted(self) -> dict[str, Any]:
        """The effective configuration as plain data, secrets shown as ``**********``."""
        return self.model_dump(mode="json", by_alias=True)


def _walk_routes(route: RouteConfig, path: str) -> list[tuple[str, RouteConfig]]:
    out = [(path, route)]
    for i, child in enumerate(route.routes):
        out.extend(_walk_routes(child, f"{path}.routes[{i}]"))
    return out


def load_config(path: str | Path | None, environ: Mapping[str, str] | None = None) -> Config:
    """Read and validate a YAML config file (``None``: the defaults).

    ``environ`` is the environment to resolve ``*_env`` secrets from; the caller
    passes ``os.environ`` — nothing else in the agent reads the environment.
    """
    data: Any = {}
    if path is not None:
        try:
            data = yamlv3.load_file(Path(path)) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        except RecursionError as exc:
            raise ConfigError(f"{path}: not valid YAML: nested too deeply") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of keys (targets, scrape, ...)")
    try:
        return Config.model_validate(data, context={"environ": dict(environ or {})})
    except ValidationError as exc:
        raise ConfigError(_format_errors(exc)) from exc


def _format_errors(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        path = _loc_path(err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key" + _suggest(err["loc"])
        elif err["type"] not in ("value_error", "assertion_error") and "input" in err:
            msg = f"{msg}: {yamlv3.brief(err['input'])}" if not isinstance(err["input"], dict) else msg
        lines.append(f"{path}: {msg}" if path else msg)
    return lines


def _loc_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _suggest(loc: tuple[int | str, ...]) -> str:
    """"(did you mean 'interval'?)" for a misspelt key."""
    model: Any = Config
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part)) if model is not None else None
        ann: Any = field.annotation if field else None
        if getattr(ann, "__origin__", None) is list:
            ann = ann.__args__[0]
        model = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
    if model is None:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
