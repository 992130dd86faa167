"""Tests for agent.config: validation names the key path and the bad value; secrets stay secret."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.config import DEFAULT_TARGET, format_duration, load_config, parse_duration, parse_size
from agent.errors import ConfigError
from tests.yamlbombs import BILLION_LAUGHS, DEEP_BLOCK, DEEP_FLOW, write_huge


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "agent.yaml"
    p.write_text(text, encoding="utf-8")
    return p


def _errors(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, text), env or {})
    return info.value.errors


def test_defaults_scrape_vllm_default_port() -> None:
    """With no config file the agent scrapes vLLM's default port, NVML auto, API on 127.0.0.1:9400."""
    cfg = load_config(None)
    assert [t.url for t in cfg.targets] == [DEFAULT_TARGET] == ["http://127.0.0.1:8000/metrics"]
    assert cfg.nvml.mode == "auto"
    assert cfg.server.listen == "127.0.0.1:9400"
    assert cfg.scrape.body_limit == 16 * 2**20
    assert cfg.store.retention == 3600


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15), ("5m", 300), ("1h30m", 5400), ("100ms", 0.1), ("1d", 86400), ("2w", 14 * 86400), ("0", 0)],
)
def test_prometheus_durations(text: str, seconds: float) -> None:
    """Durations are parsed the Prometheus way."""
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["15", "5 m", "1.5h", "m", "", "15S", 15])
def test_bad_durations_rejected(bad: object) -> None:
    """A duration without a Prometheus unit is an error that shows the value."""
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_format_duration_round_trips() -> None:
    """format_duration prints what parse_duration reads back."""
    for s in (0.1, 15, 90, 3600, 5400, 86400 + 61):
        assert parse_duration(format_duration(s)) == pytest.approx(s)


def test_sizes() -> None:
    """Sizes accept IEC and SI units and plain bytes."""
    assert parse_size("16MiB") == 16 * 2**20
    assert parse_size("1GB") == 10**9
    assert parse_size(512) == 512
    with pytest.raises(ValueError, match="size"):
        parse_size("lots")


def test_every_error_named_by_key_path(tmp_path: Path) -> None:
    """All errors are reported at once, each with its key path and bad value."""
    errs = _errors(tmp_path, """
targets:
  - url: http://a:8000/metrics
  - url: http://b:8000/metrics
  - url: not-a-url
scrape: {intervall: 5s}
nvml: {interval: 15}
store: {retention: 10m}
server: {listen: nowhere}
""")
    joined = "\n".join(errs)
    assert "targets[2].url: not a URL: 'not-a-url'" in joined
    assert "scrape.intervall: unknown key (did you mean 'interval'?)" in joined
    assert "nvml.interval: a duration needs a unit" in joined and "15" in joined
    assert "store.retention: retention must be at least 1h" in joined
    assert "server.listen: not host:port: 'nowhere'" in joined
    assert len(errs) == 5


def test_timeout_longer_than_interval_rejected(tmp_path: Path) -> None:
    """A scrape timeout longer than the interval is refused (scrapes would overlap)."""
    errs = _errors(tmp_path, "scrape: {interval: 5s, timeout: 20s}\n")
    assert any(e.startswith("scrape:") and "timeout (20s)" in e and "interval (5s)" in e for e in errs)


def test_duplicate_targets_rejected(tmp_path: Path) -> None:
    """The same URL twice is a config error naming the second entry."""
    errs = _errors(tmp_path, "targets: [{url: 'http://a:1/metrics'}, {url: 'http://a:1/metrics'}]\n")
    assert any("targets[1].url: duplicate target" in e for e in errs)


def test_inline_secret_refused(tmp_path: Path) -> None:
    """An inline secret is refused with a hint to use a file or env var."""
    errs = _errors(tmp_path, "targets: [{url: 'http://a:1/metrics', bearer_token: hunter2}]\n")
    assert any("bearer_token_file" in e and "bearer_token_env" in e for e in errs)
    assert not any("hunter2" in e for e in errs)


