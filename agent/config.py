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
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from apscheduler.triggers.cron import CronTrigger
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agent import yamlcompat
from agent.errors import ConfigError
from agent.matchers import Matcher, parse_matchers

__all__ = [
    "ActionConfig",
    "AlertmanagerReceiverConfig",
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
    "ServerConfig",
    "SlackReceiverConfig",
    "StoreConfig",
    "TargetConfig",
    "WebhookReceiverConfig",
    "bundled_rules_dir",
    "format_duration",
    "load_config",
    "parse_duration",
    "parse_size",
]

DEFAULT_TARGET = "http://127.0.0.1:8000/metrics"  # vLLM's default port (vllm serve --port 8000)

_DURATION_RE = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_DURATION_UNITS = (365 * 86400, 7 * 86400, 86400, 3600, 60, 1, 0.001)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}
_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def parse_duration(text: object) -> float:
    """Prometheus duration string -> seconds. ``0`` alone is accepted."""
    if isinstance(text, bool) or not isinstance(text, str):
        raise ValueError(f"a duration needs a unit, like '15s' or '5m' (got {text!r})")
    if text == "0":
        return 0.0
    m = _DURATION_RE.match(text.strip())
    if not text.strip() or m is None or not any(m.groups()):
        raise ValueError(f"not a duration: {text!r} (use Prometheus units: 100ms, 15s, 5m, 1h, 1d)")
    return float(sum(int(g) * u for g, u in zip(m.groups(), _DURATION_UNITS, strict=True) if g))


def format_duration(seconds: float) -> str:
    """Seconds -> the shortest Prometheus duration string (``90`` -> ``1m30s``)."""
    ms = round(seconds * 1000)
    if ms == 0:
        return "0s"
    out = []
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000), ("ms", 1)):
        n, ms = divmod(ms, size)
        if n:
            out.append(f"{n}{unit}")
    return "".join(out)


def parse_size(value: object) -> int:
    """``16MiB`` / ``1GB`` / ``1048576`` -> bytes."""
    if isinstance(value, bool):
        raise ValueError(f"not a size: {value!r}")
    if isinstance(value, int):
        return value
    m = _SIZE_RE.match(str(value))
    if m is None:
        raise ValueError(f"not a size: {value!r} (use e.g. 16MiB, 512KiB, 1GB or bytes)")
    return int(float(m.group(1)) * _SIZE_UNITS[(m.group(2) or "B").upper()])


