"""Tests for agent.matchers: Alertmanager's matcher grammar and Go RE2 semantics, by hand and against amtool."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import RegexError
from agent.matchers import AlertMatcher, matchers_from, matches_all, parse_matcher, parse_matchers

AMTOOL = shutil.which("amtool")
needs_amtool = pytest.mark.skipif(
    AMTOOL is None, reason="amtool not installed (Debian package prometheus-alertmanager; CI installs it)"
)


def amtool_label_arg(name: str, value: str) -> str:
    """One ``name="value"`` argument for amtool, escaped the way its ParseMatcher unescapes."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'{name}="{escaped}"'


def write_am_config(path: Path, route: Mapping[str, Any], receivers: Sequence[str]) -> Path:
    """An Alertmanager config file with ``route`` and every receiver it names (webhooks to a dead local port)."""
    cfg = {"route": dict(route),
           "receivers": [{"name": r, "webhook_configs": [{"url": "http://127.0.0.1:9/"}]} for r in receivers]}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8")
    return path


def amtool_routes(jobs: Sequence[tuple[Path, Mapping[str, str]]]) -> list[subprocess.CompletedProcess[str]]:
    """``amtool config routes test`` for each (config file, alert labels), a few at a time."""
    assert AMTOOL is not None

    def one(job: tuple[Path, Mapping[str, str]]) -> subprocess.CompletedProcess[str]:
        path, labels = job
        args = [AMTOOL, "config", "routes", "test", f"--config.file={path}"]
        args += [amtool_label_arg(k, v) for k, v in labels.items()]
        return subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, jobs))


def receivers_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """amtool prints the receivers comma-separated on one line, in routing order."""
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(",")


# -- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ('severity="critical"', AlertMatcher("severity", "=", "critical")),
    ("severity=critical", AlertMatcher("severity", "=", "critical")),
    ('  job != "vllm"  ', AlertMatcher("job", "!=", "vllm")),
    ('alertname=~"VLLM.*"', AlertMatcher("alertname", "=~", "VLLM.*")),
    ("alertname!~VLLM.*", AlertMatcher("alertname", "!~", "VLLM.*")),
    ('a:b="c"', AlertMatcher("a:b", "=", "c")),
    ('a=""', AlertMatcher("a", "=", "")),
    ("a=", AlertMatcher("a", "=", "")),
    ('a="x\\"y"', AlertMatcher("a", "=", 'x"y')),
    ('a="x\\\\y"', AlertMatcher("a", "=", "x\\y")),
    ('a="x\\ny"', AlertMatcher("a", "=", "x\ny")),
    ('a="x\\ty"', AlertMatcher("a", "=", "x\\ty")),  # an unknown escape keeps its backslash
    ("a=x\\", AlertMatcher("a", "=", "x\\")),  # a final backslash is literal
    ('a=b\\"c', AlertMatcher("a", "=", 'b"c')),  # bare values take escapes too
    ('a="b c"', AlertMatcher("a", "=", "b c")),
    ('a="b,c"', AlertMatcher("a", "=", "b,c")),
])
def test_parse_matcher(text: str, expected: AlertMatcher) -> None:
    """Quoted and bare values, operators, whitespace and the three escapes parse as Alertmanager does."""
    assert parse_matcher(text) == expected


@pytest.mark.parametrize("text", ['a="b', 'a=b"', 'a="x\\"', 'a="b"c"', "9a=b", "a~b", "", "=b", "a b=c"])
def test_parse_matcher_rejects(text: str) -> None:
    """Unbalanced or inner quotes, bad names and missing operators are errors."""
    with pytest.raises(ValueError, match="bad matcher"):
        parse_matcher(text)


def test_parse_matchers_list_forms() -> None:
    """Braces, commas, a trailing comma and commas inside quotes follow Alertmanager's ParseMatchers."""
    assert parse_matchers('{a="b", c=~"d,e",}') == [AlertMatcher("a", "=", "b"), AlertMatcher("c", "=~", "d,e")]
    assert parse_matchers("a=b,c!=d") == [AlertMatcher("a", "=", "b"), AlertMatcher("c", "!=", "d")]
    assert parse_matchers("") == []
    assert parse_matchers("{}") == []
    with pytest.raises(ValueError):
        parse_matchers("a=b,,c=d")