def test_secret_from_env_is_redacted(tmp_path: Path) -> None:
    """A secret read from the environment is usable but prints redacted."""
    cfg = load_config(
        _write(tmp_path, "targets: [{url: 'http://a:1/metrics', bearer_token_env: VLLM_TOKEN}]\n"),
        {"VLLM_TOKEN": "s3cr3t"},
    )
    tok = cfg.targets[0].bearer_token
    assert tok is not None and tok.get_secret_value() == "s3cr3t"
    dumped = str(cfg.redacted()) + repr(cfg)
    assert "s3cr3t" not in dumped and "**********" in str(cfg.redacted())


def test_secret_from_file(tmp_path: Path) -> None:
    """A secret file is read and stripped of its trailing newline."""
    (tmp_path / "tok").write_text("abc\n", encoding="utf-8")
    text = f"targets: [{{url: 'http://a:1/metrics', bearer_token_file: '{tmp_path / 'tok'}'}}]\n"
    cfg = load_config(_write(tmp_path, text))
    assert cfg.targets[0].bearer_token is not None
    assert cfg.targets[0].bearer_token.get_secret_value() == "abc"


def test_missing_secret_env_named(tmp_path: Path) -> None:
    """A secret env var that is not set is an error naming the variable and the target."""
    errs = _errors(tmp_path, "targets: [{url: 'http://a:1/metrics', bearer_token_env: NOPE}]\n")
    assert errs == ["targets[0]: bearer_token_env: environment variable 'NOPE' is not set"]


@pytest.mark.parametrize(("value", "shown"), [("false", "False"), ("[a]", "['a']"), ("{a: 1}", "{'a': 1}"), ("3", "3")])
def test_secret_file_or_env_of_the_wrong_type_is_named(tmp_path: Path, value: str, shown: str) -> None:
    """A *_file or *_env that is not a string is a ConfigError naming the key (found by fuzzing: was a TypeError)."""
    for key in ("bearer_token_file", "bearer_token_env"):
        errs = _errors(tmp_path, f"targets: [{{url: 'http://a:1/metrics', {key}: {value}}}]\n")
        assert errs == [f"targets[0]: {key}: expected a string, got {shown}"]


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    """A missing file and broken YAML are ConfigErrors that name the file."""
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "targets: [\n"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))


def test_redacted_config_round_trips(tmp_path: Path) -> None:
    """The effective config printed by `check` loads again to the same config."""
    import yaml

    cfg = load_config(_write(tmp_path, "scrape: {interval: 30s, timeout: 10s, body_limit: 1MiB}\n"))
    again = load_config(_write(tmp_path, yaml.safe_dump(cfg.redacted())))
    assert again == cfg


def test_act_secrets_from_files_and_env_are_redacted(tmp_path: Path) -> None:
    """Slack token, webhook and scale-request HMAC secrets come from *_file/*_env and never print."""
    token = tmp_path / "slack"
    token.write_text("xoxb-very-secret-token\n")
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        "receivers:\n"
        f"  - {{name: s, slack: {{token_file: {token}, channel: '#alerts'}}}}\n"
        "  - {name: w, webhook: {url: 'https://hooks.example/x', secret_env: HOOK}}\n"
        "route: {receiver: s}\n"
        "scaling: {services: [{name: v, webhook: {url: 'http://127.0.0.1:1/scale', secret_env: SCALE}}]}\n"
    )
    config = load_config(cfg, {"HOOK": "hook-secret-value", "SCALE": "scale-secret-value"})
    slack = config.receivers[0].slack
    hook = config.receivers[1].webhook
    service_hook = config.scaling.services[0].webhook
    assert slack is not None and slack.token is not None and slack.token.get_secret_value() == "xoxb-very-secret-token"
    assert hook is not None and hook.secret is not None and hook.secret.get_secret_value() == "hook-secret-value"
    assert service_hook is not None and service_hook.secret is not None
    dumped = json.dumps(config.redacted())
    for secret in ("xoxb-very-secret-token", "hook-secret-value", "scale-secret-value"):
        assert secret not in dumped
    assert dumped.count("**********") == 3