Duration = Annotated[
    float, BeforeValidator(parse_duration), PlainSerializer(format_duration, when_used="json")
]
ByteSize = Annotated[int, BeforeValidator(parse_size)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _resolve_secret(values: dict[str, Any], field: str, info: ValidationInfo) -> dict[str, Any]:
    """Turn ``<field>_file`` / ``<field>_env`` into ``<field>`` (a SecretStr)."""
    if field in values and values[field] is not None and not isinstance(values[field], SecretStr):
        raise ValueError(
            f"{field}: secrets are not accepted inline; use {field}_file (a file path) or {field}_env "
            "(an environment variable name)"
        )
    path, env_name = values.pop(f"{field}_file", None), values.pop(f"{field}_env", None)
    if path is not None and env_name is not None:
        raise ValueError(f"{field}: give {field}_file or {field}_env, not both")
    if path is not None:
        try:
            values[field] = SecretStr(Path(path).read_text(encoding="utf-8").strip())
        except OSError as exc:
            raise ValueError(f"{field}_file: cannot read {path!r}: {exc.strerror}") from exc
    elif env_name is not None:
        environ: Mapping[str, str] = (info.context or {}).get("environ", {})
        if env_name not in environ:
            raise ValueError(f"{field}_env: environment variable {env_name!r} is not set")
        values[field] = SecretStr(environ[env_name])
    return values


class TargetConfig(_Model):
    """One static scrape target: a vLLM or LMDeploy ``/metrics`` URL."""

    url: str
    job: str = "vllm"
    labels: dict[str, str] = Field(default_factory=dict)
    bearer_token: SecretStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        return _resolve_secret(dict(data), "bearer_token", info) if isinstance(data, dict) else data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not a URL: {v!r} (expected http://host:port/metrics)")
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise ValueError(f"not a URL: {v!r} (bad port)") from exc
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for name in v:
            if not _LABEL_NAME_RE.match(name) or name.startswith("__"):
                raise ValueError(f"invalid label name {name!r}")
        return v


class FileSDConfig(_Model):
    """Prometheus ``file_sd`` files (JSON or YAML lists of ``{targets, labels}``)."""

    files: list[str] = Field(min_length=1)
    job: str = "vllm"
    refresh_interval: Duration = 300.0


class ScrapeConfig(_Model):
    interval: Duration = 15.0
    timeout: Duration = 10.0
    body_limit: ByteSize = 16 * 2**20
    concurrency: int = Field(default=64, ge=1, le=10_000)
    sample_limit: int = Field(default=0, ge=0, description="0 = unlimited; above it the scrape fails")

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


class NvmlConfig(_Model):
    enabled: Literal["auto", "true", "false"] | bool = "auto"
    interval: Duration = 15.0

    @property
    def mode(self) -> str:
        return str(self.enabled).lower()


class ServerConfig(_Model):
    listen: str = "127.0.0.1:9400"

    @field_validator("listen")
    @classmethod
    def _listen(cls, v: str) -> str:
        _, sep, port = v.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"not host:port: {v!r}")
        return v

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


def bundled_rules_dir() -> Path:
    """The project's ``rules/`` directory (beside the package in a checkout or editable install)."""
    return Path(__file__).resolve().parent.parent / "rules"


class RulesConfig(_Model):
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


class StateConfig(_Model):
    path: str = "sre-agent.db"


class StoreConfig(_Model):
    retention: Duration = 3600.0
    keep: list[str] = Field(default_factory=list, description="metric families to store besides the defaults")
    keep_all: bool = False

    @field_validator("retention")
    @classmethod
    def _at_least_an_hour(cls, v: float) -> float:
        if v < 3600:
            raise ValueError("retention must be at least 1h (rules look back up to an hour)")
        return v


def _url_check(v: str) -> str:
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {v!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as exc:
        raise ValueError(f"not a URL: {v!r} (bad port)") from exc
    return v


def _check_matchers(values: list[str]) -> list[str]:
    for text in values:
        parse_matchers(text)  # Alertmanager's list form too; ValueError names the problem
    return values


class _Matching(_Model):
    """Alert-label matching shared by routes, actions and scaling services, written the
    Alertmanager way: ``matchers: ['severity="critical"', 'alertname=~"VLLM.*"']`` and/or
    the older ``match: {label: value}`` / ``match_re: {label: regex}``. All must hold."""

    matchers: list[str] = Field(default_factory=list)
    match: dict[str, str] = Field(default_factory=dict)
    match_re: dict[str, str] = Field(default_factory=dict)

    @field_validator("matchers")
    @classmethod
    def _matchers(cls, v: list[str]) -> list[str]:
        return _check_matchers(v)

    @field_validator("match_re")
    @classmethod
    def _regexes(cls, v: dict[str, str]) -> dict[str, str]:
        for name, rx in v.items():
            Matcher(name, "=~", rx)  # Go's regexp syntax, as Alertmanager reads it; ValueError says why
        return v


class ConsoleReceiverConfig(_Model):
    """Readable one-line-per-alert output on stdout (the default receiver)."""


class SlackReceiverConfig(_Model):
    """Slack: a bot token (``chat.postMessage`` + ``chat.update`` in place on resolve) or an
    incoming webhook URL (new message per notification, no updates)."""

    token: SecretStr | None = None  # token_file / token_env: an xoxb- bot token
    webhook_url: SecretStr | None = None  # webhook_url_file / webhook_url_env
    channel: str = ""  # name (#llm-alerts) or ID (C0123); required with a token
    api_url: str = "https://slack.com/api/"
    dashboard_url: str = ""  # the "Dashboard" button; empty hides it
    max_messages_per_second: float = Field(default=1.0, gt=0)  # Slack's documented per-channel limit
    timeout: Duration = 10.0

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        data = _resolve_secret(dict(data), "token", info)
        return _resolve_secret(data, "webhook_url", info)

    @model_validator(mode="after")
    def _one_mode(self) -> SlackReceiverConfig:
        if (self.token is None) == (self.webhook_url is None):
            raise ValueError("give a bot token (token_file/token_env) or an incoming webhook "
                             "(webhook_url_file/webhook_url_env), exactly one")
        if self.token is not None and not self.channel:
            raise ValueError("channel is required with a bot token")
        _url_check(self.api_url)
        return self


class AlertmanagerReceiverConfig(_Model):
    """Alertmanager API v2, with Prometheus' own sending rules. HA: list every
    Alertmanager; each gets every alert (never put a load balancer in between)."""

    urls: list[str] = Field(min_length=1)  # base URLs, e.g. http://alertmanager:9093
    timeout: Duration = 10.0
    resend_delay: Duration = 60.0  # Prometheus' --rules.alert.resend-delay

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        return [_url_check(u) for u in v]


class WebhookReceiverConfig(_Model):
    """Alertmanager's version-4 webhook JSON, optionally HMAC-SHA256 signed."""

    url: str
    secret: SecretStr | None = None  # secret_file / secret_env: signs timestamp + body
    timeout: Duration = 10.0
    verify_tls: bool = True
    max_alerts: int = Field(default=0, ge=0)  # 0 = all, like Alertmanager's webhook_config

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        return _resolve_secret(dict(data), "secret", info) if isinstance(data, dict) else data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _url_check(v)


class ReceiverConfig(_Model):
    """A named receiver; exactly one of console, slack, alertmanager, webhook."""

    name: str = Field(min_length=1)
    console: ConsoleReceiverConfig | None = None
    slack: SlackReceiverConfig | None = None
    alertmanager: AlertmanagerReceiverConfig | None = None
    webhook: WebhookReceiverConfig | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ReceiverConfig:
        kinds = [k for k in ("console", "slack", "alertmanager", "webhook") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"receiver {self.name!r}: give exactly one of console, slack, alertmanager, "
                             f"webhook (got {', '.join(kinds) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in ("console", "slack", "alertmanager", "webhook") if getattr(self, k) is not None)


class RouteConfig(_Matching):
    """A node of the route tree, as in Alertmanager: children inherit what they do not set.
    ``group_by: ['...']`` groups by all labels."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    receiver: str | None = None
    group_by: list[str] | None = None
    group_wait: Duration | None = None
    group_interval: Duration | None = None
    repeat_interval: Duration | None = None
    send_resolved: bool | None = None
    continue_: bool = Field(default=False, alias="continue")
    routes: list[RouteConfig] = Field(default_factory=list)


def _default_route() -> RouteConfig:
    # Alertmanager's defaults, except group_wait (30 s) kept and grouping by alertname.
    return RouteConfig.model_validate({"receiver": "console", "group_by": ["alertname"], "group_wait": "30s",
                                       "group_interval": "5m", "repeat_interval": "4h", "send_resolved": True})


class ActionConfig(_Matching):
    """Runs for every alert its matchers select, beside (not instead of) notifications."""

    type: Literal["scale_out", "scale_in", "diagnose"]
    service: str | None = None  # scaling service name; default: the first service whose matchers fit


def _default_actions() -> list[ActionConfig]:
    # The bundled rules label scale-out alerts `action: scale_out`; GPU memory and
    # throughput alerts get their diagnosis.
    return [
        ActionConfig(type="scale_out", matchers=['action="scale_out"']),
        ActionConfig(type="diagnose", matchers=['alertname=~"GPUMemoryNearFull|VLLMGenerationThroughputLow"']),
    ]


class NotifyConfig(_Model):
    """Outbox delivery: exponential backoff with equal jitter — after the n-th failed attempt
    wait between half and all of min(retry_max, retry_initial × 2^(n-1)), or the receiver's
    Retry-After if longer; an item older than give_up_after is dropped and recorded as failed."""

    retry_initial: Duration = 1.0
    retry_max: Duration = 300.0
    give_up_after: Duration = 24 * 3600.0
    dispatch_interval: Duration = 1.0


class ScaleWebhookConfig(_Model):
    url: str
    secret: SecretStr | None = None  # secret_file / secret_env
    timeout: Duration = 10.0
    verify_tls: bool = True

    @model_validator(mode="before")
    @classmethod
    def _secrets(cls, data: Any, info: ValidationInfo) -> Any:
        return _resolve_secret(dict(data), "secret", info) if isinstance(data, dict) else data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _url_check(v)


class ScalingServiceConfig(_Matching):
    """One scalable service. Its matchers pick the alerts that belong to it (default: all).
    Bounds follow the guide's HPA example (2-8 replicas); scale-in waits until the
    service has been healthy for ``scale_in_healthy_for`` and is slower than scale-out."""

    name: str = Field(min_length=1)
    webhook: ScaleWebhookConfig | None = None  # None: only export sre_agent_desired_replicas
    min_replicas: int = Field(default=2, ge=0)
    max_replicas: int = Field(default=8, ge=1)
    initial_replicas: int | None = None  # until the receiver reports; default min_replicas
    step: int = Field(default=1, ge=1)
    scale_out_cooldown: Duration = 180.0  # a new vLLM replica needs minutes to load weights
    scale_in_cooldown: Duration = 600.0
    scale_in_healthy_for: Duration = 900.0
    dry_run: bool = False

    @model_validator(mode="after")
    def _bounds(self) -> ScalingServiceConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) > max_replicas ({self.max_replicas})")
        init = self.initial_replicas
        if init is not None and not self.min_replicas <= init <= self.max_replicas:
            raise ValueError(f"initial_replicas ({init}) outside [{self.min_replicas}, {self.max_replicas}]")
        return self


class ScalingConfig(_Model):
    dry_run: bool = False  # global switch; each service has its own too
    services: list[ScalingServiceConfig] = Field(default_factory=list)


class OomDiagnosisConfig(_Model):
    enabled: bool = True
    log_files: list[str] = Field(default_factory=list)  # tailed for OOM lines (vLLM logs, dmesg dumps)
    gpu_memory_near_full: float = Field(default=0.95, gt=0, le=1)  # before a target went down


class NcclDiagnosisConfig(_Model):
    enabled: bool = False
    binary: str = "all_reduce_perf"
    launcher: list[str] = Field(default_factory=list)  # e.g. [mpirun, -np, "2", -H, "a,b"]
    args: list[str] = Field(default_factory=lambda: ["-b", "8", "-e", "8G", "-f", "2"])
    gpus: int = Field(default=0, ge=0)  # -g; 0 = every visible GPU
    timeout: Duration = 900.0
    schedule: str = ""  # cron expression (5 fields), e.g. "0 3 * * *"; empty: only on alerts
    on_alerts: list[str] = Field(default_factory=lambda: ["VLLMGenerationThroughputLow"])
    cooldown: Duration = 3600.0
    interconnect: str = ""  # a key of the expected-bandwidth table; empty: guess from GPU count
    expected_gbps: float | None = None  # overrides the table

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        if v:
            try:
                CronTrigger.from_crontab(v)
            except ValueError as exc:
                raise ValueError(f"not a cron expression (5 fields, e.g. '0 3 * * *'): {v!r} ({exc})") from exc
        return v


class DiagnosticsConfig(_Model):
    runbook_base_url: str = "https://github.com/sre-agent/sre-agent/blob/main/runbooks/"
    oom: OomDiagnosisConfig = OomDiagnosisConfig()
    nccl: NcclDiagnosisConfig = NcclDiagnosisConfig()


class LogConfig(_Model):
    format: Literal["console", "json"] = "console"
    level: Literal["debug", "info", "warning", "error"] = "info"


class Config(_Model):
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
    route: RouteConfig = Field(default_factory=_default_route)
    actions: list[ActionConfig] = Field(default_factory=_default_actions)
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
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc.strerror}") from exc
        try:
            data = yamlcompat.load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
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
            msg = f"{msg}: {err['input']!r}" if not isinstance(err["input"], dict) else msg
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
