"""Tests for agent.gocompat.yamlv3: yaml.v3 scalars, and the budgets that refuse YAML bombs
(alias expansion, nesting, size) before anything walks the expanded data."""

from __future__ import annotations

import json
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from agent.gocompat import yamlv3
from tests.yamlbombs import BILLION_LAUGHS, DEEP_BLOCK, DEEP_FLOW, MERGE_BOMB, SELF_ALIAS, write_huge


def test_base60_forms_stay_strings() -> None:
    """A PCI bus id and 1:30 stay strings, as in yaml.v3; decimal, hex and floats still resolve."""
    assert yamlv3.load("a: 00000000:18:00.0\nb: 1:30\nc: 0x1f\nd: 1.5\ne: 10\n") == {
        "a": "00000000:18:00.0", "b": "1:30", "c": 31, "d": 1.5, "e": 10}


@pytest.mark.parametrize(("text", "want"), [
    ("true", True), ("True", True), ("TRUE", True), ("false", False), ("False", False), ("FALSE", False),
    ("yes", "yes"), ("no", "no"), ("on", "on"), ("off", "off"), ("Yes", "Yes"), ("OFF", "OFF"), ("y", "y"),
    ("n", "n"), ("tRuE", "tRuE"),
])
def test_booleans_are_yaml_v3s(text: str, want: object) -> None:
    """Only true/false in three spellings are booleans, as in yaml.v3; YAML 1.1's yes/no/on/off stay text."""
    assert yamlv3.load(f"k: {text}\n") == {"k": want}
    assert yamlv3.load(f"{text}: 1\n") == {want: 1}


def test_billion_laughs_refused_fast_in_little_memory() -> None:
    """The 10**10-node bomb is refused while composing: in well under a second and under 1 MB."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(yaml.YAMLError, match="excessive aliasing") as err:
            yamlv3.load(BILLION_LAUGHS)
        elapsed = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "12,345,679,021 nodes" in str(err.value) and "lol" not in str(err.value)
    assert elapsed < 5 and peak < 1 << 20


@pytest.mark.parametrize("doc", [MERGE_BOMB, SELF_ALIAS], ids=["merge-keys", "self-alias"])
def test_other_alias_bombs_refused(doc: str) -> None:
    """Merge-key growth and an anchor used inside itself are refused, like yaml.v3 does."""
    with pytest.raises(yaml.YAMLError, match=r"excessive aliasing|contains itself"):
        yamlv3.load(doc)


def test_ordinary_aliases_and_merge_keys_still_work() -> None:
    """Anchors reused for shared labels and merged defaults load as before."""
    doc = "base: &b {severity: warning, team: infra}\nrules:\n" + "".join(
        f"  - {{alert: A{i}, labels: *b, extra: {{<<: *b, n: {i}}}}}\n" for i in range(200))
    data = yamlv3.load(doc)
    assert data["rules"][199] == {"alert": "A199", "labels": {"severity": "warning", "team": "infra"},
                                  "extra": {"severity": "warning", "team": "infra", "n": 199}}


def test_alias_budget_is_relative_to_the_document() -> None:
    """Up to 100x expansion passes in a large document; the same anchor used more is refused."""
    anchor = "a: &a [" + ", ".join(["x"] * 99) + "]\n"  # 100 nodes
    ok = anchor + "b: [" + ", ".join(["*a"] * 150) + "]\n"  # 15,000 nodes expanded from ~254 written
    with pytest.raises(yaml.YAMLError, match="excessive aliasing"):
        yamlv3.load(ok)
    filler = "c: [" + ", ".join(["y"] * 200) + "]\n"  # more written nodes raise the budget
    assert len(yamlv3.load(anchor + filler + "b: [" + ", ".join(["*a"] * 150) + "]\n")["b"]) == 150


@pytest.mark.parametrize("doc", [DEEP_FLOW, DEEP_BLOCK, "- " * 10_000 + "x"], ids=["flow", "block", "seq"])
def test_deep_nesting_refused_without_recursion_error(doc: str) -> None:
    """Nesting past MAX_DEPTH is a YAML error naming the limit, never a RecursionError or a slow scan."""
    t0 = time.perf_counter()
    with pytest.raises(yaml.YAMLError, match=f"exceeded max depth of {yamlv3.MAX_DEPTH}") as err:
        yamlv3.load(doc)
    assert time.perf_counter() - t0 < 5
    assert len(str(err.value)) < 500


def test_nesting_at_the_limit_loads() -> None:
    """A document exactly MAX_DEPTH collections deep still loads."""
    depth = yamlv3.MAX_DEPTH - 1
    assert yamlv3.load("[" * depth + "1" + "]" * depth) is not None


def test_huge_file_refused_without_reading_it_all(tmp_path: Path) -> None:
    """load_file refuses a file over MAX_BYTES and says the limit; a text over it is refused too."""
    with pytest.raises(yaml.YAMLError, match="over the 4,194,304-byte limit"):
        yamlv3.load_file(write_huge(tmp_path / "huge.yaml"))
    with pytest.raises(yaml.YAMLError, match="byte limit"):
        yamlv3.load("#" * (yamlv3.MAX_BYTES + 1))


def test_invalid_utf8_is_a_yaml_error(tmp_path: Path) -> None:
    """A file that is not UTF-8 is a YAML error, not a UnicodeDecodeError."""
    f = tmp_path / "bad.yaml"
    f.write_bytes(b"a: \xff\xfe\xfa\n")
    with pytest.raises(yaml.YAMLError):
        yamlv3.load_file(f)


def test_memory_error_while_loading_becomes_a_yaml_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A MemoryError inside the loader surfaces as a yaml.YAMLError, chained to its cause."""
    def exhausted(self: object, node: object) -> object:
        raise MemoryError

    monkeypatch.setattr(yamlv3._Loader, "construct_document", exhausted)
    with pytest.raises(yaml.YAMLError, match="too large") as err:
        yamlv3.load("a: 1\n")
    assert isinstance(err.value.__cause__, MemoryError)


