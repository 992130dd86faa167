"""The rule files, their runbooks and their promtool tests: structure, conventions, links both ways.

``rules/*.rules.yaml`` follow the monitoring-mixin conventions in rules/README.md; every alert
has ``runbooks/<AlertName>.md`` and is unit-tested in ``tests/promtool/<name>.rules.test.yaml``.
The last tests run the real ``promtool`` (Prometheus 2.42; CI installs Debian's prometheus
package) and skip where it is not on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.diagnose.findings import DEFAULT_RUNBOOK_BASE
from agent.diagnose.nccl import judge as nccl
from agent.diagnose.oom import verdict as oom
from agent.diagnose.oom.xid import XID_TABLE
from agent.diagnose.plan import planner
from tests.conftest import REPO

RULES_DIR = REPO / "rules"
RUNBOOKS_DIR = REPO / "runbooks"
RULE_TESTS_DIR = REPO / "tests" / "promtool"
FIXTURES = REPO / "tests" / "fixtures"

RUNBOOK_BASE = "https://github.com/sre-agent/sre-agent/blob/main/runbooks/"
SEVERITIES = {"critical", "warning", "info", "none"}
#: Alert-name prefix per rule file (``<component>.rules.yaml``).
PREFIXES = {"vllm": "VLLM", "lmdeploy": "LMDeploy", "gpu": "GPU", "agent": "SREAgent"}
#: Conventional names that carry no component prefix.
UNPREFIXED = {"Watchdog"}
SECTIONS = ("## Meaning", "## Impact", "## Diagnosis", "## Mitigation")
#: Runbooks that belong to no alert: the index, and the diagnosis pages (checked against finding kinds).
RUNBOOK_EXEMPT = re.compile(r"^(README|diagnosis-.*)\.md$")
ALERT_KEYS = {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
RECORD_KEYS = {"record", "expr", "labels"}
ANNOTATION_KEYS = {"summary", "description", "runbook_url"}
TEMPLATE_FUNCTIONS = {"humanize", "humanize1024", "humanizePercentage", "humanizeDuration", "printf"}
TEMPLATE_KEYWORDS = {"if", "else", "end"}
CAMEL_CASE = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")
RECORD_NAME = re.compile(r"^[a-z][a-z0-9_]*:[a-z][a-z0-9_]*:[a-z0-9_]+$")
FORBIDDEN_WORDS = re.compile(r"\b(TODO|TBD|FIXME)\b")
DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
DURATION_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}

RULE_FILES = sorted(RULES_DIR.glob("*.rules.yaml"))
TEST_FILES = sorted(RULE_TESTS_DIR.glob("*.rules.test.yaml"))


def _load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _component(path: Path) -> str:
    return path.name.removesuffix(".rules.yaml")


def _rules(kind: str) -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in RULE_FILES:
        for group in _load(path)["groups"]:
            for rule in group["rules"]:
                if kind in rule:
                    yield path, rule


ALERTS = [(path, rule) for path, rule in _rules("alert")]
RECORDS = [(path, rule) for path, rule in _rules("record")]
ALERT_IDS = [rule["alert"] for _, rule in ALERTS]
RECORD_IDS = [rule["record"] for _, rule in RECORDS]


def _seconds(text: str) -> float:
    parts = DURATION.findall(str(text))
    assert parts and "".join(n + u for n, u in parts) == str(text), f"not a duration: {text!r}"
    return sum(int(n) * DURATION_SECONDS[u] for n, u in parts)


def _unit_tests() -> Iterator[tuple[Path, dict[str, Any], dict[str, Any]]]:
    for path in TEST_FILES:
        doc = _load(path)
        for group in doc["tests"]:
            yield path, doc, group


def _without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)


# ---- rule files ------------------------------------------------------------------------
def test_rule_files_exist_one_per_component() -> None:
    """There is one rule file per known component and no file for an unknown one."""
    assert {_component(p) for p in RULE_FILES} == set(PREFIXES)


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_rule_file_structure(path: Path) -> None:
    """A rule file is one group with a name, an interval and well-formed alert/record rules."""
    doc = _load(path)
    assert set(doc) == {"groups"}
    assert len(doc["groups"]) == 1, "one group per component"
    group = doc["groups"][0]
    assert set(group) == {"name", "interval", "rules"}
    assert isinstance(group["name"], str) and group["name"]
    _seconds(group["interval"])
    assert group["rules"], "empty group"
    for rule in group["rules"]:
        assert ("alert" in rule) != ("record" in rule), rule
        assert set(rule) <= (ALERT_KEYS if "alert" in rule else RECORD_KEYS), rule
        assert isinstance(rule["expr"], str) and rule["expr"].strip(), rule
        if "for" in rule:
            _seconds(rule["for"])


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_recording_rules_come_first(path: Path) -> None:
    """Within a group every recording rule precedes the first alert."""
    kinds = ["alert" if "alert" in r else "record" for r in _load(path)["groups"][0]["rules"]]
    assert kinds == sorted(kinds, key=lambda k: k == "alert")


def test_names_are_unique() -> None:
    """No alert or recording rule name is defined twice across all rule files."""
    assert len(ALERT_IDS) == len(set(ALERT_IDS))
    assert len(RECORD_IDS) == len(set(RECORD_IDS))


@pytest.mark.parametrize(("path", "rule"), RECORDS, ids=RECORD_IDS)
def test_recording_rule_name_is_level_metric_operations(path: Path, rule: dict[str, Any]) -> None:
    """Recording rules are named level:metric:operations in lower case."""
    assert RECORD_NAME.match(rule["record"]), rule["record"]


@pytest.mark.parametrize(("path", "rule"), ALERTS, ids=ALERT_IDS)
def test_alert_name_is_camel_case_with_component_prefix(path: Path, rule: dict[str, Any]) -> None:
    """Alert names are CamelCase and start with their rule file's component prefix."""
    name = rule["alert"]
    assert CAMEL_CASE.match(name), name
    assert name in UNPREFIXED or name.startswith(PREFIXES[_component(path)]), name


