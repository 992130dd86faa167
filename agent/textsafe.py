"""Text from outside, made safe to show a person: control characters escaped (CWE-117, log forging).

Why one function for every human-facing output: an alertname, a label value or a silence comment
arrives from an unauthenticated webhook or an API body, and the console receiver, the CLI's tables,
the triage text and the console log renderer all print it. A raw newline in it forges a log line
or a table row, ``\\r`` overwrites the line a person reads, ``\\x1b[`` drives the terminal (colours,
cursor moves, a fake prompt), ``\\u202e`` turns the rest of a line around, and U+2028/U+2029/U+0085
are line breaks to editors and log viewers that split on Unicode. Escaping them the same way
everywhere means one place to test and no output that forgot one.

What is escaped (:func:`escape`): every character of Unicode category ``Cc`` (C0 and C1 controls,
DEL, U+0085), ``Zl``/``Zp`` (U+2028, U+2029), lone surrogates (which no stream can encode), and the
bidirectional formatting characters (U+061C, U+200E, U+200F, U+202A..U+202E, U+2066..U+2069).
Other format characters (a zero-width joiner inside an emoji) are shown as they are. The escape is
Python's own spelling (``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\u2028``), so what a person reads can
be pasted into a Python or JSON string to get the original back. A backslash is left alone: it
cannot break a line or drive a terminal, and doubling it would garble regexes and paths in tables.
JSON output needs none of this (``json.dumps`` escapes control characters itself).
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["escape", "escape_lines", "needs_escape"]

_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}
# Every code point escape() changes, as one character class: C0, DEL and C1 controls (U+0085
# included), U+2028/U+2029, surrogates and the bidi controls. A test checks it against unicodedata.
# Python's re, not RE2 (agent.gocompat.regex): a fixed character class cannot backtrack, and RE2 reads
# UTF-8, in which a lone surrogate cannot even be written.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff" + _BIDI + "]")


def _spell(m: re.Match[str]) -> str:
    ch = m.group()
    short = _SHORT.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str) -> str:
    """``text`` with every character that could forge a line or drive a terminal escaped (see the module
    docstring); the text itself unchanged when there is none, which is the usual case."""
    return _UNSAFE.sub(_spell, text)


def escape_lines(text: str) -> str:
    """A multi-line text (a report) escaped line by line: its ``\\n`` line breaks and its tabs (a report's
    indentation, harmless to a terminal) kept, everything else :func:`escape` escapes (``\\r``, ESC,
    U+2028...) escaped, so the lines a person sees are its lines."""
    return "\n".join("\t".join(escape(part) for part in line.split("\t")) for line in text.split("\n"))


def needs_escape(ch: str) -> bool:
    """Whether :func:`escape` changes the one character ``ch``, from Unicode's own tables (the slow,
    trusted definition the tests check the fast pattern against)."""
    category = unicodedata.category(ch)
    return category in ("Cc", "Zl", "Zp", "Cs") or ch in _BIDI
