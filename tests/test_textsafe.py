"""Tests for agent.textsafe: what could forge a line or drive a terminal is escaped, nothing else is."""

from __future__ import annotations

import sys

import pytest

from agent.textsafe import escape, escape_lines, needs_escape

#: The class of hostile characters (issue 23, item 5), each with the spelling a person sees.
HOSTILE = [
    ("\n", "\\n"), ("\r", "\\r"), ("\x1b[31m", "\\x1b[31m"), ("\x00", "\\x00"), ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"), ("\x85", "\\x85"), ("\u202e", "\\u202e"), ("\t", "\\t"), ("\x7f", "\\x7f"),
    ("\u2066", "\\u2066"), ("\ud800", "\\ud800"),
]


@pytest.mark.parametrize(("raw", "shown"), HOSTILE, ids=[ascii(h[0]) for h in HOSTILE])
def test_each_hostile_character_is_escaped_in_place(raw: str, shown: str) -> None:
    """A hostile character inside a name comes out spelled as Python would write it, the rest as it was."""
    assert escape(f"Alert{raw}Name") == f"Alert{shown}Name"


@pytest.mark.parametrize("text", ["VLLMKVCacheSaturated", 'instance="gpu-a:8000"', "día ☃ 日本 👩‍👩‍👧",
                                  r"job=~\"vllm.*\" C:\path", ""])
def test_ordinary_text_is_unchanged(text: str) -> None:
    """Names, accents, CJK, emoji (with their zero-width joiners) and backslashes are shown as they are."""
    assert escape(text) == text


def test_the_pattern_agrees_with_unicodes_tables_on_every_code_point() -> None:
    """The fast pattern escapes exactly the code points the slow, table-based definition names."""
    wrong = [hex(c) for c in range(sys.maxunicode + 1) if (escape(chr(c)) != chr(c)) != needs_escape(chr(c))]
    assert wrong == []


@pytest.mark.parametrize(("raw", "shown"), [("a\nb", "a\nb"), ("a\r\nb", "a\\r\nb"), ("\tindented\t", "\tindented\t"),
                                            ("x\x1b[2Jy\nz\u2028w", "x\\x1b[2Jy\nz\\u2028w")])
def test_escape_lines_keeps_the_line_breaks_only(raw: str, shown: str) -> None:
    """A report keeps its own lines and tabs; a carriage return, an ANSI escape or U+2028 inside one is escaped."""
    assert escape_lines(raw) == shown