@pytest.mark.parametrize(("path", "rule"), ALERTS, ids=ALERT_IDS)
def test_alert_labels_and_annotations(path: Path, rule: dict[str, Any]) -> None:
    """Each alert has an allowed severity, a static one-sentence summary, a templated
    description and the runbook_url of its own runbook."""
    name = rule["alert"]
    severity = rule["labels"]["severity"]
    assert severity in SEVERITIES
    assert (severity == "none") == (name in UNPREFIXED), "severity none is for the watchdog only"
    notes = rule["annotations"]
    assert set(notes) == ANNOTATION_KEYS
    summary = notes["summary"]
    assert "{{" not in summary and "\n" not in summary, summary
    assert summary.endswith(".") and summary.count(". ") == 0 and len(summary) <= 80, summary
    assert notes["description"].strip()
    if name not in UNPREFIXED:
        assert "{{ $labels." in notes["description"], "description names the series"
    assert notes["runbook_url"] == f"{RUNBOOK_BASE}{name}.md"


@pytest.mark.parametrize(("path", "rule"), ALERTS, ids=ALERT_IDS)
def test_templates_use_only_the_supported_subset(path: Path, rule: dict[str, Any]) -> None:
    """Annotation templates use only $labels.x, $value, the humanize family, printf and if/else."""
    for text in rule["annotations"].values():
        assert text.count("{{") == text.count("}}"), text
        for action in re.findall(r"{{(.*?)}}", text, flags=re.DOTALL):
            words = _without_strings(action).replace("|", " ").split()
            assert words, f"empty action in {text!r}"
            for word in words:
                ok = (
                    word in TEMPLATE_FUNCTIONS
                    or word in TEMPLATE_KEYWORDS
                    or word in {"$value", '""'}
                    or re.fullmatch(r"\$labels\.[A-Za-z_][A-Za-z0-9_]*", word)
                )
                assert ok, f"{word!r} is outside the template subset in {text!r}"


@pytest.mark.parametrize(("path", "rule"), ALERTS + RECORDS, ids=ALERT_IDS + RECORD_IDS)
def test_expressions_avoid_at_modifier_and_subqueries(path: Path, rule: dict[str, Any]) -> None:
    """Expressions use neither the @ modifier nor subqueries."""
    expr = _without_strings(rule["expr"])
    assert "@" not in expr
    assert not re.search(r"\[[^\]]*:[^\]]*\]", expr), "subquery"


