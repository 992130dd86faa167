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
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agent.config.act import (
    CAPACITY_ALERTS,
    GPU_MEMORY_ALERTS,
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
from agent.config.collect import BasicAuthConfig, FileSDConfig, ScrapeConfig, TargetConfig, check_target_url
from agent.config.forward import ForwardConfig
from agent.config.ha import HaConfig, LeaseConfig, direct_receivers_refused
from agent.config.remote_write import RemoteWriteConfig, RemoteWriteQueueConfig
from agent.config.server import ServerAuthConfig, ServerConfig, ServerTLSConfig
from agent.config.source import SourceConfig, SourceTLSConfig
from agent.config.types import (
    ConfigModel,
    Duration,
    format_duration,
    from_env,
    parse_duration,
    parse_size,
)
from agent.errors import ConfigError
from agent.gocompat import yamlv3

__all__ = [
    "CAPACITY_ALERTS",
    "GPU_MEMORY_ALERTS",
    "ActionConfig",
    "AlertmanagerReceiverConfig",
    "BasicAuthConfig",
    "Config",
    "ConsoleReceiverConfig",
    "DiagnosticsConfig",
    "FileSDConfig",
    "ForwardConfig",
    "HaConfig",
    "LeaseConfig",
    "NcclDiagnosisConfig",
    "NotifyConfig",
    "NvmlConfig",
    "OomDiagnosisConfig",
    "ReceiverConfig",
    "RemoteWriteConfig",
    "RemoteWriteQueueConfig",
    "RouteConfig",
    "ScaleWebhookConfig",
    "ScalingConfig",
    "ScalingServiceConfig",
    "ScrapeConfig",
    "ServerAuthConfig",
    "ServerConfig",
    "ServerTLSConfig",
    "SlackReceiverConfig",
    "SourceConfig",
    "SourceTLSConfig",
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

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
DEFAULT_TARGET = "http://127.0.0.1:8000/metrics"  # vLLM's default port (vllm serve --port 8000)


class NvmlConfig(ConfigModel):
    """The GPU poller. ``hostname`` (or ``hostname_env``, e.g. ``NODE_NAME`` from the Kubernetes downward
    API: a pod's own hostname is the pod's name) is the ``Hostname`` label of its series; default: the
    machine's hostname. A node agent names its node the same way in ``forward.labels``, so the central
    agent joins its findings to the GPU alerts of that node."""

    enabled: Literal["auto", "true", "false"] | bool = "auto"
    interval: Duration = 15.0
    hostname: str | None = None
    hostname_env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _hostname_from_env(cls, data: Any, info: ValidationInfo) -> Any:
        return from_env(data, info, "hostname")

    @property
    def mode(self) -> str:
        return str(self.enabled).lower()


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
    # Mixin parameters for many clusters in one TSDB (Prometheus mode): a selector added to every
    # series selector of every rule (cluster="a") and labels added to every aggregation and on(...)
    # (cluster, namespace). The same as `sre-agent rules export --selector ... --by ...`.
    selector: str = ""
    by: list[str] = Field(default_factory=list)

    @field_validator("by")
    @classmethod
    def _label_names(cls, v: list[str]) -> list[str]:
        bad = [name for name in v if not _LABEL_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"not label names: {', '.join(map(repr, bad))}")
        return v

    @field_validator("evaluation_interval")
    @classmethod
    def _positive(cls, v: float) -> float:
        if v <= 0:
            raise ValueError("evaluation_interval must be positive")
        return v


class StateConfig(ConfigModel):
    """The SQLite state database. ``keep``: how long resolved incidents, given-up notifications,
    expired silences and resolved Alertmanager-intake alerts stay (pruned hourly; pending work never is)."""

    path: str = "sre-agent.db"
    keep: Duration = 30 * 86400.0

    @field_validator("keep")
    @classmethod
    def _at_least_a_day(cls, v: float) -> float:
        if v < 86400:
            raise ValueError("keep must be at least 1d (delivered notification keys are kept a day regardless)")
        return v


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
    source: SourceConfig = SourceConfig()
    remote_write: list[RemoteWriteConfig] = Field(default_factory=list)
    forward: ForwardConfig | None = None  # node agents: findings to the central agent's intake
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
    ha: HaConfig = Field(default_factory=HaConfig)  # a factory: the default identity is looked up at load, not import

    @model_validator(mode="before")
    @classmethod
    def _no_default_target_remotely(cls, data: Any) -> Any:
        """With a remote source the server scrapes: no default target unless ``targets`` is given."""
        if isinstance(data, dict) and "targets" not in data:
            source = data.get("source")
            if isinstance(source, dict) and source.get("type") == "prometheus":
                return {**data, "targets": []}
        return data

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
        queues: set[str] = set()
        for i, rw in enumerate(self.remote_write):
            if rw.queue_name in queues:
                raise ValueError(f"remote_write[{i}]: a second entry for {rw.queue_name!r}; give each a distinct name")
            queues.add(rw.queue_name)
            if "scraped" in rw.write and self.source.remote:
                raise ValueError(f"remote_write[{i}].write: 'scraped' is for embedded mode (with source.type "
                                 "prometheus the server scrapes; the agent stores no scraped samples)")
        refused = direct_receivers_refused(self.ha.mode, [(r.name, r.kind) for r in self.receivers])
        if refused is not None:
            raise ValueError(refused)
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
