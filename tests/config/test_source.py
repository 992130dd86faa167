"""source: embedded by default; a remote Prometheus-compatible server with its credentials, TLS and
query semantics, every mistake named by its key path."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import Config, load_config
from agent.errors import ConfigError


def _load(tmp_path: Path, text: str, environ: dict[str, str] | None = None) -> Config:
    f = tmp_path / "agent.yaml"
    f.write_text(text)
    return load_config(f, environ=environ)


def _errors(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(tmp_path, text)
    return info.value.errors


def test_embedded_by_default_with_the_vllm_target() -> None:
    config = load_config(None)
    assert config.source.type == "embedded" and not config.source.remote
    assert len(config.targets) == 1


def test_a_remote_source_scrapes_nothing_unless_targets_are_given(tmp_path: Path) -> None:
    config = _load(tmp_path, "source: {type: prometheus, url: 'http://prometheus:9090/'}\n")
    assert (config.source.url, config.targets, config.source.local_groups) == ("http://prometheus:9090", [],
                                                                               ["sre-agent"])
    assert (config.source.query_offset, config.source.partial_response, config.source.timeout) == (0.0, "abort", 10.0)
    both = _load(tmp_path, "source: {type: prometheus, url: 'http://p:9090'}\ntargets: [{url: 'http://a:1/metrics'}]\n")
    assert len(both.targets) == 1


@pytest.mark.parametrize(("text", "message"), [
    ("source: {type: prometheus}\n", "source: url: type prometheus needs the server's URL"),
    ("source: {url: 'http://p:9090'}\n", "url is only used with type: prometheus"),
    ("source: {type: prometheus, url: 'http://u:pw@p:9090'}\n", "source.url: credentials in the URL are refused"),
    ("source: {type: prometheus, url: 'http://p:9090', headers: {Authorization: x}}\n",
     "source.headers: header 'Authorization' is set by the agent"),
    ("source: {type: prometheus, url: 'http://p:9090', bearer_token: hunter2}\n", "bearer_token_file"),
    ("source: {type: prometheus, url: 'http://p:9090', timeout: 0s}\n", "timeout must be positive"),
    ("source: {type: prometheus, url: 'http://p:9090', partial_response: ignore}\n", "source.partial_response"),
    ("source: {type: thanos, url: 'http://p:9090'}\n", "source.type"),
    ("source: {type: prometheus, url: 'http://p:9090', tls: {cert_file: /nonexistent.pem}}\n",
     "give cert_file and key_file together"),
    ("source: {type: prometheus, url: 'http://p:9090', tls: {ca_file: /nonexistent-ca.pem}}\n",
     "cannot load the TLS files"),
])
def test_mistakes_are_named(tmp_path: Path, text: str, message: str) -> None:
    errs = _errors(tmp_path, text)
    assert any(message in e for e in errs), errs
    assert not any("hunter2" in e for e in errs)


def test_credentials_come_from_env_and_are_redacted(tmp_path: Path) -> None:
    config = _load(tmp_path, "source: {type: prometheus, url: 'http://p:9090', bearer_token_env: PROM_TOKEN}\n",
                   environ={"PROM_TOKEN": "hunter2"})
    assert config.source.bearer_token is not None
    assert config.source.bearer_token.get_secret_value() == "hunter2"
    assert "hunter2" not in str(config.redacted())


def test_rules_mixin_parameters_are_checked(tmp_path: Path) -> None:
    config = _load(tmp_path, "rules: {selector: 'cluster=\"a\"', by: [cluster, namespace]}\n")
    assert (config.rules.selector, config.rules.by) == ('cluster="a"', ["cluster", "namespace"])
    assert any("rules.by: not label names: 'clus-ter'" in e for e in _errors(tmp_path, "rules: {by: [clus-ter]}\n"))


async def test_the_agent_applies_them_to_every_rule_and_names_a_bad_selector(tmp_path: Path) -> None:
    from agent.app.daemon import Agent

    base = {"state": {"path": ":memory:"}, "nvml": {"enabled": False}, "server": {"listen": "127.0.0.1:0"}}
    agent = Agent(Config.model_validate({**base, "rules": {"selector": 'cluster="a"', "by": ["cluster"]}}))
    exprs = {r.spec.name: r.spec.expr_text for g in agent.rules.groups for r in g.rules}
    await agent.stop()
    assert exprs["job_model:vllm_num_requests_waiting:sum"] == (
        'sum by (job, model_name, cluster) (instance_model:vllm_num_requests_waiting:sum{cluster="a"})')
    with pytest.raises(ConfigError, match=r"rules\.selector: not a label selector"):
        Agent(Config.model_validate({**base, "rules": {"selector": "cluster"}}))
