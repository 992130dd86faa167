"""Fuzz config loading: whatever a config file holds, load_config returns a Config or raises
ConfigError (naming the problem), never another exception."""

from __future__ import annotations

import tempfile
from pathlib import Path

import yaml
from hypothesis import given
from hypothesis import strategies as st

from agent.config import Config, load_config
from agent.errors import ConfigError
from tests.fuzz import budget

# The config's own keys and a few near misses, so generated documents reach the validators.
_KEYS = st.sampled_from([
    "targets", "url", "job", "labels", "file_sd", "files", "refresh_interval", "scrape", "interval", "timeout",
    "body_size_limit", "server", "listen", "rules", "evaluation_interval", "state", "path", "store", "keep",
    "receivers", "name", "slack", "webhook", "route", "receiver", "routes", "match", "matchers", "group_by",
    "group_wait", "actions", "service", "notify", "scaling", "diagnostics", "log", "level", "bearer_token_env",
    "bearer_token_file", "nvml", "enabled", "mode", "retention", "max_replicas", "cooldown", "x",
])
_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(),
    st.sampled_from(["15s", "1m", "0s", "-1s", "5m30s", "1y", "16MiB", "http://a:1/metrics", "127.0.0.1:0",
                     "alertname=\"X\"", "x=~\"(\"", ":memory:", "true", "console", "0 3 * * *", "*", ""]),
    st.text(max_size=12),
)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=20)
_DOCUMENT = st.one_of(
    st.dictionaries(_KEYS, _VALUES, max_size=6).map(lambda d: yaml.safe_dump(d, sort_keys=False)),
    st.text(st.sampled_from(list("targets:url- &*!{}[],'\"#\n |>?%@`\t0123456789.")), max_size=120),
    st.text(max_size=80),
)


def _load(text: str) -> Config | None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "agent.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            return load_config(path, environ={})
        except ConfigError as exc:
            assert exc.errors and all(isinstance(e, str) and e for e in exc.errors)
            return None


@budget(400)
@given(text=_DOCUMENT)
def test_any_config_file_loads_or_raises_config_error(text: str) -> None:
    """load_config on arbitrary YAML (or not-YAML) text gives a Config or a ConfigError, nothing else."""
    _load(text)


@budget(100)
@given(doc=st.dictionaries(st.sampled_from(["scrape", "server", "rules", "state", "store", "notify", "log"]),
                           st.dictionaries(_KEYS, _SCALARS, max_size=3), max_size=3))
def test_section_values_validate_or_raise_config_error(doc: dict[str, object]) -> None:
    """Arbitrary scalars under each section's keys are accepted or named in a ConfigError."""
    _load(yaml.safe_dump(doc))