@pytest.mark.parametrize("path", RULE_FILES, ids=lambda p: p.name)
def test_every_alert_is_explained_in_a_comment(path: Path) -> None:
    """A YAML comment directly above each alert explains its threshold."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^\s*- alert:", line):
            assert lines[i - 1].strip().startswith("#"), f"{path.name}:{i + 1} has no comment above it"


def test_readme_lists_every_alert_and_recording_rule() -> None:
    """rules/README.md has a table row for every alert and every recording rule."""
    lines = (RULES_DIR / "README.md").read_text(encoding="utf-8").splitlines()
    rows = {line.split("|")[1].strip().strip("`") for line in lines if line.startswith("| `")}
    assert not (set(ALERT_IDS) | set(RECORD_IDS)) - rows


def test_no_unfinished_markers_in_rules() -> None:
    """No rule file and not rules/README.md carries an unfinished-work marker."""
    for path in [*RULE_FILES, RULES_DIR / "README.md"]:
        assert not FORBIDDEN_WORDS.search(path.read_text(encoding="utf-8")), path.name


# ---- runbooks --------------------------------------------------------------------------
RUNBOOKS = sorted(p for p in RUNBOOKS_DIR.glob("*.md") if not RUNBOOK_EXEMPT.match(p.name))
DIAGNOSIS_RUNBOOKS = sorted(RUNBOOKS_DIR.glob("diagnosis-*.md"))
FINDING_KINDS = (*oom.KINDS, *nccl.KINDS, *planner.KINDS)


def _xids(alertname: str) -> tuple[set[int], set[int]]:
    """The XIDs an alert's expression names: in its xid=~"..." regexes and its DCGM == comparisons."""
    expr = next(rule["expr"] for _, rule in ALERTS if rule["alert"] == alertname)
    regexes = {int(x) for group in re.findall(r'xid=~"([0-9|]+)"', expr) for x in group.split("|")}
    dcgm = {int(x) for x in re.findall(r"DCGM_FI_DEV_XID_ERRORS == (\d+)", expr)}
    return regexes, dcgm


def test_xid_alerts_agree_with_the_diagnosis_table() -> None:
    """GPUHardwareXIDError names exactly the XIDs the OOM diagnosis calls hardware (both sources), and
    GPUApplicationXIDError only XIDs it calls application faults: one table, two consumers."""
    hardware = {code for code, info in XID_TABLE.items() if info.hardware}
    assert _xids("GPUHardwareXIDError") == (hardware, hardware)
    app_regex, app_dcgm = _xids("GPUApplicationXIDError")
    assert app_regex and app_regex <= set(XID_TABLE) - hardware and app_dcgm <= app_regex


def test_every_finding_kind_has_a_runbook() -> None:
    """runbooks/diagnosis-<kind>.md exists for every kind of finding the diagnoses emit."""
    missing = [k for k in FINDING_KINDS if not (RUNBOOKS_DIR / f"diagnosis-{k}.md").is_file()]
    assert not missing


def test_every_diagnosis_runbook_has_a_finding_kind() -> None:
    """Every runbooks/diagnosis-*.md belongs to a finding kind some diagnosis emits."""
    orphans = [p.name for p in DIAGNOSIS_RUNBOOKS if p.stem.removeprefix("diagnosis-") not in FINDING_KINDS]
    assert DIAGNOSIS_RUNBOOKS and not orphans


def test_findings_from_real_evidence_link_existing_runbooks() -> None:
    """Every finding the diagnoses produce from the real fixtures links a runbook that exists."""
    findings = []
    for path in sorted((FIXTURES / "logs").glob("*")):
        if path.is_file() and not path.name.endswith(".md"):
            findings += oom.diagnose_oom(path.read_text(encoding="utf-8", errors="replace"))
    for path in sorted((FIXTURES / "nccl").glob("*.txt")):
        findings += nccl.check(nccl.parse_nccl(path.read_text(encoding="utf-8")))[1]
    inp = planner.PlanInput(planner.find_model("Llama-3-70B"), planner.gpu_memory_bytes("A100-80GB"),
                            max_model_len=8192)
    findings += planner.plan(inp).recommendations
    assert {f.kind for f in findings} >= {"gpu-oom-runtime", "nccl-bandwidth-low", "weights-do-not-fit"}
    prefix = DEFAULT_RUNBOOK_BASE
    bad = [(f.kind, f.runbook_url) for f in findings if not f.runbook_url.startswith(prefix)
           or not (RUNBOOKS_DIR / f.runbook_url.removeprefix(prefix)).is_file()]
    assert not bad


@pytest.mark.parametrize("path", DIAGNOSIS_RUNBOOKS, ids=lambda p: p.stem)
def test_diagnosis_runbook_format(path: Path) -> None:
    """A diagnosis runbook has its name as H1, the four sections in order, commands, nothing unfinished."""
    test_runbook_format(path)


def test_every_alert_has_a_runbook() -> None:
    """runbooks/<AlertName>.md exists for every alert."""
    missing = [name for name in ALERT_IDS if not (RUNBOOKS_DIR / f"{name}.md").is_file()]
    assert not missing


def test_every_runbook_has_an_alert() -> None:
    """Every runbook (besides README.md and diagnosis-*.md) belongs to an alert."""
    orphans = [p.name for p in RUNBOOKS if p.stem not in ALERT_IDS]
    assert not orphans


