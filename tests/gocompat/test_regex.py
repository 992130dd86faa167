"""Go's regexps on RE2: compiling as Go does, refusing what Go refuses, linear time on hostile
input, and ``Regexp.Expand``, the replacement syntax ``label_replace`` and ``reReplaceAll`` share."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.config import Config
from agent.errors import ConfigError, RegexError, RuleError, StoreError
from agent.gocompat.regex import compile_anchored, compile_go, expand, match_anchored
from agent.matchers import AlertMatcher, parse_matcher
from agent.rules.files import load_rule_files
from agent.store import SeriesMatcher
from tests.conftest import REPO

_ADDR = re.compile(r"(?P<host>[^:]+):(\d+)")


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("$1", "db-1"),
        ("${2}x", "9100x"),
        ("${host}:$2", "db-1:9100"),
        ("$host-$$", "db-1-$"),
        ("$0", "db-1:9100"),
        ("plain", "plain"),
    ],
)
def test_references_expand_to_group_text(template: str, want: str) -> None:
    """``$n``, ``${n}``, ``$name``, ``${name}`` are the group's text and ``$$`` is a dollar."""
    m = _ADDR.fullmatch("db-1:9100")
    assert m is not None
    assert expand(template, m) == want


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("$2x", ""),  # the name is "2x", not group 2 then "x"
        ("$9", ""),  # no group 9
        ("$01", ""),  # a leading zero is not a number, and no group is named "01"
        ("${nope}!", "!"),
    ],
)
def test_unknown_groups_expand_to_nothing(template: str, want: str) -> None:
    """A reference to a group the regexp lacks expands to the empty string, as in Go."""
    m = _ADDR.fullmatch("db-1:9100")
    assert m is not None
    assert expand(template, m) == want


@pytest.mark.parametrize("template", ["$", "${", "a$-b", "${}"])
def test_dollar_that_starts_no_reference_stays(template: str) -> None:
    """A ``$`` not followed by a name, ``{name}`` or ``$`` is copied as it is."""
    m = _ADDR.fullmatch("db-1:9100")
    assert m is not None
    assert expand(template, m) == template


def test_group_that_did_not_take_part_is_empty() -> None:
    """A group outside the matched alternative expands to nothing."""
    m = re.fullmatch(r"(a)|(b)", "b")
    assert m is not None
    assert expand("[$1][$2]", m) == "[][b]"


def test_expand_works_on_re2_matches() -> None:
    """``expand`` reads an RE2 match (what label_replace hands it) as it reads an ``re`` one."""
    m = compile_anchored("(?P<host>[^:]+):(\\d+)").search("db-1:9100")
    assert m is not None
    assert expand("${host}/$2/$3", m) == "db-1/9100/"


def test_anchoring_is_by_text_as_in_prometheus() -> None:
    """``^(?:p)$`` is built by text, so ``a)|(b`` means ``^(?:a)|(b)$`` there and here."""
    test = match_anchored("a)|(b")
    assert test("ax") and test("xb") and not test("x")


@pytest.mark.parametrize(("pattern", "reason"), [
    ("(a)\\1", "invalid escape sequence"),
    ("a{1001}", "invalid repetition size"),
    ("(?=a)", "invalid perl operator"),
    ("(?<n>a)", "(?<"),
    ("\\C", "\\C"),
    ("(", "missing )"),
    ("a\ud800", "not valid UTF-8"),
])
def test_refusal_names_what_and_why(pattern: str, reason: str) -> None:
    """A pattern Go's RE2 refuses raises RegexError with the caller's name for it, the pattern and RE2's reason."""
    with pytest.raises(RegexError) as info:
        compile_go(pattern, what="matcher job=~")
    assert str(info.value).startswith("matcher job=~: not a regular expression in RE2 syntax: ")
    assert repr(pattern) in str(info.value) and reason in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("pattern", ["\\Q\\C(?<\\E", "[(?<]", "\\(?<", "x\\\\C"])
def test_go_only_checks_skip_literal_text(pattern: str) -> None:
    """``\\C`` and ``(?<`` are refused only where Go reads them as syntax, not inside ``\\Q...\\E`` or a class."""
    compile_go(pattern)


