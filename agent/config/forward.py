"""``forward:``: a node agent sends its findings to the central agent's intake API.

A node agent (the Kubernetes DaemonSet) sees what only the node can see (NVML, nccl-tests, OOM
lines in the pod logs); the central agent holds the fleet's alerts and incidents. With ``forward``
set, every finding the node agent records is also queued, through the same SQLite outbox as every
notification, for ``POST <url>/api/v1/findings`` on the central agent, with the bearer token of the
central agent's ``server.auth``. The outbox's retry policy (``notify``) applies: a central outage
delays findings, it loses none.

``labels`` (and ``labels_env``, label name -> environment variable, e.g. ``node: NODE_NAME`` from
the Kubernetes downward API) name this node in every forwarded finding, so the central agent can
attach it to the alert about the same node, instance or GPU (:mod:`agent.act.finding_intake`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from agent.config.types import ConfigModel, Duration, check_url

__all__ = ["FORWARD_PATH", "ForwardConfig"]

#: The central agent's intake path, appended to ``forward.url``.
FORWARD_PATH = "/api/v1/findings"
_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"


class ForwardConfig(ConfigModel):
    """Where findings go: the central agent's base URL, its API token, a per-request timeout."""

    url: str  # the central agent, e.g. http://sre-agent.monitoring:9400
    token: SecretStr | None = None  # token_file / token_env: the central agent's server.auth token
    timeout: Duration = Field(default=10.0, gt=0, le=300)
    verify_tls: bool = True
    labels: dict[str, str] = Field(default_factory=dict)
    labels_env: dict[str, str] = Field(default_factory=dict)  # label -> environment variable

    SECRETS = ("token",)

    @model_validator(mode="before")
    @classmethod
    def _labels_from_env(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict) or not data.get("labels_env"):
            return data
        names = data["labels_env"]
        if not isinstance(names, dict):
            return data  # the field's own validation says what is wrong
        environ: Mapping[str, str] = (info.context or {}).get("environ", {})
        labels = dict(data.get("labels") or {})
        for label, var in names.items():
            if not isinstance(var, str) or var not in environ:
                raise ValueError(f"labels_env.{label}: environment variable {var!r} is not set")
            if label in labels:
                raise ValueError(f"labels_env.{label}: also given in labels; give it once")
            labels[label] = environ[var]
        return {**data, "labels": labels}

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        check_url(v)
        if "?" in v or "#" in v:
            raise ValueError(f"give the central agent's base URL, without a query: {v!r}")
        return v.rstrip("/")

    @field_validator("labels")
    @classmethod
    def _label_names(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not re.fullmatch(_LABEL_NAME, name):  # fullmatch: "$" passes "a\n"
                raise ValueError(f"{name!r} is not a Prometheus label name")
            if not value:
                raise ValueError(f"{name}: empty value")
        return v

    @property
    def endpoint(self) -> str:
        return self.url + FORWARD_PATH
