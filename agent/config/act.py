"""Config sections of the act and diagnose layers: receivers, routes, actions, scaling, diagnostics.

Matching is written the Alertmanager way everywhere (routes, actions, scaling services):
``matchers: ['severity="critical"']`` and/or ``match`` / ``match_re`` maps. Secrets
(Slack token and webhook URL, webhook and scale-request HMAC secrets) come only from
``*_file`` / ``*_env``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from apscheduler.triggers.cron import CronTrigger
from pydantic import AfterValidator, ConfigDict, Field, SecretStr, field_validator, model_validator

from agent.config.types import ConfigModel, Duration, check_url, format_duration
from agent.matchers import AlertMatcher, parse_matchers

__all__ = [
    "CAPACITY_ALERTS",
    "GPU_MEMORY_ALERTS",
    "ActionConfig",
    "AlertmanagerReceiverConfig",
    "ConsoleReceiverConfig",
    "DiagnosticsConfig",
    "NcclDiagnosisConfig",
    "NotifyConfig",
    "OomDiagnosisConfig",
    "ReceiverConfig",
    "RouteConfig",
    "ScaleWebhookConfig",
    "ScalingConfig",
    "ScalingServiceConfig",
    "SignedWebhookConfig",
    "SlackReceiverConfig",
    "WebhookReceiverConfig",
    "default_actions",
    "default_route",
]


def _check_matchers(values: list[str]) -> list[str]:
    for text in values:
        parse_matchers(text)  # Alertmanager's list form too; ValueError names the problem
    return values


class _Matching(ConfigModel):
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
            AlertMatcher(name, "=~", rx)  # Go's regexp syntax, as Alertmanager reads it; ValueError says why
        return v


#: The longest a receiver may take to answer one request. One delivery attempt holds its
#: receiver's queue, so a receiver slower than this is treated as down, not waited for.
MAX_RECEIVER_TIMEOUT_S = 300.0


def _receiver_timeout(v: float) -> float:
    if not 0 < v <= MAX_RECEIVER_TIMEOUT_S:
        raise ValueError(f"must be positive and at most {format_duration(MAX_RECEIVER_TIMEOUT_S)} (one delivery "
                         f"attempt holds its receiver's queue; a receiver slower than that is down): "
                         f"{format_duration(v)}")
    return v


ReceiverTimeout = Annotated[Duration, AfterValidator(_receiver_timeout)]


class ConsoleReceiverConfig(ConfigModel):
    """Readable one-line-per-alert output on stdout (the default receiver)."""


class SlackReceiverConfig(ConfigModel):
    """Slack: a bot token (``chat.postMessage`` + ``chat.update`` in place on resolve) or an
    incoming webhook URL (new message per notification, no updates)."""

    token: SecretStr | None = None  # token_file / token_env: an xoxb- bot token
    webhook_url: SecretStr | None = None  # webhook_url_file / webhook_url_env
    channel: str = ""  # name (#llm-alerts) or ID (C0123); required with a token
    api_url: str = "https://slack.com/api/"
    dashboard_url: str = ""  # the "Dashboard" button; empty hides it
    max_messages_per_second: float = Field(default=1.0, gt=0)  # Slack's documented per-channel limit
    timeout: ReceiverTimeout = 10.0

    SECRETS = ("token", "webhook_url")

    @model_validator(mode="after")
    def _one_mode(self) -> SlackReceiverConfig:
        if (self.token is None) == (self.webhook_url is None):
            raise ValueError("give a bot token (token_file/token_env) or an incoming webhook "
                             "(webhook_url_file/webhook_url_env), exactly one")
        if self.token is not None and not self.channel:
            raise ValueError("channel is required with a bot token")
        check_url(self.api_url)
        return self


class AlertmanagerReceiverConfig(ConfigModel):
    """Alertmanager API v2, with Prometheus' own sending rules. HA: list every
    Alertmanager; each gets every alert (never put a load balancer in between)."""

    urls: list[str] = Field(min_length=1)  # base URLs, e.g. http://alertmanager:9093
    timeout: ReceiverTimeout = 10.0
    resend_delay: Duration = 60.0  # Prometheus' --rules.alert.resend-delay

    @field_validator("urls")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        return [check_url(u) for u in v]


class SignedWebhookConfig(ConfigModel):
    """An HTTP endpoint the agent POSTs signed JSON to (webhook receivers, scale requests)."""

    url: str
    secret: SecretStr | None = None  # secret_file / secret_env: HMAC-SHA256 over timestamp + body
    timeout: ReceiverTimeout = 10.0
    verify_tls: bool = True

    SECRETS = ("secret",)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_url(v)


class WebhookReceiverConfig(SignedWebhookConfig):
    """Alertmanager's version-4 webhook JSON, optionally HMAC-SHA256 signed."""

    max_alerts: int = Field(default=0, ge=0)  # 0 = all, like Alertmanager's webhook_config


#: The receiver kinds, each a field of :class:`ReceiverConfig`.
_RECEIVER_KINDS = ("console", "slack", "alertmanager", "webhook")


