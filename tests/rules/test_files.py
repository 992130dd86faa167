"""Tests for agent.rules.files: rule files validated like promtool, every problem named by file, group and rule."""

from __future__ import annotations

import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from agent.errors import RuleError
from agent.rules.files import load_rule_files
from tests.yamlbombs import BILLION_LAUGHS, DEEP_BLOCK, DEEP_FLOW, MERGE_BOMB, write_huge

GOOD = """
groups:
  - name: vllm
    interval: 30s
    rules:
      - record: job:x:sum
        expr: sum by (job) (x)
      - alert: XHigh
        expr: job:x:sum > 1
        for: 5m
        labels: {severity: warning}
        annotations: {summary: X is high., description: '{{ $labels.job }} at {{ $value | humanize }}'}
"""

BAD = {
    "syntax": ("- record: a\n        expr: sum(", "could not parse expression"),
    "both": ("- record: a\n        alert: B\n        expr: x", "only one of 'record' and 'alert'"),
    "neither": ("- expr: x", "one of 'record' or 'alert' must be set"),
    "record-name": ("- record: 'bad name'\n        expr: x", "invalid recording rule name"),
    "record-for": ("- record: a\n        expr: x\n        for: 5m", "invalid field 'for' in recording rule"),
    "no-expr": ("- alert: A", "field 'expr' must be set"),
    "bad-for": ("- alert: A\n        expr: x\n        for: soon", "not a duration"),
    "bad-label": ("- alert: A\n        expr: x\n        labels: {'bad-name': x}", "invalid label name"),
    "unknown-key": ("- alert: A\n        expr: x\n        severity: page", "unknown field 'severity'"),
    # a back-reference is refused by the parser's own check; a repeat over 1000 by RE2, naming the matcher
    "re2-matcher": ("- alert: A\n        expr: x{job=~'(a)\\\\1'}", "illegal regex for (a)\\1"),
    "re2-repeat": ("- record: a\n        expr: x{job!~'a{1001}'}", "matcher job!~: not a regular expression in RE2"),
    "template": ("- alert: A\n        expr: x\n        annotations: {d: '{{ $value | nosuchfunc }}'}", "nosuchfunc"),
}


def _file(tmp_path: Path, body: str, name: str = "r.rules.yaml") -> Path:
    f = tmp_path / name
    f.write_text(textwrap.dedent(body))
    return f


