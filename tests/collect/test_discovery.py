"""Tests for agent.collect.discovery: static targets and Prometheus file_sd files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agent.collect.discovery import FileSD, all_targets, instance_of, parse_file_sd, static_targets
from agent.config import FileSDConfig, load_config
from agent.errors import ConfigError
from tests.yamlbombs import BILLION_LAUGHS, DEEP_BLOCK, DEEP_FLOW, SELF_ALIAS, write_huge


def test_instance_adds_default_port_like_prometheus_2() -> None:
    """instance is host:port, with the scheme's default port when the URL has none."""
    assert instance_of("http://10.0.0.1:8000/metrics") == "10.0.0.1:8000"
    assert instance_of("http://vllm/metrics") == "vllm:80"
    assert instance_of("https://vllm/metrics") == "vllm:443"
    assert instance_of("http://[::1]:9/metrics") == "[::1]:9"


def test_static_target_labels() -> None:
    """A static target carries job, instance and its extra labels."""
    cfg = load_config(None)
    (spec,) = static_targets(cfg.targets)
    assert dict(spec.labels) == {"job": "vllm", "instance": "127.0.0.1:8000"}


def test_file_sd_json_and_yaml(tmp_path: Path) -> None:
    """Both file formats give targets with scheme, path, job and labels applied."""
    (tmp_path / "a.json").write_text(json.dumps([
        {"targets": ["h1:8000", "h2:8000"], "labels": {"model": "llama", "__metrics_path__": "/m"}},
    ]))
    (tmp_path / "b.yaml").write_text("- targets: ['h3:23333']\n  labels: {job: lmdeploy, __scheme__: https}\n")
    sd = FileSD([FileSDConfig(files=[str(tmp_path / "*.json"), str(tmp_path / "b.yaml")])], clock=lambda: 0.0)
    specs = {s.url: dict(s.labels) for s in sd.refresh()}
    assert specs == {
        "http://h1:8000/m": {"job": "vllm", "instance": "h1:8000", "model": "llama"},
        "http://h2:8000/m": {"job": "vllm", "instance": "h2:8000", "model": "llama"},
        "https://h3:23333/metrics": {"job": "lmdeploy", "instance": "h3:23333"},
    }


def test_broken_file_keeps_previous_targets(tmp_path: Path) -> None:
    """A file that becomes invalid keeps its last good targets and reports the error."""
    f = tmp_path / "sd.json"
    f.write_text(json.dumps([{"targets": ["h1:1"]}]))
    sd = FileSD([FileSDConfig(files=[str(f)])], clock=lambda: 0.0)
    assert len(sd.refresh()) == 1
    f.write_text("[{not json")
    os.utime(f, (1e9, 1e9))
    assert [s.instance for s in sd.refresh()] == ["h1:1"]
    assert "cannot parse" in sd.errors()[str(f)]


def test_changed_file_reloaded_and_deleted_file_dropped(tmp_path: Path) -> None:
    """An edited file is re-read on its new mtime; a deleted file's targets go away."""
    f = tmp_path / "sd.json"
    f.write_text(json.dumps([{"targets": ["h1:1"]}]))
    sd = FileSD([FileSDConfig(files=[str(tmp_path / "*.json")])], clock=lambda: 0.0)
    sd.refresh()
    f.write_text(json.dumps([{"targets": ["h1:1", "h2:1"]}]))
    os.utime(f, (2e9, 2e9))
    assert len(sd.refresh()) == 2
    f.unlink()
    assert sd.refresh() == []


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"targets": []}', "expected a list"),
        ('[{"targets": "h:1"}]', "expected {targets"),
        ('[{"targets": ["http://h:1/metrics"]}]', "expected host:port"),
        ('[{"targets": ["h:1"], "labels": {"a": 1}}]', "mapping of strings"),
    ],
)
def test_file_sd_errors_name_the_entry(tmp_path: Path, content: str, message: str) -> None:
    """Malformed file_sd content is a ConfigError that says what is wrong."""
    f = tmp_path / "sd.json"
    f.write_text(content)
    with pytest.raises(ConfigError, match=message):
        parse_file_sd(f, "vllm")