def test_matchers_from_combines_every_form() -> None:
    """matchers, match and match_re become one list, with list-form entries split."""
    ms = matchers_from(['a="1",b="2"'], {"c": "3"}, {"d": "4|5"})
    assert ms == [AlertMatcher("a", "=", "1"), AlertMatcher("b", "=", "2"), AlertMatcher("c", "=", "3"),
                  AlertMatcher("d", "=~", "4|5")]
    assert matches_all(ms, {"a": "1", "b": "2", "c": "3", "d": "5"})
    assert not matches_all(ms, {"a": "1", "b": "2", "c": "3", "d": "45"})


def test_str_round_trips() -> None:
    """str() gives the canonical quoted form, which parses back to the same matcher."""
    m = AlertMatcher("a", "!~", 'x"\\\ny')
    assert str(m) == 'a!~"x\\"\\\\\\ny"'
    assert parse_matcher(str(m)) == m


def test_bad_operator_and_regex() -> None:
    """An unknown operator or a regex that does not compile is a ValueError naming it."""
    with pytest.raises(ValueError, match="operator"):
        AlertMatcher("a", "==", "b")
    with pytest.raises(ValueError, match="regular expression"):
        AlertMatcher("a", "=~", "(")


# -- matching --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "labels", "hit"), [
    ('env!="prod"', {}, True),  # a missing label is ""
    ('env=""', {}, True),
    ('env=""', {"env": "dev"}, False),
    ('env=~".*"', {}, True),
    ('env=~".+"', {}, False),
    ('env!~".+"', {}, True),
    ('svc=~"api"', {"svc": "api-gw"}, False),  # anchored at both ends
    ('svc=~"api"', {"svc": "my-api"}, False),
    ('svc=~"api|web"', {"svc": "web"}, True),  # the anchors wrap the whole alternation
    ('svc=~"a.b"', {"svc": "a\nb"}, False),  # Go's . does not match a newline
    ('svc=~"(?s)a.b"', {"svc": "a\nb"}, True),
    ('svc=~"api"', {"svc": "api\n"}, False),  # Python's $ would match before a final newline; Go's does not
    ('svc=~"api$"', {"svc": "api\n"}, False),
    ('svc=~"(?m)api$\\n"', {"svc": "api\n"}, True),
    ('svc=~"(?i)API"', {"svc": "api"}, True),
    ('svc=~"x(?i)a|b"', {"svc": "B"}, True),  # the flag holds across | to the end of the group
    ('svc=~"x(?i)a|b"', {"svc": "xA"}, True),
    ('svc=~"X(?i)a|b"', {"svc": "xA"}, False),
    ('svc=~"(x(?i)a)|b"', {"svc": "B"}, False),  # ... but not past its group's end
    ('n=~"\\\\d+"', {"n": "\u0661\u0662"}, False),  # \d is ASCII in RE2
    ('n=~"\\\\d+"', {"n": "12"}, True),
    ('n=~"[[:digit:]]+"', {"n": "12"}, True),
    ('n=~"a{,2}"', {"n": "a{,2}"}, True),  # RE2 reads {,n} literally
    ('n=~"a{,2}"', {"n": "aa"}, False),
])
def test_matches(text: str, labels: dict[str, str], hit: bool) -> None:
    """Matching follows Alertmanager: missing labels are empty, regexes are anchored RE2."""
    assert parse_matcher(text).matches(labels) is hit


@pytest.mark.parametrize("rx", ["a++", "a*+", "a{2}+", "(?=a)a", "(?!a)b", "(?<=a)b", "(a)\\1", "(?>a)",
                                "a{1001}", "\\Cx", "(?<n>x)"])
