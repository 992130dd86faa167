"""Tests for agent.collect.discovery: static targets and Prometheus file_sd files."""

from __future__ import annotations

import json
import os
import time
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
        ('[{"targets": ["h:1"], "labels": {"a": 1}}]', "label values must be strings"),
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


#: Files Prometheus' file_sd refuses, or that name what no scrape can use, as (file name, content, what the
#: error says). Each replaces a good file: the file's last targets must stay and the others go on.
BAD_FILES = {
    "int-label-key": ("sd.yaml", "- targets: ['h2:1']\n  labels: {1: a}\n", "label names must be strings"),
    "bool-label-key": ("sd.yaml", "- targets: ['h2:1']\n  labels: {true: a}\n", "label names must be strings"),
    "null-label-key": ("sd.yaml", "- targets: ['h2:1']\n  labels: {~: a}\n", "label names must be strings"),
    "int-label-value": ("sd.json", '[{"targets": ["h2:1"], "labels": {"a": 1}}]', "label values must be strings"),
    "list-label-value": ("sd.yaml", "- targets: ['h2:1']\n  labels: {a: [x]}\n", "label values must be strings"),
    "null-label-value": ("sd.yaml", "- targets: ['h2:1']\n  labels: {a: ~}\n", "label values must be strings"),
    "dash-label-name": ("sd.json", '[{"targets": ["h2:1"], "labels": {"bad-name": "x"}}]', "not a valid label name"),
    "digit-label-name": ("sd.yaml", "- targets: ['h2:1']\n  labels: {'1abc': x}\n", "not a valid label name"),
    "newline-label-name": ("sd.json", '[{"targets": ["h2:1"], "labels": {"a\\n": "x"}}]', "not a valid label name"),
    "empty-label-name": ("sd.json", '[{"targets": ["h2:1"], "labels": {"": "x"}}]', "not a valid label name"),
    "int-target": ("sd.yaml", "- targets: [8000]\n", "expected host:port"),
    "mapping-target": ("sd.yaml", "- targets: [{h: 1}]\n", "expected host:port"),
    "null-target": ("sd.json", '[{"targets": [null]}]', "expected host:port"),
    "space-in-target": ("sd.json", '[{"targets": ["h 2:1"]}]', "expected host:port"),
    "surrogate-target": ("sd.json", '[{"targets": ["h\\ud8002:1"]}]', "not valid UTF-8"),
    "surrogate-value": ("sd.json", '[{"targets": ["h2:1"], "labels": {"a": "\\udc00"}}]', "not valid UTF-8"),
    "mapping-top-level": ("sd.yaml", "targets: ['h2:1']\n", "expected a list of target groups"),
    "scalar-top-level": ("sd.json", '"h2:1"', "expected a list of target groups"),
    "group-not-mapping": ("sd.yaml", "- h2:1\n", "expected {targets"),
    "labels-not-mapping": ("sd.yaml", "- targets: ['h2:1']\n  labels: [a, b]\n", "expected a mapping"),
    "duplicate-key": ("sd.yaml", "- targets: ['h2:1']\n  targets: ['h3:1']\n", 'mapping key "targets" already'),
    "too-many-targets": ("sd.yaml", "- targets: &t [" + ", ".join(f"'h{i}:1'" for i in range(600)) + "]\n"
                         + "- targets: *t\n" * 99, "targets in one file"),
    "too-many-labels": ("sd.yaml", "- targets: &t [" + ", ".join(f"'h{i}:1'" for i in range(100)) + "]\n"
                        "  labels: &l {" + ", ".join(f"l{i}: v" for i in range(90)) + "}\n"
                        + "- {targets: *t, labels: *l}\n" * 120, "target labels in one file"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_file_refused_counted_and_its_targets_kept(tmp_path: Path, case: str) -> None:
    """A file_sd file that turns bad is refused and counted; its last targets stay, and a good file beside it
    keeps being read (a new target there appears)."""
    name, content, message = BAD_FILES[case]
    good, bad = tmp_path / "good.json", tmp_path / name
    good.write_text(json.dumps([{"targets": ["h1:1"]}]))
    bad.write_text(json.dumps([{"targets": ["h2:1"], "labels": {"model": "m"}}]) if name.endswith(".json")
                   else "- targets: ['h2:1']\n  labels: {model: m}\n")
    sd = FileSD([FileSDConfig(files=[str(good), str(bad)])], clock=lambda: 0.0)
    assert sorted(s.instance for s in sd.refresh()) == ["h1:1", "h2:1"]
    assert sd.read_errors == 0
    bad.write_text(content, encoding="utf-8", errors="surrogatepass")
    os.utime(bad, (2e9, 2e9))
    good.write_text(json.dumps([{"targets": ["h1:1", "h9:1"]}]))
    os.utime(good, (2e9, 2e9))
    specs = sd.refresh()
    assert sorted((s.instance, dict(s.labels).get("model")) for s in specs) == [
        ("h1:1", None), ("h2:1", "m"), ("h9:1", None)]
    errors = sd.errors()
    assert list(errors) == [str(bad)] and message in errors[str(bad)], errors
    assert len(errors[str(bad)]) < 600
    assert sd.read_errors == 1


def test_first_read_of_a_bad_file_gives_no_targets_and_is_counted(tmp_path: Path) -> None:
    """A file bad from the start contributes nothing, counts once per read, and the scrape goes on."""
    (tmp_path / "a.yaml").write_text("- targets: ['h1:1']\n  labels: {1: a}\n")
    (tmp_path / "b.yaml").write_text("- targets: ['h2:1']\n")
    now = [0.0]
    sd = FileSD([FileSDConfig.model_validate({"files": [str(tmp_path / "*.yaml")], "refresh_interval": "10s"})],
                clock=lambda: now[0])
    assert [s.instance for s in sd.refresh()] == ["h2:1"]
    assert sd.read_errors == 1 and sd.failing_files == 1
    now[0] = 20.0  # refresh_interval passed: re-read, refused again, counted again
    assert [s.instance for s in sd.refresh()] == ["h2:1"]
    assert sd.read_errors == 2 and sd.failing_files == 1


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    """A FIFO matching a file_sd glob is refused at once: reading it would block the discovery thread for good."""
    fifo = tmp_path / "sd.json"
    os.mkfifo(fifo)
    sd = FileSD([FileSDConfig(files=[str(fifo)])], clock=lambda: 0.0)
    assert sd.refresh() == []
    assert "not a regular file" in sd.errors()[str(fifo)]


def test_a_good_file_of_many_targets_parses_quickly(tmp_path: Path) -> None:
    """20,000 targets (two groups of 10,000 with shared labels) parse in a few seconds, not tens."""
    f = tmp_path / "sd.json"
    addrs = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(10_000)]
    f.write_text(json.dumps([{"targets": addrs, "labels": {"model": "a"}}, {"targets": addrs, "labels": {"x": "b"}}]))
    t0 = time.perf_counter()
    assert len(parse_file_sd(f, "vllm")) == 20_000
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize(("labels", "url", "want"), [
    ({"job": ""}, "http://h:1/metrics", {"job": "vllm", "instance": "h:1"}),
    ({"model": "", "zone": "a"}, "http://h:1/metrics", {"job": "vllm", "instance": "h:1", "zone": "a"}),
    ({"__metrics_path__": "m"}, "http://h:1/m", {"job": "vllm", "instance": "h:1"}),
    ({"__metrics_path__": "", "__scheme__": ""}, "http://h:1/metrics", {"job": "vllm", "instance": "h:1"}),
    ({"__scheme__": "https", "__metrics_path__": "/x/y"}, "https://h:1/x/y", {"job": "vllm", "instance": "h:1"}),
])
def test_empty_labels_are_unset_and_paths_get_their_slash(tmp_path: Path, labels: dict[str, str], url: str,
                                                           want: dict[str, str]) -> None:
    """An empty label counts as unset (no target with job ""), and a metrics path without "/" gets one."""
    f = tmp_path / "sd.json"
    f.write_text(json.dumps([{"targets": ["h:1"], "labels": labels}]))
    (spec,) = parse_file_sd(f, "vllm")
    assert (spec.url, dict(spec.labels)) == (url, want)