class ReceiverConfig(ConfigModel):
    """A named receiver; exactly one of console, slack, alertmanager, webhook."""

    name: str = Field(min_length=1)
    console: ConsoleReceiverConfig | None = None
    slack: SlackReceiverConfig | None = None
    alertmanager: AlertmanagerReceiverConfig | None = None
    webhook: WebhookReceiverConfig | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ReceiverConfig:
        kinds = self._kinds()
        if len(kinds) != 1:
            raise ValueError(f"receiver {self.name!r}: give exactly one of {', '.join(_RECEIVER_KINDS)} "
                             f"(got {', '.join(kinds) or 'none'})")
        return self

    @property
    def kind(self) -> str:
        return self._kinds()[0]

    def _kinds(self) -> list[str]:
        """The receiver kinds this receiver sets (exactly one once validated)."""
        return [k for k in _RECEIVER_KINDS if getattr(self, k) is not None]


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


def default_route() -> RouteConfig:
    # Alertmanager's defaults, except group_wait (30 s) kept and grouping by alertname.
    return RouteConfig.model_validate({"receiver": "console", "group_by": ["alertname"], "group_wait": "30s",
                                       "group_interval": "5m", "repeat_interval": "4h", "send_resolved": True})


class ActionConfig(_Matching):
    """Runs for every alert its matchers select, beside (not instead of) notifications."""

    type: Literal["scale_out", "scale_in", "diagnose"]
    service: str | None = None  # scaling service name; default: the first service whose matchers fit


#: Alert names that get the OOM diagnosis (GPU memory history of the GPU the alert names): the bundled
#: GPUMemoryNearFull, and names that look like GPU memory or OOM alerts other rule sets raise (an
#: Alertmanager posting to the intake: DCGMFramebufferNearFull, GpuMemoryHigh, CUDAOutOfMemory, ...KilledOOM).
#: Go (RE2) and Python read it alike; anchored, as Alertmanager anchors a matcher's regex.
GPU_MEMORY_ALERTS = "GPUMemoryNearFull|.*(OOM|OutOfMemory|GPUMemory|GpuMemory|Framebuffer|FrameBuffer).*"
#: The bundled KV-saturation and scale-out alerts: their diagnosis is the live capacity advice
#: (agent.diagnose.plan.fleet.CAPACITY_ALERTS, the same names).
CAPACITY_ALERTS = "VLLMKVCacheSaturated|VLLMScaleOutNeeded|VLLMQueueingWithKVCacheHeadroom|VLLMPreemptionsSustained"


def default_actions() -> list[ActionConfig]:
    # The bundled rules label scale-out alerts `action: scale_out`; GPU memory (and OOM-looking)
    # throughput and KV-capacity alerts get their diagnosis.
    return [
        ActionConfig(type="scale_out", matchers=['action="scale_out"']),
        ActionConfig(type="diagnose",
                     matchers=[f'alertname=~"{GPU_MEMORY_ALERTS}|VLLMGenerationThroughputLow|{CAPACITY_ALERTS}"']),
    ]


class NotifyConfig(ConfigModel):
    """Outbox delivery: exponential backoff with equal jitter — after the n-th failed attempt
    wait between half and all of min(retry_max, retry_initial × 2^(n-1)), or the receiver's
    Retry-After if longer; an item older than give_up_after is dropped and recorded as failed."""

    retry_initial: Duration = 1.0
    retry_max: Duration = 300.0
    give_up_after: Duration = 24 * 3600.0
    dispatch_interval: Duration = 1.0


class ScaleWebhookConfig(SignedWebhookConfig):
    """Where scale requests go (the simulator's ``POST /scale`` is one)."""


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


class ScalingConfig(ConfigModel):
    dry_run: bool = False  # global switch; each service has its own too
    services: list[ScalingServiceConfig] = Field(default_factory=list)


class OomDiagnosisConfig(ConfigModel):
    enabled: bool = True
    log_files: list[str] = Field(default_factory=list)  # tailed for OOM lines (vLLM logs, dmesg dumps)
    gpu_memory_near_full: float = Field(default=0.95, gt=0, le=1)  # before a target went down


class NcclDiagnosisConfig(ConfigModel):
    enabled: bool = False
    binary: str = "all_reduce_perf"
    launcher: list[str] = Field(default_factory=list)  # e.g. [mpirun, -np, "2", -H, "a,b"]
    args: list[str] = Field(default_factory=lambda: ["-b", "8", "-e", "8G", "-f", "2"])
    gpus: int = Field(default=0, ge=0)  # -g; 0 = every visible GPU
    timeout: Duration = 900.0
    schedule: str = ""  # cron expression (5 fields), e.g. "0 3 * * *"; empty: only on alerts
    on_alerts: list[str] = Field(default_factory=lambda: ["VLLMGenerationThroughputLow"])
    cooldown: Duration = 3600.0
    # a key of the expected-bandwidth table (checked at start-up by
    # agent.diagnose.nccl.interconnects.check_configured); empty: guess from GPU count
    interconnect: str = ""
    # overrides the table; finite and > 0: a NaN would make every ratio NaN and judge any run "low"
    expected_gbps: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @field_validator("schedule")
    @classmethod
    def _cron(cls, v: str) -> str:
        if v:
            try:
                CronTrigger.from_crontab(v)
            except ValueError as exc:
                raise ValueError(f"not a cron expression (5 fields, e.g. '0 3 * * *'): {v!r} ({exc})") from exc
        return v


class DiagnosticsConfig(ConfigModel):
    runbook_base_url: str = "https://github.com/sre-agent/sre-agent/blob/main/runbooks/"
    oom: OomDiagnosisConfig = OomDiagnosisConfig()
    nccl: NcclDiagnosisConfig = NcclDiagnosisConfig()