@pytest.mark.parametrize("path", RUNBOOKS, ids=lambda p: p.stem)
def test_runbook_format(path: Path) -> None:
    """A runbook's H1 is its alert name, the four sections follow in order, nothing is unfinished."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == f"# {path.stem}"
    headings = [line for line in lines if line.startswith("## ")]
    assert [h for h in headings if h in SECTIONS] == list(SECTIONS)
    for section, following in zip(SECTIONS, (*SECTIONS[1:], None), strict=True):
        body = text.split(section + "\n", 1)[1]
        body = body.split(following + "\n", 1)[0] if following else body
        assert body.strip(), f"{section} is empty"
    assert "```" in text.split("## Diagnosis\n", 1)[1], "Diagnosis has copy-pasteable commands"
    assert not FORBIDDEN_WORDS.search(text)


# ---- promtool unit tests ---------------------------------------------------------------
def test_every_rule_file_has_a_test_file() -> None:
    """tests/promtool/<name>.rules.test.yaml exists for every rule file, tests only that file,
    and no test file is left without a rule file."""
    assert {p.name.removesuffix(".test.yaml") for p in TEST_FILES} == {p.name.removesuffix(".yaml") for p in RULE_FILES}
    for path in TEST_FILES:
        rule_name = path.name.removesuffix(".test.yaml") + ".yaml"
        assert _load(path)["rule_files"] == [f"../../rules/{rule_name}"]


def test_every_alert_is_unit_tested() -> None:
    """Every alert appears in some alert_rule_test."""
    tested = {t["alertname"] for _, _, group in _unit_tests() for t in group.get("alert_rule_test", [])}
    assert not set(ALERT_IDS) - tested


def test_every_recording_rule_is_unit_tested() -> None:
    """Every recording rule is queried by some promql_expr_test."""
    exprs = " ".join(t["expr"] for _, _, group in _unit_tests() for t in group.get("promql_expr_test", []))
    untested = [name for name in RECORD_IDS if not re.search(rf"(?<![\w:]){re.escape(name)}(?![\w:])", exprs)]
    assert not untested


def test_every_alert_is_tested_at_its_for_boundary() -> None:
    """Each alert fires in some test at an evaluation where the same test expects no alert one
    evaluation interval earlier (for `for: 0` alerts that is the evaluation before the event)."""
    unchecked = set(ALERT_IDS) - UNPREFIXED  # the watchdog fires from the first evaluation
    for _, doc, group in _unit_tests():
        step = _seconds(doc["evaluation_interval"])
        cases = group.get("alert_rule_test", [])
        for case in cases:
            if case["exp_alerts"]:
                at = _seconds(case["eval_time"])
                if any(
                    c["alertname"] == case["alertname"]
                    and not c["exp_alerts"]
                    and _seconds(c["eval_time"]) == at - step
                    for c in cases
                ):
                    unchecked.discard(case["alertname"])
    assert not unchecked


def test_expected_alerts_carry_the_rules_labels_and_runbook() -> None:
    """Expected alerts in the unit tests name the rule's labels and runbook_url exactly, and
    every expected label is a YAML string (an unquoted 00000000:18:00.0 is a YAML 1.1 number)."""
    rules = {rule["alert"]: rule for _, rule in ALERTS}
    for _, _, group in _unit_tests():
        for case in group.get("alert_rule_test", []):
            rule = rules[case["alertname"]]
            for alert in case["exp_alerts"]:
                assert all(isinstance(v, str) for v in alert["exp_labels"].values()), alert["exp_labels"]
                for key, value in rule.get("labels", {}).items():
                    assert alert["exp_labels"][key] == value, case["alertname"]
                assert alert["exp_annotations"]["runbook_url"] == rule["annotations"]["runbook_url"]


def test_no_machine_specific_paths() -> None:
    """Rule files, runbooks and rule tests contain no absolute paths of one machine."""
    pattern = re.compile(r"(?<![\w.])/(home|Users|work|tmp)/")
    for path in [*RULES_DIR.iterdir(), *RUNBOOKS_DIR.iterdir(), *RULE_TESTS_DIR.iterdir()]:
        assert not pattern.search(path.read_text(encoding="utf-8")), path


# ---- promtool --------------------------------------------------------------------------
def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not on PATH (CI installs Debian's prometheus package)")
    return found


def test_promtool_check_rules() -> None:
    """promtool check rules accepts every rule file."""
    result = subprocess.run(
        [_promtool(), "check", "rules", *map(str, RULE_FILES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_test_rules() -> None:
    """promtool test rules passes every unit-test file."""
    result = subprocess.run(
        [_promtool(), "test", "rules", *map(str, TEST_FILES)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
