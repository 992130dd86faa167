"""A diagnosis result, the shape every diagnostic returns and every consumer reads.

A finding says what is wrong (``kind``, ``summary``), why we think so (``evidence``:
the matched log lines or the measured numbers), what to change (``setting`` and
``suggested_value``, e.g. ``--gpu-memory-utilization`` → ``0.85``) and where the
runbook is. ``severity`` uses the rules' scale: ``critical``, ``warning``, ``info``;
a healthy check returns a finding with ``ok=True`` so the CLI can still print it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["DEFAULT_RUNBOOK_BASE", "Finding", "runbook_url"]

DEFAULT_RUNBOOK_BASE = "https://github.com/sre-agent/sre-agent/blob/main/runbooks/"


def runbook_url(name: str, base: str = DEFAULT_RUNBOOK_BASE) -> str:
    """``runbooks/<name>.md`` under ``base`` (``diagnosis-oom-kv-cache`` or an alert name)."""
    return f"{base.rstrip('/')}/{name}.md"


@dataclass(frozen=True)
class Finding:
    kind: str  # e.g. "gpu-oom-runtime", "nccl-bandwidth-low"; runbook is diagnosis-<kind>.md
    summary: str  # one sentence for a human
    severity: str = "warning"
    ok: bool = False
    evidence: list[str] = field(default_factory=list)
    setting: str = ""  # the flag to change, e.g. "--max-model-len"
    suggested_value: str = ""  # a concrete value, e.g. "16384"
    details: dict[str, Any] = field(default_factory=dict)  # numbers behind the verdict
    runbook_url: str = ""
    labels: dict[str, str] = field(default_factory=dict)  # target/instance/gpu it is about

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Finding:
        return cls(**data)