def test_rejects_what_re2_lacks(rx: str) -> None:
    """Syntax Go's RE2 lacks (Python-only, or C++-RE2-only as \\C and (?<n>)) is refused, naming the matcher."""
    with pytest.raises(RegexError, match=r"^a=~: not a regular expression in RE2 syntax: "):
        AlertMatcher("a", "=~", rx)


def test_negated_posix_class_is_re2() -> None:
    """``[[:^alpha:]]`` is RE2 syntax (a negated POSIX class) and means what it means in Go."""
    m = AlertMatcher("a", "=~", "[[:^alpha:]]+")
    assert m.matches({"a": "12-"}) and not m.matches({"a": "1a"})


@pytest.mark.parametrize(("rx", "hit", "miss"), [
    ("vllm-0", "vllm-0", "vllm-00"),  # a literal: string equality
    ("a|b|", "", "ab"),  # literal alternatives: a set, the empty one included
    ("a.b|c", "axb", "a\nb"),  # not literal: RE2
    ("x\\.y", "x.y", "xzy"),
    ("(?i)abc", "ABC", "ab"),
])
def test_fast_paths_answer_as_re2(rx: str, hit: str, miss: str) -> None:
    """The literal and literal-set fast paths, and the memoised RE2 path, give RE2's answer."""
    m = AlertMatcher("a", "=~", rx)
    assert m.matches({"a": hit}) and not m.matches({"a": miss})
    assert m.matches({"a": hit}) and not m.matches({"a": miss})  # the memo answers the same the second time


# -- differential: amtool --------------------------------------------------------------------------

# AlertMatcher texts and alert labels to try each on; amtool is the judge of parse errors and matches.
DIFF_CASES: list[tuple[str, list[dict[str, str]]]] = [
    ('a="b"', [{"a": "b"}, {"a": "bb"}, {}]),
    ("a=b", [{"a": "b"}, {"a": " b"}]),
    ("a = b ", [{"a": "b"}]),
    ('a="b', [{}]),
    ('a=b"', [{}]),
    ('a="x\\"', [{"a": "x\\"}]),
    ('a=b\\"c', [{"a": 'b"c'}]),
    ('a="x\\ty"', [{"a": "x\\ty"}, {"a": "x\ty"}]),
    ('a="x\\ny"', [{"a": "x\ny"}, {"a": "x\\ny"}]),
    ("a=x\\ny", [{"a": "x\ny"}]),
    ("a=x\\", [{"a": "x\\"}]),
    ("a=", [{}, {"a": "v"}]),
    ('a!=""', [{}, {"a": "v"}]),
    ("9a=b", [{}]),
    ("a==b", [{"a": "=b"}]),
    ("a=~b=c", [{"a": "b=c"}]),
    ("a:b=c", [{"a:b": "c"}]),
    ("{a=b, c=d,}", [{"a": "b", "c": "d"}, {"a": "b"}]),
    ('a=b,c="d,e"', [{"a": "b", "c": "d,e"}, {"a": "b", "c": "d"}]),
    ("a=b,,c=d", [{}]),
    ("", [{}]),
    ('a=~"x.y"', [{"a": "x\ny"}, {"a": "xzy"}]),
    ('a=~"(?s)x.y"', [{"a": "x\ny"}]),
    ('a=~"foo"', [{"a": "foo\n"}, {"a": "foo"}]),
    ('a=~"foo$"', [{"a": "foo\n"}]),
    ('a=~"(?m)foo$\\n"', [{"a": "foo\n"}]),
    ('a=~"(?i)FOO"', [{"a": "foo"}]),
    ('a=~"x(?i)a|b"', [{"a": "B"}, {"a": "xA"}, {"a": "XA"}]),
    ('a=~"(x(?i)a)|b"', [{"a": "B"}, {"a": "xA"}]),
    ('a=~"(?i:x)y"', [{"a": "XY"}, {"a": "Xy"}]),
    ('a=~"(?U)x+"', [{"a": "xxx"}]),
    ('a=~"\\\\d+"', [{"a": "12"}, {"a": "\u0661\u0662"}]),
    ('a=~"\\\\w+"', [{"a": "\u00e9"}, {"a": "a_1"}]),
    ('a=~"\\\\s"', [{"a": "\u00a0"}, {"a": "\t"}]),
    ('a=~"[\\\\d.]+"', [{"a": "1.5"}]),
    ('a=~"[[:alpha:]]+"', [{"a": "abc"}, {"a": "ab1"}]),
    ('a=~"[[:^alpha:]]+"', [{"a": "12"}, {"a": "ab1"}]),
    ('a=~"\\\\pL+"', [{"a": "\u00e9t\u00e9"}, {"a": "1"}]),
    ('a=~"\\\\p{Greek}"', [{"a": "\u03b1"}, {"a": "a"}]),
    ('a=~"\\\\Qa.b\\\\E"', [{"a": "a.b"}, {"a": "axb"}]),
    ('a=~"\\\\Cx"', [{"a": "xx"}]),
    ('a=~"(?<n>x)"', [{"a": "x"}]),
    ('a=~"(?P<n>x)"', [{"a": "x"}]),
    ('a=~"x{1000}"', [{"a": "x" * 1000}]),
    ('a=~"x{1001}"', [{}]),
    ('a=~"a)|(b"', [{"a": "ab"}, {"a": "xb"}, {"a": "ax"}, {"a": "a"}]),  # anchored by text: ^(?:a)|(b)$
    ('a=~"(a+)+$"', [{"a": "a" * 5000 + "b"}, {"a": "a" * 5000}]),
    ('a=~"[]a]+"', [{"a": "]a"}]),
    ('a=~"a{,2}"', [{"a": "a{,2}"}, {"a": "aa"}]),
    ('a=~"a{2}"', [{"a": "aa"}]),
    ('a=~"a{b"', [{"a": "a{b"}]),
    ('a=~"\\\\z"', [{"a": "z"}]),
    ('a=~"a++"', [{"a": "aa"}]),
    ('a=~"(?=a)a"', [{"a": "a"}]),
    ('a=~"(a)\\\\1"', [{"a": "aa"}]),
    ('a=~"caf\u00e9"', [{"a": "caf\u00e9"}]),
    ('a=~"(?i)CAF\u00c9"', [{"a": "caf\u00e9"}]),
    ('a=~""', [{}, {"a": "x"}]),
    ('a!~"x|y"', [{"a": "x"}, {"a": "xy"}]),
    ('a=~"[a-c]+-[0-9]"', [{"a": "abc-1"}, {"a": "abc-10"}]),
]