def test_good_file_loads() -> None:
    """A valid file gives its groups and rules in order with their settings."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        (g,) = load_rule_files([_file(Path(d), GOOD)])
    assert g.name == "vllm" and g.interval_s == 30
    assert [r.kind for r in g.rules] == ["record", "alert"]
    assert g.rules[1].for_s == 300 and g.rules[1].labels == {"severity": "warning"}
    assert g.metric_names() == (frozenset({"x", "job:x:sum"}), False)


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_rule_named_by_file_group_and_rule(tmp_path: Path, case: str) -> None:
    """Each kind of broken rule is reported with file, group, rule index and name."""
    rule, message = BAD[case]
    f = _file(tmp_path, f"groups:\n  - name: g\n    rules:\n      {rule}\n")
    with pytest.raises(RuleError) as info:
        load_rule_files([f])
    (err,) = info.value.errors
    assert err.startswith(f'{f}: group "g", rule 1') and message in err, err


def test_all_problems_reported_together(tmp_path: Path) -> None:
    """Problems in several files and groups are listed in one error."""
    a = _file(tmp_path, "groups:\n  - name: g\n    rules:\n      - expr: x\n", "a.yaml")
    b = _file(tmp_path, "groups:\n  - name: g\n    rules: []\n  - name: g\n    rules: []\n", "b.yaml")
    with pytest.raises(RuleError) as info:
        load_rule_files([a, b, tmp_path / "missing.yaml"])
    errs = info.value.errors
    assert len(errs) == 3
    assert "repeated in the same file" in errs[1] and "cannot read rule file" in errs[2]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (CI installs Debian's prometheus)")
@pytest.mark.parametrize("case", sorted(BAD))
def test_promtool_rejects_what_we_reject(tmp_path: Path, case: str) -> None:
    """Differential: promtool check rules also rejects every file the agent rejects (and accepts GOOD)."""
    rule, _ = BAD[case]
    bad = _file(tmp_path, f"groups:\n  - name: g\n    rules:\n      {rule}\n")
    good = _file(tmp_path, GOOD, "good.yaml")
    run = [shutil.which("promtool") or "promtool", "check", "rules"]
    assert subprocess.run([*run, str(good)], capture_output=True, check=False).returncode == 0
    res = subprocess.run([*run, str(bad)], capture_output=True, text=True, check=False)
    assert res.returncode != 0, res.stdout


@pytest.mark.parametrize(("doc", "message"), [
    (BILLION_LAUGHS, "excessive aliasing"), (MERGE_BOMB, "excessive aliasing"), (DEEP_FLOW, "exceeded max depth"),
    (DEEP_BLOCK, "exceeded max depth"),
], ids=["billion-laughs", "merge-keys", "deep-flow", "deep-block"])
def test_yaml_bombs_are_rule_errors_naming_the_file(tmp_path: Path, doc: str, message: str) -> None:
    """An alias or nesting bomb in a rule file is a RuleError naming the file, quoting no expanded data."""
    path = tmp_path / "bomb.rules.yaml"
    path.write_text(doc, encoding="utf-8")
    with pytest.raises(RuleError, match=message) as err:
        load_rule_files([path])
    assert str(err.value).startswith(f"{path}: ") and "lol" not in str(err.value) and len(str(err.value)) < 600


def test_huge_rule_file_refused(tmp_path: Path) -> None:
    """A rule file over the YAML size cap is a RuleError naming the file and the limit."""
    path = write_huge(tmp_path / "huge.rules.yaml")
    with pytest.raises(RuleError, match="byte limit") as err:
        load_rule_files([path])
    assert str(path) in str(err.value)


#: Rule files with a key given twice, as (file text, line of the second key, the key, line of the first).
DUPLICATE_KEYS = {
    "expr": ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n        expr: up == 1\n",
             6, "expr", 5),
    "labels-nested": ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        labels:\n"
                      "          severity: page\n          severity: ticket\n", 8, "severity", 7),
    "flow-annotations": ("groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n"
                         "        annotations: {summary: a, summary: b}\n", 6, "summary", 6),
    "group-name": ("groups:\n  - name: g\n    name: h\n    rules: []\n", 3, "name", 2),
    "top-level": ("groups: []\ngroups:\n  - name: g\n    rules: []\n", 2, "groups", 1),
    "quoted-twin": ("groups:\n  - name: g\n    rules:\n      - record: a\n        'expr': x\n        expr: y\n",
                    6, "expr", 5),
}


@pytest.mark.parametrize("case", sorted(DUPLICATE_KEYS))
def test_duplicate_keys_refused_naming_file_line_and_key(tmp_path: Path, case: str) -> None:
    """A key given twice anywhere in a rule file is refused as yaml.v3 (promtool) does: file, line and key."""
    text, line, key, first = DUPLICATE_KEYS[case]
    f = _file(tmp_path, text)
    with pytest.raises(RuleError) as info:
        load_rule_files([f])
    (err,) = info.value.errors
    assert err == f'{f}: not valid YAML: line {line}: mapping key "{key}" already defined at line {first}'


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (CI installs Debian's prometheus)")
@pytest.mark.parametrize("case", sorted(DUPLICATE_KEYS))
def test_promtool_rejects_the_duplicate_keys_we_reject(tmp_path: Path, case: str) -> None:
    """Differential: promtool check rules refuses every rule file with a duplicate key, naming the same line."""
    text, line, key, first = DUPLICATE_KEYS[case]
    bad = _file(tmp_path, text)
    res = subprocess.run([shutil.which("promtool") or "promtool", "check", "rules", str(bad)],
                         capture_output=True, text=True, check=False)
    assert res.returncode != 0, res.stdout
    assert f'line {line}: mapping key "{key}" already defined at line {first}' in res.stdout + res.stderr
