"""Tests for agent.cli.triage on a terminal: a report printed to stdout carries no control characters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.act.state import StateDB
from agent.cli import main

T0 = 1_700_000_000_000  # 2023-11-14 22:13:20 UTC
FORGERS = ["\r", "\x1b[2J", "\x00", "\u2028", "\u2029", "\x85", "\u202e", "\n"]


@pytest.mark.parametrize("fmt", ["md", "html"])
@pytest.mark.parametrize("bad", FORGERS, ids=[ascii(b) for b in FORGERS])
def test_a_report_on_the_terminal_carries_no_control_characters(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  bad: str, fmt: str) -> None:
    """An incident whose alertname, labels and summary carry control characters prints a report with none
    of them raw, and a newline in a summary cannot start a line that reads as the Markdown report's own heading."""
    path = tmp_path / "s.db"
    db = StateDB(path)
    db.incidents.open(fingerprint="e", alertname=f"Evil{bad}Name", labels={"alertname": f"Evil{bad}Name",
                                                                           "instance": f"i{bad}"},
                      severity="warning", summary=f"s{bad}## Resolved: nothing to see", started_ms=T0)
    db.close()
    capsys.readouterr()
    assert main(["triage", "1", "--db", str(path), "--format", fmt]) == 0
    out = capsys.readouterr().out
    assert not any(c in out for c in "\r\x1b\x00\u2028\u2029\x85\u202e")
    if fmt == "md":  # in HTML a newline is only a space
        assert not any(line.startswith("## Resolved") for line in out.splitlines())


@pytest.mark.parametrize("bad", [*FORGERS, "\x7f"], ids=[ascii(b) for b in [*FORGERS, "\x7f"]])
def test_a_json_report_on_the_terminal_is_valid_json_with_the_text_intact(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    """--format json on stdout is ASCII JSON (its \\uXXXX escapes keep control characters off the terminal)
    that parses back to the label's own text."""
    path = tmp_path / "s.db"
    db = StateDB(path)
    db.incidents.open(fingerprint="e", alertname=f"Evil{bad}Name", labels={"alertname": f"Evil{bad}Name"},
                      severity="warning", summary="s", started_ms=T0)
    db.close()
    capsys.readouterr()
    assert main(["triage", "1", "--db", str(path), "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert out.isascii() and not any(c in out for c in FORGERS if c != "\n")
    assert json.loads(out)["incident"]["alertname"] == f"Evil{bad}Name"