def test_brief_is_bounded_and_lazy() -> None:
    """brief() of a huge nested value is short and does not walk it all."""
    big = [[["x" * 1000] * 1000] * 1000] * 1000
    t0 = time.perf_counter()
    text = yamlv3.brief(big)
    assert len(text) < 120 and time.perf_counter() - t0 < 1
    assert yamlv3.brief("short") == "'short'"


@pytest.mark.parametrize(("doc", "line", "key", "first"), [
    ("groups:\n- name: g\n  rules:\n  - alert: A\n    expr: up\n    expr: down\n", 6, "expr", 5),
    ("server:\n  auth: {type: basic}\nserver:\n  listen: x\n", 3, "server", 1),
    ("a:\n  b:\n    c: {d: 1, e: 2, d: 3}\n", 3, "d", 3),
    ("- {x: 1}\n- [{y: 1, y: 2}]\n", 2, "y", 2),
    ("1: a\n\"1\": b\n", 2, "1", 1),
    ("'k': a\nk: b\n", 2, "k", 1),
    ("!!str 7: a\n7: b\n", 2, "7", 1),
    ("<<: {a: 1}\n<<: {b: 2}\n", 2, "<<", 1),
    ("a: &x k\n*x : 1\n*x : 2\n", 3, "x", 2),
    ("? |\n  multi\n: 1\n\"multi\\n\": 2\n", 4, "multi\n", 1),
])
def test_duplicate_mapping_keys_refused_as_yaml_v3(doc: str, line: int, key: str, first: int) -> None:
    """A key given twice in one mapping, at any depth and in any style, is yaml.v3's error with both lines."""
    with pytest.raises(yaml.YAMLError) as err:
        yamlv3.load(doc)
    quoted = json.dumps(key)
    assert str(err.value) == f"line {line}: mapping key {quoted} already defined at line {first}"


@pytest.mark.parametrize(("doc", "want"), [
    ("on: 1\ntrue: 2\n", {"on": 1, True: 2}),  # different text: yaml.v3 compares the scalars as written
    ("1: a\n0x1: b\n", {1: "b"}),  # equal once resolved, different as written: the last wins, as in yaml.v3
    ("b: &b {x: 1, y: 2}\nm: {<<: *b, x: 3}\n", {"b": {"x": 1, "y": 2}, "m": {"x": 3, "y": 2}}),
    ("a: &a {x: 1}\nb: &b {x: 2}\nm: {<<: [*a, *b]}\n", {"a": {"x": 1}, "b": {"x": 2}, "m": {"x": 1}}),
    ("a: &x k\n*x : 1\n", {"a": "k", "k": 1}),  # an alias key and its anchor's text are different nodes
    ("a: {k: 1}\nb: {k: 1}\n", {"a": {"k": 1}, "b": {"k": 1}}),
])
def test_keys_yaml_v3_does_not_call_duplicates_load(doc: str, want: object) -> None:
    """Keys that differ as written, keys overriding a merge, and merged duplicates load as in yaml.v3."""
    assert yamlv3.load(doc) == want


def test_duplicate_key_message_is_bounded() -> None:
    """A hostile 100 KB duplicate key is cut in the message, not echoed whole."""
    key = "k" * 100_000
    with pytest.raises(yaml.YAMLError) as err:
        yamlv3.load(f"? {key}\n: 1\n? {key}\n: 2\n")  # explicit keys: a plain key is at most 1024
    assert len(str(err.value)) < 300 and "already defined at line 1" in str(err.value)
