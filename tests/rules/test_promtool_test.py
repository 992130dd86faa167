"""Parity of `sre-agent rules test` with `promtool test rules` (Prometheus 2.42), the real thing.

Both run the same promtool-format files. Beyond the shipped tests (which both must
pass), every alert test is re-run with its eval_time moved around the `for` boundary and
every expression test with its eval_time moved, keeping the expectations: some variants
pass and some fail, and the agent must pass and fail exactly the same ones as promtool.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agent.config import format_duration, parse_duration
from agent.gocompat import yamlv3
from agent.rules.promtool_test import run_test_file
from tests.conftest import REPO

TEST_FILES = sorted((REPO / "tests" / "promtool").glob("*.yaml"))
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (CI installs Debian's prometheus)")


def _promtool_failed_groups(path: Path) -> tuple[int, set[str]]:
    assert PROMTOOL is not None
    res = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, check=False,
                         timeout=300)
    return res.returncode, set(re.findall(r"^\s*name: (\S+),$", res.stdout + res.stderr, re.MULTILINE))


@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_shipped_rule_tests_pass_on_the_agent(path: Path) -> None:
    """Every shipped promtool test file passes on the agent's own engine."""
    result = run_test_file(path)
    assert result.ok, "\n".join(result.failures)
    assert result.tests > 0


@needs_promtool
@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_shipped_rule_tests_pass_on_promtool(path: Path) -> None:
    """Every shipped promtool test file passes on promtool itself."""
    code, failed = _promtool_failed_groups(path)
    assert code == 0 and not failed


def _variants(doc: dict[str, Any]) -> dict[str, Any]:
    """One test group per (alert or expr test, eval_time shift), expectations unchanged."""
    step = parse_duration(doc.get("evaluation_interval", "1m"))
    groups = []
    for gi, group in enumerate(doc.get("tests") or []):
        base = {k: v for k, v in group.items() if k not in ("alert_rule_test", "promql_expr_test", "name")}
        for ti, t in enumerate(group.get("alert_rule_test") or []):
            for shift in (-2, -1, 1):
                at = parse_duration(t["eval_time"]) + shift * step
                if at < 0:
                    continue
                g = copy.deepcopy(base)
                g["name"] = f"g{gi}-alert{ti}-shift{shift}"
                g["alert_rule_test"] = [{**t, "eval_time": format_duration(at)}]
                groups.append(g)
        for ti, t in enumerate(group.get("promql_expr_test") or []):
            for shift in (-1, 1):
                at = parse_duration(t["eval_time"]) + shift * step
                if at < 0:
                    continue
                g = copy.deepcopy(base)
                g["name"] = f"g{gi}-expr{ti}-shift{shift}"
                g["promql_expr_test"] = [{**t, "eval_time": format_duration(at)}]
                groups.append(g)
    return {**{k: v for k, v in doc.items() if k != "tests"}, "tests": groups}


@needs_promtool
@pytest.mark.parametrize("path", TEST_FILES, ids=[p.name for p in TEST_FILES])
def test_agent_and_promtool_agree_on_shifted_tests(path: Path, tmp_path: Path) -> None:
    """Around every `for` boundary and eval time, the agent passes and fails exactly what promtool does."""
    import yaml

    doc = yamlv3.load(path.read_text())
    doc["rule_files"] = [str((path.parent / f).resolve()) for f in doc["rule_files"]]
    variants = _variants(doc)
    alert_groups = [g for g in variants["tests"] if "alert_rule_test" in g]
    expr_groups = [g for g in variants["tests"] if "promql_expr_test" in g]
    # promtool names the failing group only for alert tests, so those run batched (in two files, one
    # promtool each) and each expression variant runs in a file of its own. The promtool runs go two
    # at a time in threads (each waits on its process) while the agent checks the same files here.
    halves = [alert_groups[::2], alert_groups[1::2]]
    batches = []
    for i, half in enumerate(h for h in halves if h):
        batches.append(tmp_path / f"alerts{i}.yaml")
        batches[-1].write_text(yaml.safe_dump({**variants, "tests": half}, sort_keys=False))
    singles = {}
    for g in expr_groups:
        singles[g["name"]] = tmp_path / f"{g['name']}.yaml"
        singles[g["name"]].write_text(yaml.safe_dump({**variants, "tests": [g]}, sort_keys=False))
    with ThreadPoolExecutor(max_workers=2) as pool:
        promtool_batches = [pool.submit(_promtool_failed_groups, b) for b in batches]
        promtool_singles = {name: pool.submit(_promtool_failed_groups, f) for name, f in singles.items()}
        ours = {name for b in batches for name in run_test_file(b).failed_groups}
        ours |= {name for name, f in singles.items() if not run_test_file(f).ok}
        theirs = {name for job in promtool_batches for name in job.result()[1]}
        theirs |= {name for name, job in promtool_singles.items() if job.result()[0] != 0}
    assert ours == theirs, f"only the agent failed: {sorted(ours - theirs)}; only promtool: {sorted(theirs - ours)}"
    assert theirs, "no variant failed: the shifts did not exercise any boundary"
    assert len(theirs) < len(variants["tests"]), "every variant failed: the shifts are too coarse to compare"


@pytest.mark.parametrize(("text", "line", "key", "first"), [
    ("rule_files: []\nevaluation_interval: 1m\nevaluation_interval: 5m\ntests: []\n", 3, "evaluation_interval", 2),
    ("rule_files: []\ntests:\n  - interval: 1m\n    input_series:\n      - series: up\n        values: '1'\n"
     "        series: down\n", 7, "series", 5),
    ("rule_files: []\ntests:\n  - alert_rule_test:\n      - {eval_time: 1m, alertname: A, eval_time: 2m}\n",
     4, "eval_time", 4),
    ("rule_files: []\ntests:\n  - promql_expr_test:\n      - expr: up\n        eval_time: 1m\n        exp_samples:\n"
     "          - labels: 'up'\n            value: 1\n            labels: 'down'\n", 9, "labels", 7),
], ids=["top-level", "input-series", "flow-alert-test", "exp-samples"])
def test_duplicate_keys_in_a_test_file_fail_it_naming_line_and_key(
        tmp_path: Path, text: str, line: int, key: str, first: int) -> None:
    """A promtool test file with a key given twice fails to load, as promtool's yaml.v3 refuses it."""
    path = tmp_path / "dup.test.yaml"
    path.write_text(text)
    result = run_test_file(path)
    assert not result.ok
    want = f'cannot read test file: line {line}: mapping key "{key}" already defined at line {first}'
    assert result.failures == [want]
