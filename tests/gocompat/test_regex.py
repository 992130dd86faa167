"""Go's regexps on RE2: compiling as Go does, refusing what Go refuses, linear time on hostile
input, and ``Regexp.Expand``, the replacement syntax ``label_replace`` and ``reReplaceAll`` share."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import RegexError
from agent.gocompat.regex import compile_anchored, compile_go, expand, match_anchored
from agent.matchers import AlertMatcher
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
