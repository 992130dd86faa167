"""Tests for agent.cli, run as real processes where the process boundary matters
(exit codes, stdout JSON, SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.cli import main
from tests.statefiles import damaged_state_db, empty_state_db

PY = sys.executable


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "agent", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "NO_COLOR": "1"}, check=False)


@pytest.fixture
def simulator() -> Iterator[list[str]]:
    """A real `sre-agent simulate` process on free ports; yields its target URLs."""
    proc = subprocess.Popen([PY, "-m", "agent", "simulate", "--port", "0", "--replicas", "2", "--lmdeploy", "0",
                             "--log-level", "warning"], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    urls = [proc.stdout.readline().strip() for _ in range(2)]
    assert all(u.startswith("http://127.0.0.1:") for u in urls), urls
    yield urls
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 0


def test_simulate_host_binds_every_interface() -> None:
    """simulate --host 0.0.0.0 (what a container needs) binds all interfaces: the printed URLs name the
    host given, and the replicas answer on 127.0.0.1 too."""
    proc = subprocess.Popen([PY, "-m", "agent", "simulate", "--host", "0.0.0.0", "--port", "0", "--replicas", "1",
                             "--lmdeploy", "0", "--log-level", "warning"], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://0.0.0.0:") and url.endswith("/metrics"), url
        port = int(url.removeprefix("http://0.0.0.0:").split("/")[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            assert b"vllm:" in resp.read()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


def test_help_explains_commands(capsys: pytest.CaptureFixture[str]) -> None:
    """--help lists every command with a one-line explanation."""
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    for cmd in ("run", "check", "simulate", "demo"):
        assert cmd in out
    assert "sre-agent demo" in out


def test_check_prints_effective_config_redacted(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """check prints the config with defaults and redacted secrets, exit 0."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text("targets: [{url: 'http://h:8000/metrics', bearer_token_env: TOK}]\n")
    monkeypatch.setenv("TOK", "very-secret")
    assert main(["check", "--config", str(cfg), "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)
    assert data["targets"][0]["bearer_token"] == "**********"
    assert data["scrape"]["interval"] == "15s"
    assert "very-secret" not in out


def test_check_bad_config_exits_2_with_key_paths(tmp_path: Path) -> None:
    """A bad config exits 2 and prints one line per error with its key path."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text("targets: [{url: nope}]\nscrape: {interval: fast}\n")
    res = _cli("check", "--config", str(cfg))
    assert res.returncode == 2
    assert "config error: targets[0].url: not a URL: 'nope'" in res.stderr
    assert "config error: scrape.interval: not a duration: 'fast'" in res.stderr


@pytest.mark.parametrize(("content", "message"), [(b"targets: \xff\xfa\x00garbage\n", "not valid YAML"),
                                                  (b"[" * 100_000 + b"]" * 100_000, "exceeded max depth"),
                                                  (b"server: {auth: {bearer_token: inline}}\n", "bearer_token_file")])
def test_check_unreadable_config_exits_2_without_traceback(tmp_path: Path, content: bytes, message: str) -> None:
    """A binary, absurdly nested or inline-secret config file exits 2 with one line and no traceback."""
    cfg = tmp_path / "a.yaml"
    cfg.write_bytes(content)
    res = _cli("check", "--config", str(cfg))
    assert res.returncode == 2
    assert message in res.stderr and "Traceback" not in res.stderr


def test_run_once_prints_targets_json(tmp_path: Path, simulator: list[str]) -> None:
    """run --once scrapes and evaluates once and prints {targets, alerts} JSON; a dead target is down, exit 0."""
    cfg = tmp_path / "a.yaml"
    dead = "http://127.0.0.1:1/metrics"
    cfg.write_text(json.dumps({"targets": [{"url": u} for u in [*simulator, dead]],
                               "nvml": {"enabled": "false"}, "log": {"level": "error"},
                               "state": {"path": str(tmp_path / "state.db")}}))
    res = _cli("run", "--config", str(cfg), "--once")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    alerts = {a["labels"]["alertname"]: a for a in doc["alerts"]}  # the bundled rules, evaluated once
    assert alerts["Watchdog"]["state"] == "firing"
    assert alerts["VLLMTargetDown"]["state"] == "pending"  # for: 10m has not elapsed in one evaluation
    assert alerts["VLLMTargetDown"]["labels"]["instance"] == "127.0.0.1:1"
    by_url = {t["url"]: t for t in doc["targets"]}
    assert [by_url[u]["health"] for u in simulator] == ["up", "up"]
    assert all(by_url[u]["samples"] > 100 and by_url[u]["last_error"] == "" for u in simulator)
    assert by_url[dead]["health"] == "down" and "connection failed" in by_url[dead]["last_error"]
    assert set(by_url[dead]) >= {"url", "job", "instance", "health", "last_error", "samples"}


def test_run_once_bad_config_exits_2(tmp_path: Path) -> None:
    """run --once with a bad config exits 2 without scraping anything."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text("scrape: {timeout: 1m}\n")
    res = _cli("run", "--config", str(cfg), "--once")
    assert res.returncode == 2 and "timeout (1m)" in res.stderr and res.stdout == ""


@pytest.mark.parametrize("make", [damaged_state_db, empty_state_db], ids=["damaged", "zero-byte"])
def test_run_once_refuses_a_state_file_it_cannot_trust(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    """run --once with a damaged or zero-byte state file exits 2 before collecting, naming the file and
    saying to move it aside (its outbox may hold undelivered notifications); the file is left as it was."""
    state = make(tmp_path / "state.db")
    before = state.read_bytes()
    cfg = tmp_path / "a.yaml"
    cfg.write_text(json.dumps({"targets": [{"url": "http://127.0.0.1:1/metrics"}], "nvml": {"enabled": "false"},
                               "state": {"path": str(state)}}))
    res = _cli("run", "--once", "--config", str(cfg))
    assert res.returncode == 2, res.stderr
    assert res.stdout == ""
    assert f"error: state db {state}:" in res.stderr
    assert f"mv {state} {state}.damaged" in res.stderr and "outbox" in res.stderr
    assert "Traceback" not in res.stderr
    assert state.read_bytes() == before


def test_sigterm_shuts_down_cleanly(tmp_path: Path, simulator: list[str]) -> None:
    """The daemon serves /readyz after its first cycle and exits 0 on SIGTERM."""
    cfg = tmp_path / "a.yaml"
    cfg.write_text(json.dumps({"targets": [{"url": u} for u in simulator], "server": {"listen": "127.0.0.1:0"},
                               "nvml": {"enabled": "false"}, "scrape": {"interval": "1s", "timeout": "1s"},
                               "log": {"format": "json", "level": "info"}, "state": {"path": str(tmp_path / "s.db")}}))
    proc = subprocess.Popen([PY, "-m", "agent", "run", "--config", str(cfg)], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    port = None
    deadline = time.monotonic() + 30
    while port is None and time.monotonic() < deadline:
        line = proc.stderr.readline()
        if '"serving"' in line:
            port = int(json.loads(line)["listen"].rsplit(":", 1)[1])
    assert port, "daemon never logged its listen address"
    for _ in range(100):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    rest = proc.stderr.read()
    assert proc.wait(timeout=20) == 0
    assert '"agent stopped"' in rest


def test_rules_check_bundled_and_broken(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rules check passes the bundled rules (exit 0) and names a broken rule (exit 1)."""
    assert main(["rules", "check"]) == 0
    assert "SUCCESS" in capsys.readouterr().out
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: sum(\n")
    assert main(["rules", "check", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and 'group "g", rule 1, "A": could not parse expression' in out


def test_rules_test_reports_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rules test exits 1 and shows expected vs got when an expectation is wrong."""
    rules = tmp_path / "r.yaml"
    rules.write_text("groups:\n  - name: g\n    rules:\n      - alert: Up\n        expr: up == 1\n")
    test = tmp_path / "t.yaml"
    test.write_text(
        "rule_files: [r.yaml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n"
        "    input_series: [{series: 'up{job=\"a\"}', values: '1x5'}]\n"
        "    alert_rule_test: [{eval_time: 2m, alertname: Up, exp_alerts: [{exp_labels: {job: b}}]}]\n"
    )
    assert main(["rules", "test", str(test)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "alertname: Up, time: 2m" in out and "'job': 'a'" in out


def test_rules_export_prometheusrule(capsys: pytest.CaptureFixture[str]) -> None:
    """rules export prints a PrometheusRule whose groups are the bundled files' groups."""
    import yaml

    assert main(["rules", "export", "--namespace", "obs"]) == 0
    obj = yaml.safe_load(capsys.readouterr().out)
    assert obj["apiVersion"] == "monitoring.coreos.com/v1" and obj["kind"] == "PrometheusRule"
    assert obj["metadata"]["namespace"] == "obs"
    names = {g["name"] for g in obj["spec"]["groups"]}
    assert {"vllm", "gpu", "lmdeploy"} <= names


def test_run_refuses_broken_rule_file(tmp_path: Path) -> None:
    """The daemon does not start with a broken rule file and says which rule is wrong (exit 2)."""
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text("groups:\n  - name: g\n    rules:\n      - record: 'bad name'\n        expr: up\n")
    cfg = tmp_path / "a.yaml"
    cfg.write_text(json.dumps({"rules": {"files": [str(bad)]}, "nvml": {"enabled": "false"}}))
    res = _cli("run", "--config", str(cfg), "--once")
    assert res.returncode == 2
    assert "rule error:" in res.stderr and "invalid recording rule name" in res.stderr