def _ours(text: str, labels: Mapping[str, str]) -> str:
    try:
        ms = parse_matchers(text)
    except ValueError:
        return "error"
    return "hit" if matches_all(ms, labels) else "miss"


@needs_amtool
def test_differential_against_amtool(tmp_path: Path) -> None:
    """Every case parses (or fails) and matches exactly as Alertmanager 0.25's own parser and router do."""
    jobs: list[tuple[Path, Mapping[str, str]]] = []
    for i, (text, label_sets) in enumerate(DIFF_CASES):
        route = {"receiver": "miss", "routes": [{"receiver": "hit", "matchers": [text]}]}
        path = write_am_config(tmp_path / f"m{i}.yml", route, ["miss", "hit"])
        jobs += [(path, labels) for labels in label_sets]
    procs = amtool_routes(jobs)
    labelled = [(text, labels) for text, label_sets in DIFF_CASES for labels in label_sets]
    mismatches = []
    for (text, labels), proc in zip(labelled, procs, strict=True):
        theirs = proc.stdout.strip() if proc.returncode == 0 else "error"
        if theirs == "error":
            assert "Failed to parse labels" not in proc.stderr, proc.stderr  # our label argument was bad
        if _ours(text, labels) != theirs:
            mismatches.append((text, labels, theirs, proc.stderr.strip()[-200:]))
    assert not mismatches
    outcomes = {proc.stdout.strip() if proc.returncode == 0 else "error" for proc in procs}
    assert outcomes == {"hit", "miss", "error"}  # the cases exercise all three answers