@pytest.mark.parametrize("pattern", ["[\\C]", "[]\\Ca]"])
def test_go_refuses_backslash_c_in_a_class_too(pattern: str) -> None:
    """An escape inside a bracket class is still an escape in Go, so ``[\\C]`` is refused too."""
    with pytest.raises(RegexError, match="C"):
        compile_go(pattern)


_PIECES = st.sampled_from(["a", "b", "ab", "-", ".*", ".+", "|", "x.y", "\\.", "(?i)a"])


@settings(max_examples=400, deadline=None)
@given(pattern=st.lists(_PIECES, max_size=5).map("".join), value=st.text(alphabet="abAB-.\nxy", max_size=8))
def test_fast_paths_agree_with_re2(pattern: str, value: str) -> None:
    """Whatever shortcut ``match_anchored`` takes (literal, set, ``.*``, prefix, suffix, contains), RE2 agrees."""
    assert match_anchored(pattern)(value) is (compile_anchored(pattern).search(value) is not None)


#: Patterns that make a backtracking engine take exponential (or high polynomial) time on a
#: long value that almost matches; each is tried against 10,000-character label values.
PATHOLOGICAL = ["(a+)+$", "(a|a)*b", "(.*a){20}", "(a*)*b", "(\\w+\\s?)+$", "(x+x+)+y"]

_CHILD = """
import json, sys, time
from agent.store import SeriesMatcher
from agent.matchers import AlertMatcher
from agent.gocompat.regex import compile_anchored
from agent.rules.template.funcs import FUNCS
patterns = json.loads(sys.argv[1])
values = ["a" * 10_000, "a" * 9_999 + "!", "x" * 10_000, "a" * 5_000 + "\\n" + "a" * 4_999]
out = {}
for p in patterns:
    t0 = time.perf_counter()
    sm, am, rx = SeriesMatcher("v", "=~", p), AlertMatcher("v", "=~", p), compile_anchored(p)
    for v in values:
        sm.matches(v); am.matches({"v": v}); rx.search(v); FUNCS["match"]([p, v])
    out[p] = time.perf_counter() - t0
print(json.dumps(out))
"""


