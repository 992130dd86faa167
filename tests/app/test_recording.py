"""agent.app.recording against a real Prometheus 2.42: a server that loads our rule file runs the
recording rules (the agent then evaluates alerting rules only); one that does not gets an error
naming the file to load; a server without a rules API leaves the agent evaluating them."""

from __future__ import annotations

from pathlib import Path

import structlog

from agent.app.recording import RecordingPlacement, missing_by_file
from agent.config.source import SourceConfig
from agent.promql import Engine
from agent.promql.remote import RemoteSource
from agent.rules.files import load_rule_files
from agent.rules.manager import RuleManager
from agent.store import Store
from tests.prometheus import Prometheus
from tests.receivers import RecordingServer, reply

RULES = """
groups:
  - name: fleet
    rules:
      - record: job:e2e_condition:sum
        expr: sum by (job) (e2e_condition)
      - alert: ConditionHigh
        expr: job:e2e_condition:sum > 0
"""


def _manager(path: Path) -> RuleManager:
    store = Store(3_600_000)
    return RuleManager(load_rule_files([path]), store, Engine(store))


async def _check(url: str, rule_file: Path, mode: str = "auto") -> tuple[RecordingPlacement, list[dict[str, object]]]:
    manager = _manager(rule_file)
    placement = RecordingPlacement(SourceConfig(type="prometheus", url=url, recording_rules=mode),  # type: ignore[arg-type]
                                   manager.groups, writes_back=False)
    source = RemoteSource(SourceConfig(type="prometheus", url=url))
    try:
        with structlog.testing.capture_logs() as logs:
            await placement.check(source)
    finally:
        await source.close()
    return placement, logs


async def test_a_server_that_loads_the_file_runs_the_recording_rules(tmp_path: Path) -> None:
    rule_file = tmp_path / "fleet.rules.yaml"
    rule_file.write_text(RULES)
    async with Prometheus(tmp_path / "prom", [rule_file]) as prom:
        placement, logs = await _check(prom.url, rule_file)
    assert (placement.checked, placement.server_runs_them, placement.missing) == (True, True, {})
    assert [e["event"] for e in logs] == [
        "the server runs the recording rules; the agent evaluates alerting rules only"]


async def test_a_server_without_the_file_gets_the_file_named(tmp_path: Path) -> None:
    rule_file = tmp_path / "fleet.rules.yaml"
    rule_file.write_text(RULES)
    async with Prometheus(tmp_path / "prom", []) as prom:
        placement, logs = await _check(prom.url, rule_file)
    assert (placement.checked, placement.server_runs_them) == (True, False)
    (error,) = [e for e in logs if e["log_level"] == "error"]
    assert error["file"] == str(rule_file) and error["rules"] == ["job:e2e_condition:sum"]
    assert "sre-agent rules export" in str(error["problem"])


async def test_without_a_rules_api_the_agent_evaluates_them_and_asks_again(tmp_path: Path) -> None:
    rule_file = tmp_path / "fleet.rules.yaml"
    rule_file.write_text(RULES)
    async with RecordingServer(responder=reply(404, text="404 page not found")) as srv:
        placement, logs = await _check(srv.url(""), rule_file)
    assert (placement.checked, placement.server_runs_them) == (False, False)
    assert "cannot list the server's recording rules yet" in str(logs[0]["event"])


def test_missing_rules_are_grouped_by_file(tmp_path: Path) -> None:
    rule_file = tmp_path / "fleet.rules.yaml"
    rule_file.write_text(RULES)
    groups = _manager(rule_file).groups
    assert missing_by_file(groups, set()) == {str(rule_file): ["job:e2e_condition:sum"]}
    assert missing_by_file(groups, {"job:e2e_condition:sum"}) == {}