def test_act_config_errors_name_the_key(tmp_path: Path) -> None:
    """Inline Slack tokens, unknown route receivers, bad matchers and impossible scaling bounds are refused."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        "receivers:\n"
        "  - {name: s, slack: {token: xoxb-inline, channel: '#a'}}\n"
        "route: {receiver: nobody, routes: [{receiver: s, matchers: ['severity=~\"(\"']}]}\n"
        "scaling: {services: [{name: v, min_replicas: 5, max_replicas: 2}]}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {})
    text = "\n".join(err.value.errors)
    assert "receivers[0].slack: token: secrets are not accepted inline" in text
    assert "route.routes[0].matchers" in text
    assert "scaling.services[0]: min_replicas (5) > max_replicas (2)" in text


def test_regex_re2_refuses_is_a_config_error_naming_the_key(tmp_path: Path) -> None:
    """A route regex RE2 refuses (look-around, back-reference) fails validation naming the key and the matcher."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        "receivers: [{name: s, webhook: {url: 'http://127.0.0.1:9/'}}]\n"
        "route: {receiver: s, routes: [{receiver: s, matchers: ['job=~\"(?!x).*\"'],\n"
        "                               match_re: {instance: '(a)\\1'}}]}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(cfg, {})
    text = "\n".join(err.value.errors)
    assert "route.routes[0].matchers" in text and "job=~: not a regular expression in RE2 syntax" in text
    assert "route.routes[0].match_re" in text and "instance=~: not a regular expression in RE2 syntax" in text


def test_credentials_in_target_url_refused_without_echoing_them(tmp_path: Path) -> None:
    """A target URL with user:pass@ is refused at load, pointing to basic_auth, and the password
    appears in no error message (also when the rest of the URL is bad)."""
    for url in ("http://bob:hunter2@a:1/metrics", "http://bob:hunter2@a:bad/metrics", "http://bob@a:1/"):
        errs = _errors(tmp_path, f"targets: [{{url: '{url}'}}]\n")
        assert len(errs) == 1 and errs[0].startswith("targets[0].url: credentials in the URL are refused")
        assert "basic_auth" in errs[0] and "password_file" in errs[0] and "hunter2" not in errs[0]


def test_basic_auth_password_from_file_or_env_redacted(tmp_path: Path) -> None:
    """basic_auth takes its password from password_file or password_env, never inline, and prints redacted."""
    (tmp_path / "pw").write_text("s3cr3t\n", encoding="utf-8")
    cfg = load_config(_write(tmp_path, (
        f"targets: [{{url: 'http://a:1/metrics', basic_auth: {{username: bob, password_file: '{tmp_path / 'pw'}'}}}},\n"
        "          {url: 'http://b:1/metrics', basic_auth: {username: eve, password_env: PW}}]\n")), {"PW": "env-pw"})
    auths = [t.basic_auth for t in cfg.targets]
    assert [(a.username, a.password.get_secret_value()) for a in auths if a] == [("bob", "s3cr3t"), ("eve", "env-pw")]
    shown = json.dumps(cfg.redacted()) + repr(cfg)
    assert "s3cr3t" not in shown and "env-pw" not in shown
    assert cfg.redacted()["targets"][0]["basic_auth"] == {"username": "bob", "password": "**********"}
    errs = _errors(tmp_path, "targets: [{url: 'http://a:1/', basic_auth: {username: bob, password: hunter2}}]\n")
    assert any("password_file" in e for e in errs) and not any("hunter2" in e for e in errs)


def test_bearer_token_with_basic_auth_is_a_config_error(tmp_path: Path) -> None:
    """A target (or file_sd entry) with both bearer_token and basic_auth fails at load, naming it."""
    env = {"T": "tok", "PW": "pw"}
    both = "bearer_token_env: T, basic_auth: {username: bob, password_env: PW}"
    errs = _errors(tmp_path, f"targets: [{{url: 'http://a:1/', {both}}}]\n", env)
    assert errs == ["targets[0]: give bearer_token or basic_auth, not both (a request has one Authorization header)"]
    errs = _errors(tmp_path, f"file_sd: [{{files: [x.json], {both}}}]\n", env)
    assert errs == ["file_sd[0]: give bearer_token or basic_auth, not both (a request has one Authorization header)"]