def test_nested_quantifiers_on_long_values_finish() -> None:
    """Nested-quantifier patterns against 10,000-character values finish at once in every matcher
    (series, alert/silence, label_replace, template ``match``): RE2 is linear, backtracking would not end."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(PATHOLOGICAL)], capture_output=True, text=True,
                          timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    seconds = json.loads(proc.stdout)
    assert set(seconds) == set(PATHOLOGICAL)
    slow = {p: t for p, t in seconds.items() if t > 5.0}  # generous: RE2 takes milliseconds
    assert not slow


@pytest.mark.skipif(shutil.which("amtool") is None, reason="amtool not installed (CI installs prometheus-alertmanager)")
def test_group_nesting_limit_is_gos_as_amtool_shows(tmp_path: Path) -> None:
    """998 nested groups in a matcher pass and 999 are refused ("expression nests too deeply"), here and in amtool."""
    for depth, ok in ((998, True), (999, False)):
        pattern = "(" * depth + "x" + ")" * depth
        config = tmp_path / f"am{depth}.yml"
        config.write_text("route:\n  receiver: r\n  routes:\n    - receiver: r\n"
                          f"      matchers: ['a=~\"{pattern}\"']\nreceivers:\n  - name: r\n")
        amtool = subprocess.run([str(shutil.which("amtool")), "check-config", str(config)],
                                capture_output=True, text=True, timeout=60, check=False)
        assert (amtool.returncode == 0) is ok, amtool.stdout + amtool.stderr
        if ok:
            AlertMatcher("a", "=~", pattern)
        else:
            assert "nests too deeply" in amtool.stdout + amtool.stderr
            with pytest.raises(RegexError, match="expression nests too deeply") as err:
                AlertMatcher("a", "=~", pattern)
            assert len(str(err.value)) < 400  # the 2,000-character pattern is cut, not echoed


#: Repeat counts Go's regexp/syntax refuses (a count over 1000, nested counts whose product is over 1000, a
#: repeat of a repeat, and the program-size estimate), and their nearest twins it accepts.
REPEATS_REFUSED = ["x{1001}", "x{1001,}", "x{2,1001}", "x{1000,1001}", "x{1000}{1000}", "(x{500}){500}",
                   "(?:x{2}){501}", "(?:(?:x{10}){10}){11}", "(?i)x{5000}", "(?:" + "a*" * 1119 + "){1000}"]
REPEATS_ACCEPTED = ["x{1000}", "x{1000,}", "x{0,1000}", "(?:x{2}){500}", "(?:(?:x{10}){10}){10}", "x{1001",
                    "x{01001}", "x{,1001}"]
#: Just under Go's size limit: Go (and everything but the rule loader) accepts it.
BIG_ACCEPTED = "(?:" + "a*" * 1118 + "){1000}"


def _rule_file(pattern: str) -> Path:
    folder = Path(tempfile.mkdtemp())
    path = folder / "r.rules.yaml"
    path.write_text("groups:\n  - name: g\n    rules:\n      - record: r\n        expr: up{job=~"
                    + json.dumps(pattern) + "}\n")
    return path


def _every_entry(pattern: str) -> list[str]:
    """Each place a user's regex reaches: what it says (``"ok"`` or the error's type), in a fixed order."""
    matcher = "a=~" + json.dumps(pattern)
    attempts: list[Callable[[], object]] = [
        lambda: compile_go(pattern, what="regexp"),  # template functions, the planner's ignore lists
        lambda: compile_anchored(pattern, what="label_replace()"),
        lambda: parse_matcher(matcher),  # silences (API, UI, state file), routes, actions
        lambda: SeriesMatcher("job", "=~", pattern),  # PromQL selectors
        lambda: load_rule_files([_rule_file(pattern)]),  # rules check, the rule manager
        lambda: Config.model_validate({"actions": [{"type": "diagnose", "match_re": {"a": pattern}}]}),
    ]
    out = []
    for attempt in attempts:
        try:
            attempt()
            out.append("ok")
        except (RegexError, StoreError, RuleError, ConfigError, ValueError) as exc:
            if not isinstance(exc, RuleError):  # promql-parser's own message quotes a regex whole
                assert len(str(exc)) < 1200  # a long pattern is cut in the message, not echoed
            out.append(type(exc).__name__)
    return out


@pytest.mark.parametrize("pattern", REPEATS_REFUSED, ids=lambda p: p[:24])
def test_repeat_counts_go_refuses_are_refused_everywhere(pattern: str) -> None:
    """Every entry point for a user's regex refuses what Go's regexp refuses, with its own error."""
    assert "ok" not in _every_entry(pattern)


@pytest.mark.parametrize("pattern", [*REPEATS_ACCEPTED, pytest.param(BIG_ACCEPTED, marks=pytest.mark.xfail(
    strict=True, reason="promql-parser's own (Rust regex) check refuses it in a rule's selector before ours runs"))],
    ids=lambda p: p[:24])
def test_repeat_counts_go_accepts_are_accepted_everywhere(pattern: str) -> None:
    """The nearest twins Go accepts (a count of 1000, a brace that is not a count) pass every entry point."""
    assert _every_entry(pattern) == ["ok"] * 6


@pytest.mark.skipif(shutil.which("amtool") is None or shutil.which("promtool") is None,
                    reason="amtool and promtool not installed (CI installs prometheus and prometheus-alertmanager)")
@pytest.mark.parametrize("pattern", [*REPEATS_REFUSED, *REPEATS_ACCEPTED, BIG_ACCEPTED], ids=lambda p: p[:24])
def test_repeat_counts_agree_with_amtool_and_promtool(tmp_path: Path, pattern: str) -> None:
    """Differential: Alertmanager (a route matcher) and Prometheus (a rule's selector) accept exactly these."""
    config = tmp_path / "am.yml"
    config.write_text("route:\n  receiver: r\n  routes:\n    - receiver: r\n      matchers: ["
                      + json.dumps("a=~" + json.dumps(pattern)) + "]\nreceivers:\n  - name: r\n")
    amtool = subprocess.run([str(shutil.which("amtool")), "check-config", str(config)], capture_output=True,
                            timeout=60, check=False)
    promtool = subprocess.run([str(shutil.which("promtool")), "check", "rules", str(_rule_file(pattern))],
                              capture_output=True, timeout=60, check=False)
    ours = pattern in (*REPEATS_ACCEPTED, BIG_ACCEPTED)
    assert (amtool.returncode == 0, promtool.returncode == 0) == (ours, ours)
