"""Prometheus mode: where the bundled recording rules run, decided once the server answers.

The bundled alerts read recording rules (``job_model:vllm_num_requests_waiting:sum``, …). A
remote server must hold their results, which happens one of two ways (issue 12, section 3):

* **server**: the rule files are loaded into the server (``sre-agent rules export``, the
  PrometheusRule); the agent evaluates only the alerting rules;
* **agent**: the agent evaluates the recording rules through the server and ``remote_write``
  sends the results back.

``source.recording_rules: auto`` asks the server's rules API which recording rules it runs:
all of ours → server; otherwise the agent evaluates them, and when nothing writes them back
the start-up log names each missing rule's file, since the alerts that read them cannot fire.
"""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from agent.config.source import SourceConfig
from agent.errors import SourceError
from agent.promql.remote import RemoteSource
from agent.rules.manager import Group

__all__ = ["RecordingPlacement", "missing_by_file"]

log = structlog.get_logger(__name__)


def missing_by_file(groups: Iterable[Group], loaded: set[str]) -> dict[str, list[str]]:
    """Our recording rules the server does not run, by the rule file that defines them."""
    out: dict[str, list[str]] = {}
    for g in groups:
        for r in g.rules:
            if r.spec.kind == "record" and r.spec.name not in loaded:
                out.setdefault(g.spec.file, []).append(r.spec.name)
    return out


class RecordingPlacement:
    """Whether the server runs our recording rules (``server_runs_them``), checked once it answers.

    ``server`` and ``agent`` fix the answer (``server`` still checks, to name missing rules);
    ``auto`` lets the agent evaluate them until the server's rules API has answered.
    """

    def __init__(self, config: SourceConfig, groups: list[Group], *, writes_back: bool) -> None:
        self._mode = config.recording_rules
        self._groups = [g for g in groups if g.spec.name not in config.local_groups]
        self._writes_back = writes_back
        self.server_runs_them = self._mode == "server"
        self.checked = self._mode == "agent"
        self.missing: dict[str, list[str]] = {}
        self._warned = False

    async def check(self, source: RemoteSource) -> None:
        """Ask the server which recording rules it runs (until it has answered once); log the outcome."""
        if self.checked:
            return
        try:
            loaded = await source.recording_rules()
        except SourceError as exc:
            if not self._warned:
                self._warned = True
                log.warning("cannot list the server's recording rules yet; asking again each evaluation",
                            error=str(exc), meanwhile="the agent evaluates them" if self._mode == "auto" else
                            "alerting rules only")
            return
        self.checked = True
        self.missing = missing_by_file(self._groups, loaded)
        if self._mode == "auto":
            self.server_runs_them = not self.missing
        if self.server_runs_them and not self.missing:
            log.info("the server runs the recording rules; the agent evaluates alerting rules only",
                     server=source.config.url)
        elif self.server_runs_them:
            self._report("source.recording_rules is server, but the server does not run these: load the files "
                         "into it, or the alerts that read them cannot fire")
        elif self._writes_back:
            log.info("the agent evaluates the recording rules and remote_write sends them to the server",
                     server=source.config.url)
        else:
            self._report("the server does not run these and nothing writes them back (no remote_write), so the "
                         "alerts that read them cannot fire: load the files into the server (sre-agent rules "
                         "export, or deploy/kubernetes/monitoring/prometheusrule.yaml), or configure remote_write")

    def _report(self, problem: str) -> None:
        for file, names in sorted(self.missing.items()):
            log.error("recording rules missing in the server", file=file, rules=names, problem=problem)