def test_cardinality_limits_default_on_and_zero_means_unlimited(tmp_path: Path) -> None:
    """The per-target label/new-series limits and store.max_series are on by default; 0 turns each off."""
    cfg = load_config(None)
    sc = cfg.scrape
    assert (sc.sample_limit, sc.label_limit, sc.label_name_length_limit, sc.label_value_length_limit,
            sc.new_series_limit, cfg.store.max_series) == (0, 64, 256, 4096, 10_000, 1_000_000)
    off = load_config(_write(tmp_path, "scrape: {label_limit: 0, new_series_limit: 0}\nstore: {max_series: 0}\n"))
    assert (off.scrape.label_limit, off.scrape.new_series_limit, off.store.max_series) == (0, 0, 0)
    assert _errors(tmp_path, "scrape: {new_series_limit: -1}\n")[0].startswith("scrape.new_series_limit:")


def test_server_defaults_and_limits(tmp_path: Path) -> None:
    """server has safe defaults (256 connections, 10s head deadline, no auth, no TLS) and checks its limits."""
    s = load_config(None).server
    assert (s.max_connections, s.header_timeout, s.body_timeout, s.keepalive_timeout, s.body_limit) == (
        256, 10.0, 30.0, 60.0, 2**20)
    assert s.auth.bearer_token is None and not s.auth.protect_reads and s.tls is None
    errs = _errors(tmp_path, "server: {max_connections: 0, header_timeout: 0s, body_limit: 1GiB}\n")
    assert sorted(e.split(":")[0] for e in errs) == ["server.body_limit", "server.header_timeout",
                                                     "server.max_connections"]


def test_server_token_from_file_or_env_redacted(tmp_path: Path) -> None:
    """server.auth.bearer_token comes from a file or env only and prints as stars; inline or empty is refused."""
    (tmp_path / "tok").write_text("t0ken\n", encoding="utf-8")
    cfg = load_config(_write(tmp_path, f"server: {{auth: {{bearer_token_file: '{tmp_path / 'tok'}'}}}}\n"))
    assert cfg.server.auth.bearer_token is not None
    assert cfg.server.auth.bearer_token.get_secret_value() == "t0ken"
    assert "t0ken" not in json.dumps(cfg.redacted())
    assert cfg.redacted()["server"]["auth"]["bearer_token"] == "**********"
    cfg = load_config(_write(tmp_path, "server: {auth: {bearer_token_env: TOK, protect_reads: true}}\n"),
                      {"TOK": "abc"})
    assert cfg.server.auth.protect_reads
    assert any("bearer_token_file" in e for e in _errors(tmp_path, "server: {auth: {bearer_token: abc}}\n"))
    assert any("empty" in e for e in _errors(tmp_path, "server: {auth: {bearer_token_env: TOK}}\n", {"TOK": ""}))


def test_server_tls_files_are_checked_at_load(tmp_path: Path) -> None:
    """A missing or unreadable certificate is a config error naming server.tls."""
    errs = _errors(tmp_path, f"server: {{tls: {{cert_file: '{tmp_path / 'no.pem'}', key_file: '{tmp_path / 'k'}'}}}}\n")
    assert len(errs) == 1 and errs[0].startswith("server.tls: cannot load the certificate")


def test_binary_or_deeply_nested_config_is_a_config_error(tmp_path: Path) -> None:
    """A file that is not UTF-8, or YAML nested 100k deep, is a ConfigError (exit 2), not a traceback."""
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"targets: \xff\xfa\x00garbage\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="exceeded max depth"):
        load_config(_write(tmp_path, "[" * 100_000 + "]" * 100_000))


@pytest.mark.parametrize(("doc", "message"), [
    (BILLION_LAUGHS, "excessive aliasing"), (DEEP_FLOW, "exceeded max depth"), (DEEP_BLOCK, "exceeded max depth"),
], ids=["billion-laughs", "deep-flow", "deep-block"])
def test_yaml_bombs_are_config_errors_naming_the_file(tmp_path: Path, doc: str, message: str) -> None:
    """An alias or nesting bomb is a ConfigError that names the file and quotes none of the expanded data."""
    path = _write(tmp_path, doc)
    with pytest.raises(ConfigError, match=message) as err:
        load_config(path)
    assert str(path) in str(err.value) and "lol" not in str(err.value) and len(str(err.value)) < 600


