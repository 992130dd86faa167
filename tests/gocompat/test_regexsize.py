"""Tests for agent.gocompat.regexsize: Go's program-size estimate (``calcSize``) and the patterns Go refuses
as too large that C++ RE2 compiles, checked against amtool (Alertmanager 0.25, Go's regexp) where present."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import RegexError
from agent.gocompat.regex import compile_anchored, compile_go
from agent.gocompat.regexsize import GO_MAX_SIZE, go_size, too_large

AMTOOL = shutil.which("amtool")


@pytest.mark.parametrize(("pattern", "size"), [
    ("abc", 3),  # a rune is one instruction
    ("[a-z]", 1), ("\\pL", 1), ("\\p{Greek}", 1), (".", 1), ("\\d", 1),  # a class, however many runes, is one
    ("^\\b$", 3),  # assertions are one each
    ("(a)", 3), ("(?P<n>a)", 3), ("(?:a)", 1), ("(?i:ab)", 2), ("(?i)ab", 2),  # a capture adds 2, a group nothing
    ("a*", 3), ("a+", 2), ("a?", 2), ("a*?", 3),  # star adds 2, plus and quest 1
    ("a{3}", 3), ("a{2,5}", 8), ("a{0,4}", 8), ("a{3,}", 4), ("a{0,}", 3),  # x{n,m} = m*x + (m-n); x{n,} = 1 + n*x
    ("(?:ab){10}", 20), ("(?:(?:a*){10}){10}", 300),  # nesting multiplies
    ("\\Qa.b\\E", 3), ("a{1001", 6), ("a{01001}", 8),  # literal text: \Q...\E, a brace that is not a count
    ("abc|de", 6), ("(?:ab|c)", 4), ("x|y(z)", 6), ("a*|b", 5),  # sum of branches + (branches - 1)
    # Go factors these first: counted as the largest branch
    ("abc|abd", 3), ("a|b", 1), ("a|[bc]|d", 1), ("(?i)ab|Ac", 2), ("[a]x|[b]y", 2),
])
def test_size_follows_gos_formulas(pattern: str, size: int) -> None:
    """Each construct costs what Go's calcSize says it costs."""
    assert go_size(pattern) == size


@pytest.mark.parametrize(("unit", "cost", "n_max"), [
    ("a*", 3, 1118), ("\\b", 1, 3355), (".", 1, 3355), ("(a)", 3, 1118), ("^", 1, 3355),
])
def test_limit_is_gos_maxsize_on_both_sides(unit: str, cost: int, n_max: int) -> None:
    """n_max units repeated 1000 times fit Go's 3,355,443 instructions; one more does not (amtool's thresholds)."""
    assert n_max * cost * 1000 <= GO_MAX_SIZE < (n_max + 1) * cost * 1000
    assert not too_large(f"(?:{unit * n_max}){{1000}}")
    assert too_large(f"(?:{unit * (n_max + 1)}){{1000}}")


@pytest.mark.parametrize("pattern", ["(", ")", "(?P<n", "(?i", "[a", "[", "\\", "\\p{", "\\x{", "a{", "*", "|*",
                                     "((((", "))))", "\\Q", "(?:" * 10_000])
def test_malformed_patterns_are_measured_without_error(pattern: str) -> None:
    """A pattern RE2 will refuse anyway is measured without an exception or an endless loop."""
    assert go_size(pattern) >= 1


@pytest.mark.parametrize("pattern", [
    "(?:" + "\\b" * 3356 + "){1000}",  # C++ RE2 folds repeated assertions into one
    "(?:" + "a*" * 1119 + "){1000}",  # ... and coalesces a*a*a* into one loop
    "(?:" + "^$" * 1700 + "){1000}",
])
def test_patterns_cxx_re2_accepts_and_go_refuses_are_refused(pattern: str) -> None:
    """What C++ RE2 compiles but Go refuses as too large is a RegexError naming Go's reason."""
    with pytest.raises(RegexError, match="expression too large"):
        compile_anchored(pattern, what="a=~")


def _amtool_accepts(tmp_path: Path, pattern: str) -> bool:
    assert AMTOOL is not None
    config = tmp_path / "am.yml"
    config.write_text("route:\n  receiver: r\n  routes:\n    - receiver: r\n      matchers: ["
                      + json.dumps("a=~" + json.dumps(pattern)) + "]\nreceivers:\n  - name: r\n")
    return subprocess.run([AMTOOL, "check-config", str(config)], capture_output=True, timeout=60,
                          check=False).returncode == 0


@pytest.mark.skipif(AMTOOL is None, reason="amtool not installed (CI installs prometheus-alertmanager)")
@pytest.mark.parametrize(("unit", "n"), [("a*", 1118), ("a*", 1119), ("\\b", 3355), ("\\b", 3356), (".", 3356),
                                          ("(a)", 1119), ("(?:ab|c)", 838), ("(?:ab|c)", 839),
                                          ("(?:ab|ac)", 1200)])
def test_too_large_agrees_with_amtool(tmp_path: Path, unit: str, n: int) -> None:
    """Differential: amtool accepts exactly the patterns too_large() lets through, either side of the limit."""
    pattern = f"(?:{unit * n}){{1000}}"
    assert _amtool_accepts(tmp_path, pattern) is not too_large(f"^(?:{pattern})$")


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.text(st.sampled_from(list("ab.^$|()[]{}*+?\\:<>P0123456789,-QEpLbxiz")), max_size=40))
def test_any_pattern_is_measured_and_compiles_or_is_a_regex_error(pattern: str) -> None:
    """Whatever the text, the size walk answers (every compile runs it) and compiling raises only RegexError."""
    assert go_size(pattern) >= 1
    with contextlib.suppress(RegexError):
        compile_go(pattern)
