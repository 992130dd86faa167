"""``ha:``: two central agents with the same config, one outcome (docs/ha.md).

Two replicas evaluate the same rules over the same TSDB and both send every alert to every
Alertmanager (which de-duplicates, as it does for a Prometheus HA pair). What Alertmanager
cannot de-duplicate — the receivers the agent serves itself, Slack and webhooks — needs one
sender, and ``mode`` says how that one is chosen:

* ``none``: one agent, nothing to coordinate (the default).
* ``kubernetes``: a coordination.k8s.io Lease decides the leader; only the leader sends to
  direct receivers, every replica still sends to Alertmanager and asks for scale actions
  (their idempotency keys are deterministic, so a de-duplicating scaler acts once).
* ``alertmanager_only``: the alternative that needs no new service outside Kubernetes: both
  replicas send only to Alertmanager receivers, and a direct receiver is a config error.

The replica's identity and its ``replica`` label value can come from the environment (a pod name
through the downward API): ``identity_env``, ``replica_env``, ``namespace_env`` are read here, in the
config loader, like ``scrape.shards.index_env``; without them the identity is the host name (a pod's
name in Kubernetes) and the replica value is the identity.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationInfo, field_validator, model_validator

from agent.config.types import ConfigModel, Duration, format_duration, from_env

__all__ = ["HaConfig", "LeaseConfig", "direct_receivers_refused"]

_LABEL_NAME_RE = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")  # a Lease's name and namespace
#: The kubernetes client's leader election refuses (``sys.exit``) anything below this jitter.
JITTER_FACTOR = 1.2


class LeaseConfig(ConfigModel):
    """The Lease both replicas contend for, with client-go's default timings (15 s / 10 s / 2 s).

    Whole seconds: the Lease stores ``leaseDurationSeconds`` as an integer and the client's
    elector sleeps ``retry_period``. ``kubeconfig``: a kubeconfig file; without it the in-cluster
    service account is used."""

    name: str = "sre-agent"
    namespace: str = "default"
    namespace_env: str | None = None
    kubeconfig: str | None = None
    lease_duration: Duration = 15.0
    renew_deadline: Duration = 10.0
    retry_period: Duration = 2.0

    @model_validator(mode="before")
    @classmethod
    def _env(cls, data: Any, info: ValidationInfo) -> Any:
        return from_env(data, info, "namespace")

    @field_validator("name", "namespace")
    @classmethod
    def _dns(cls, v: str) -> str:
        if not _DNS_SUBDOMAIN.match(v):
            raise ValueError(f"{v!r} is not a Kubernetes object name (lower-case DNS subdomain)")
        return v

    @field_validator("kubeconfig")
    @classmethod
    def _readable(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).is_file():
            raise ValueError(f"kubeconfig: no such file {v!r}")
        return v

    @model_validator(mode="after")
    def _timings(self) -> LeaseConfig:
        for name in ("lease_duration", "renew_deadline", "retry_period"):
            v = getattr(self, name)
            if v < 1 or v != int(v):
                raise ValueError(f"{name}: whole seconds, at least 1s (got {format_duration(v)})")
        if self.lease_duration <= self.renew_deadline:
            raise ValueError("lease_duration must be longer than renew_deadline (a leader that cannot renew "
                             "must stop before another replica may take the lease)")
        if self.renew_deadline <= JITTER_FACTOR * self.retry_period:
            raise ValueError(f"renew_deadline must be longer than {JITTER_FACTOR} x retry_period "
                             "(the kubernetes client's own rule)")
        return self


class HaConfig(ConfigModel):
    """See the module docstring. ``replica_label``/``replica``: the label that tells the two replicas'
    remote-written series apart (Prometheus' HA-pair convention); never put on alerts.
    ``watermark_margin``: how far apart the two replicas' notifications for the same alert may be
    created (default: the longest rule-group interval + ``notify.dispatch_interval``, see docs/ha.md)."""

    mode: Literal["none", "kubernetes", "alertmanager_only"] = "none"
    identity: str | None = None
    identity_env: str | None = None
    replica_label: str = "replica"
    replica: str | None = None
    replica_env: str | None = None
    lease: LeaseConfig = LeaseConfig()
    watermark_margin: Duration | None = None

    @model_validator(mode="before")
    @classmethod
    def _env(cls, data: Any, info: ValidationInfo) -> Any:
        return from_env(from_env(data, info, "identity"), info, "replica")

    @field_validator("replica_label")
    @classmethod
    def _label(cls, v: str) -> str:
        if v == "":  # no replica label: both replicas write identical series (see replica_labels)
            return v
        if not _LABEL_NAME_RE.fullmatch(v) or v.startswith("__"):  # fullmatch: "$" passes "a\n"
            raise ValueError(f"invalid label name {v!r}")
        return v

    @model_validator(mode="after")
    def _defaults(self) -> HaConfig:
        if self.identity is None:  # frozen model: fill in the defaults once, here
            object.__setattr__(self, "identity", socket.gethostname())
        if self.replica is None:
            object.__setattr__(self, "replica", self.identity)
        if not self.identity:
            raise ValueError("identity: empty")
        return self

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    def replica_labels(self) -> dict[str, str]:
        """The label remote-written series carry in HA (nothing without HA, or with ``replica_label: ""``).
        Without one, the two replicas write identical series: evaluated on the same grid
        (agent.rules.timing), so with the same timestamps and values, which a TSDB stores once. That
        is what a pair writing its recording rules back needs: with a replica label every recorded
        series would exist twice, and rules that read them would sum both or fail to match."""
        return {self.replica_label: str(self.replica)} if self.enabled and self.replica_label else {}

    def margin_s(self, longest_interval_s: float, dispatch_interval_s: float) -> float:
        if self.watermark_margin is not None:
            return self.watermark_margin
        return longest_interval_s + dispatch_interval_s


def direct_receivers_refused(mode: str, receivers: list[tuple[str, str]]) -> str | None:
    """The message for ``alertmanager_only`` with a direct receiver, else None."""
    if mode != "alertmanager_only":
        return None
    direct = [f"{name} ({kind})" for name, kind in receivers if kind in ("slack", "webhook")]
    if not direct:
        return None
    return (f"ha.mode alertmanager_only: receiver(s) {', '.join(direct)} are sent by the agent itself, so two "
            "replicas would each send them (a duplicate per notification) and nothing elects one sender outside "
            "Kubernetes; send them through Alertmanager (an alertmanager receiver, with Slack or the webhook "
            "configured in Alertmanager, which de-duplicates), or use ha.mode kubernetes (a Lease elects the "
            "one replica that sends them)")