def test_static_wins_over_discovered_duplicate(tmp_path: Path) -> None:
    """A URL both static and discovered is scraped once, with the static labels."""
    f = tmp_path / "sd.yaml"
    f.write_text("- targets: ['127.0.0.1:8000']\n  labels: {job: other}\n")
    cfg = load_config(None)
    specs = all_targets(cfg, FileSD([FileSDConfig(files=[str(f)])], clock=lambda: 0.0))
    assert len(specs) == 1 and specs[0].job == "vllm"


def test_file_sd_credentials_refused_and_entry_auth_applied(tmp_path: Path) -> None:
    """A file_sd address with user:pass@ is refused without quoting the password; the entry's
    basic_auth reaches every target it lists."""
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"targets": ["bob:hunter2@10.0.0.5:8000"]}]))
    with pytest.raises(ConfigError, match=r"\[0\]\.targets\[0\]: credentials in a target address are refused") as info:
        parse_file_sd(bad, "vllm")
    assert "hunter2" not in str(info.value) and "basic_auth" in str(info.value)
    good = tmp_path / "good.json"
    good.write_text(json.dumps([{"targets": ["10.0.0.5:8000", "10.0.0.6:8000"]}]))
    (tmp_path / "pw").write_text("pw\n")
    cfg = load_config(None).model_copy(update={"file_sd": [FileSDConfig.model_validate(
        {"files": [str(good)], "basic_auth": {"username": "bob", "password_file": str(tmp_path / "pw")}})]})
    specs = FileSD(cfg.file_sd, lambda: 0.0).refresh()
    assert [(s.basic_auth.username, s.basic_auth.password.get_secret_value()) for s in specs if s.basic_auth] == [
        ("bob", "pw"), ("bob", "pw")]


@pytest.mark.parametrize(("name", "content", "message"), [
    ("sd.yaml", BILLION_LAUGHS, "excessive aliasing"),
    ("sd.yaml", SELF_ALIAS, "contains itself"),
    ("sd.yaml", DEEP_FLOW, "exceeded max depth"),
    ("sd.yml", DEEP_BLOCK, "exceeded max depth"),
    ("sd.json", "[" * 100_000 + "]" * 100_000, "cannot parse"),
], ids=["billion-laughs", "self-alias", "deep-flow", "deep-block", "deep-json"])
def test_file_sd_bomb_is_a_per_file_error(tmp_path: Path, name: str, content: str, message: str) -> None:
    """A bomb replacing a file_sd file is recorded as that file's error; its last targets and other files stay."""
    good, bad = tmp_path / "good.json", tmp_path / name
    good.write_text(json.dumps([{"targets": ["h1:1"]}]))
    bad.write_text(json.dumps([{"targets": ["h2:1"]}]))
    sd = FileSD([FileSDConfig(files=[str(good), str(bad)])], clock=lambda: 0.0)
    assert sorted(s.instance for s in sd.refresh()) == ["h1:1", "h2:1"]
    bad.write_text(content)
    os.utime(bad, (2e9, 2e9))
    assert sorted(s.instance for s in sd.refresh()) == ["h1:1", "h2:1"]
    errors = sd.errors()
    assert list(errors) == [str(bad)] and message in errors[str(bad)] and len(errors[str(bad)]) < 600


def test_huge_file_sd_file_is_a_per_file_error(tmp_path: Path) -> None:
    """A file_sd file over the size cap is refused (JSON or YAML) and reported, not read in full."""
    sd = FileSD([FileSDConfig(files=[str(write_huge(tmp_path / "a.yaml")), str(write_huge(tmp_path / "b.json"))])],
                clock=lambda: 0.0)
    assert sd.refresh() == []
    assert all("byte limit" in e for e in sd.errors().values()) and len(sd.errors()) == 2


def test_file_sd_bad_target_quoted_briefly(tmp_path: Path) -> None:
    """A target that is a long list, not host:port, is quoted in a bounded snippet."""
    f = tmp_path / "sd.yaml"
    f.write_text("- targets: [[" + ", ".join(["aaaa"] * 60) + "]]\n")
    with pytest.raises(ConfigError, match="expected host:port") as err:
        parse_file_sd(f, "vllm")
    assert len(str(err.value)) < len(str(f)) + 150
