"""Which rule files the agent loads and what its store keeps because of them.

Shared by the daemon and ``sre-agent triage`` (which loads the same rules to explain an alert):
rule-file globs expand like Prometheus' ``rule_files``, ``rules.selector`` is parsed once with a
config error naming the key, and the keep-list is what makes ingest fast (DESIGN.md decision 3):
only the families a loaded rule, the catalog or the triage report reads are stored.
"""

from __future__ import annotations

import structlog

from agent.app.triage.series import CONTEXT_FAMILIES
from agent.collect import catalog
from agent.collect.discovery import expand_globs
from agent.config import Config
from agent.errors import ConfigError, PromQLError
from agent.promql.rewrite import Matcher, parse_selector
from agent.rules.files import GroupSpec
from agent.store import KeepList

__all__ = ["keep_list", "rule_paths", "rule_selector"]

log = structlog.get_logger(__name__)


#: Rule-file globs expand like Prometheus' ``rule_files``: a plain path that does not
#: exist is kept, so loading reports it by name.
rule_paths = expand_globs


def rule_selector(text: str) -> list[Matcher]:
    """``rules.selector`` as matchers; a ConfigError names the key (the config layer cannot parse PromQL)."""
    try:
        return parse_selector(text) if text.strip() else []
    except PromQLError as exc:
        raise ConfigError(f"rules.selector: {exc}") from exc


def keep_list(config: Config, groups: list[GroupSpec] | None = None) -> KeepList:
    """The families to store: the catalog's health families, the triage report's context
    (:data:`~agent.app.triage.series.CONTEXT_FAMILIES`), ``store.keep`` and every metric name a
    loaded rule selects (DESIGN.md decision 3)."""
    if config.store.keep_all:
        return KeepList(None)
    names: set[str] = set()
    for g in groups or []:
        group_names, unnamed = g.metric_names()
        if unnamed:
            log.warning("a rule selects series without a fixed metric name; storing every family",
                        group=g.name, file=g.file)
            return KeepList(None)
        names |= group_names
    return KeepList(catalog.default_keep_families() | CONTEXT_FAMILIES | frozenset(config.store.keep) | names)