def test_huge_config_file_refused(tmp_path: Path) -> None:
    """A config file over the YAML size cap is refused, naming the file and the limit."""
    path = write_huge(tmp_path / "agent.yaml")
    with pytest.raises(ConfigError, match="byte limit") as err:
        load_config(path)
    assert str(path) in str(err.value)


def test_config_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    """A config file that is not UTF-8 is a ConfigError, not a UnicodeDecodeError."""
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"targets: \xff\xfe\xfa\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_expanded_value_quoted_briefly_in_errors(tmp_path: Path) -> None:
    """A wrong-typed value built from aliases is quoted in at most a few dozen characters."""
    doc = "x: &x [" + ", ".join(["aaaa"] * 60) + "]\ny: &y [" + ", ".join(["*x"] * 60) + "]\nscrape: {interval: *y}\n"
    with pytest.raises(ConfigError, match=r"scrape\.interval") as err:
        load_config(_write(tmp_path, doc))
    assert len(str(err.value)) < 400 and str(err.value).count("aaaa") < 10


def test_nvml_hostname_from_the_environment(tmp_path: Path) -> None:
    """nvml.hostname_env names the node (the downward API's NODE_NAME); unset, or beside hostname, is refused."""
    path = tmp_path / "agent.yaml"
    path.write_text("nvml:\n  hostname_env: NODE_NAME\n")
    assert load_config(path, environ={"NODE_NAME": "gpu-node-7"}).nvml.hostname == "gpu-node-7"
    with pytest.raises(ConfigError, match="NODE_NAME"):
        load_config(path, environ={})
    path.write_text("nvml:\n  hostname: a\n  hostname_env: NODE_NAME\n")
    with pytest.raises(ConfigError, match="not both"):
        load_config(path, environ={"NODE_NAME": "b"})


@pytest.mark.parametrize(("text", "line", "key", "first"), [
    ("server:\n  listen: 127.0.0.1:9400\n  auth: {type: basic}\nserver:\n  listen: 0.0.0.0:9400\n", 4, "server", 1),
    ("scrape:\n  interval: 5s\n  timeout: 2s\n  interval: 10s\n", 4, "interval", 2),
    ("targets:\n  - {url: 'http://a:8000/metrics', job: a, job: b}\n", 2, "job", 2),
    ("targets:\n  - url: http://a:8000/metrics\n    labels:\n      model: x\n      \"model\": y\n", 5, "model", 4),
    ("nvml: {enabled: false}\nnvml:\n  enabled: true\n", 2, "nvml", 1),
], ids=["server-twice", "scrape-key", "flow-target", "quoted-label", "flow-then-block"])
def test_duplicate_keys_are_config_errors_naming_file_line_and_key(
        tmp_path: Path, text: str, line: int, key: str, first: int) -> None:
    """A key given twice, at any depth, is refused as yaml.v3 refuses it, not silently the last one winning."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f'{path}: not valid YAML: line {line}: mapping key "{key}" already defined at line {first}'


@pytest.mark.parametrize(("section", "name"), [
    ({"targets": [{"url": "http://a:8000/metrics", "labels": {"{name}": "x"}}]}, "targets[0].labels"),
    ({"ha": {"replica_label": "{name}"}}, "ha.replica_label"),
    ({"forward": {"url": "http://c:9400", "labels": {"{name}": "x"}}}, "forward.labels"),
], ids=["target-labels", "ha-replica-label", "forward-labels"])
@pytest.mark.parametrize("bad", ["a\n", "a\nb", "1a", "a-b"])
def test_label_names_are_whole_prometheus_label_names(tmp_path: Path, section: dict[str, Any], name: str,
                                                      bad: str) -> None:
    """A label name with a trailing newline (which "$" lets through) or any other invalid form is refused."""
    text = json.dumps(section).replace("{name}", bad.replace("\n", "\\n"))
    errors = _errors(tmp_path, text)
    assert len(errors) == 1 and errors[0].startswith(f"{name}: ") and repr(bad) in errors[0], errors
