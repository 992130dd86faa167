"""Go's regular expressions (RE2), on Google's RE2 library, for every pattern a user writes.

PromQL matchers (``=~``, ``!~``), ``label_replace``, Alertmanager-style route, action and
silence matchers and the template functions are all Go ``regexp`` in Prometheus and
Alertmanager. Python's ``re`` reads much of the same text differently and, worse,
backtracks: ``(a+)+$`` against a long label value would stall the single event loop
for good (a silence is stored, so it would come back after every restart). RE2
matches in time linear in the input, with Go's syntax and semantics: ``.`` does not
match a newline, ``$`` is the end of the text, ``\\d``/``\\w``/``\\s``/``\\b`` are ASCII,
``(?i)`` in mid-pattern holds to the end of its group, POSIX classes, ``\\pL``.

:func:`compile_go` compiles a pattern as ``regexp.Compile`` does; :func:`compile_anchored`
as Prometheus and Alertmanager anchor a matcher, by text: ``^(?:pattern)$``.
:func:`match_anchored` is the yes/no test the matchers run per series and per alert,
with literal fast paths and a bounded memo (label values repeat from one evaluation to
the next, and a call into the binding costs several times a ``re`` call on short text).
What RE2 refuses (back-references, look-around, repeat counts over 1000) is a
:class:`~agent.errors.RegexError` naming the matcher; so are the three things C++ RE2
accepts and Go does not (``\\C``, ``(?<name>...)`` before Go 1.22, which Prometheus 2.42
and Alertmanager 0.25 are built with, groups nested past Go's parse-tree height, and patterns
past Go's program-size estimate, :mod:`agent.gocompat.regexsize`). Repeat counts follow Go's
rules, which C++ RE2 shares: a count over 1000 (``{1001}``, ``{2,1001}``, ``{1001,}``), and
nested repeats whose product exceeds 1000 (``(x{500}){500}``, Go's ``repeatIsValid``) are
refused (Go: "invalid repeat count", RE2: "invalid repetition size"); so is a repeat of a
repeat (``x{2}{2}``); a brace that is not a count (``x{1001``, ``x{01001}``) is literal text
in both.

:func:`expand` is Go's ``Regexp.Expand``, the replacement syntax of both
``label_replace`` and the template function ``reReplaceAll``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Protocol

import re2

from agent.errors import RegexError
from agent.gocompat.regexsize import too_large

__all__ = ["Match", "Regexp", "compile_anchored", "compile_go", "expand", "match_anchored"]

#: A reference in a replacement: ``$$``, ``${name}`` or ``$name`` (Go reads a name as
#: letters, digits and ``_``, as far as they go). Internal syntax, so Python's ``re``.
_GROUP_REF = re.compile(r"\$(?:(\$)|\{(\w+)\}|(\w+))")
#: A name Go reads as a group number: no leading zero, at most 9 digits.
_GROUP_NUMBER = re.compile(r"0|[1-9][0-9]{0,8}")
#: Characters that are never special in RE2 syntax: a pattern made only of these is a literal.
_LITERAL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:/@=,;!%&'\"<>~` #")
#: How many answers one anchored pattern remembers before it starts over.
_MEMO_SIZE = 16_384

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # the error is raised, with its reason; RE2 need not also print it to stderr


class Regexp(Protocol):
    """What the agent uses of a compiled pattern (Google's binding has no type hints)."""

    @property
    def groups(self) -> int: ...

    @property
    def groupindex(self) -> Mapping[str, int]: ...

    def search(self, text: str, pos: int = ..., /) -> Match | None: ...


class Match(Protocol):
    """What :func:`expand` and the template functions use of a match (``re``'s and RE2's alike)."""

    @property
    def re(self) -> Regexp: ...

    def group(self, key: int | str, /) -> str | None: ...

    def start(self) -> int: ...

    def end(self) -> int: ...


#: Go's ``regexp/syntax`` refuses a parse tree higher than this (``maxHeight``, Go 1.19.2 and later,
#: CVE-2022-41715); C++ RE2 has no such limit. Each capturing group is one level, and an anchored
#: matcher adds two (the concatenation ``^(?:...)$`` and the innermost node): amtool 0.25 accepts 998
#: nested groups in a matcher and refuses 999.
GO_MAX_HEIGHT = 1000


def _go_refuses(pattern: str, *, anchored: bool) -> str | None:
    """What in ``pattern`` C++ RE2 accepts but Go's ``regexp`` (1.19-1.21) does not, if anything."""
    i, in_class = 0, False
    groups: list[bool] = []  # open groups, innermost last: capturing or not
    depth = deepest = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1 : i + 2]
            if nxt == "C":
                return "invalid escape sequence: \\C"
            if nxt == "Q":  # \Q...\E is literal text
                end = pattern.find("\\E", i + 2)
                i = len(pattern) if end < 0 else end + 2
                continue
            i += 2
        elif in_class:
            if pattern.startswith("[:", i) and (end := pattern.find(":]", i + 2)) > 0:
                i = end + 2
                continue
            in_class = c != "]"
            i += 1
        elif c == "[":
            in_class = True
            i += 1
            i += pattern.startswith("^", i)
            i += pattern.startswith("]", i)  # a "]" first in the class is literal
        elif pattern.startswith("(?<", i) and pattern[i + 3 : i + 4] not in ("=", "!"):
            return "invalid or unsupported Perl syntax: (?<"
        elif c == "(":
            capturing = not pattern.startswith("(?", i) or pattern.startswith("(?P<", i)
            groups.append(capturing)
            depth += capturing
            deepest = max(deepest, depth)
            i += 1
        elif c == ")":
            depth -= bool(groups) and groups.pop()
            i += 1
        else:
            i += 1
    if deepest + (2 if anchored else 1) > GO_MAX_HEIGHT:
        return "expression nests too deeply"
    return None


def _shown(pattern: str) -> str:
    """The pattern as an error message quotes it: a hostile 100 KB pattern is cut, not echoed."""
    return repr(pattern) if len(pattern) <= 200 else f"{pattern[:200]!r}... ({len(pattern)} characters)"


def _compile(text: str, pattern: str, what: str) -> Regexp:
    refused = _go_refuses(pattern, anchored=text != pattern)
    if refused is None and too_large(text):
        refused = "expression too large"
    if refused is not None:
        raise RegexError(f"{what}: not a regular expression in RE2 syntax: {_shown(pattern)} ({refused})")
    try:
        compiled: Regexp = re2.compile(text, _OPTIONS)
    except UnicodeEncodeError as exc:  # a lone surrogate (JSON allows "\ud800"): not UTF-8, so not a Go string
        raise RegexError(f"{what}: not a regular expression in RE2 syntax: {_shown(pattern)} "
                         "(not valid UTF-8)") from exc
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
        raise RegexError(f"{what}: not a regular expression in RE2 syntax: {_shown(pattern)} ({reason})") from exc
    return compiled


@functools.lru_cache(maxsize=1024)
def compile_go(pattern: str, *, what: str = "regexp") -> Regexp:
    """``pattern`` compiled as Go's ``regexp.Compile`` does (unanchored); :class:`RegexError` names ``what``."""
    return _compile(pattern, pattern, what)


@functools.lru_cache(maxsize=1024)
def compile_anchored(pattern: str, *, what: str = "regexp") -> Regexp:
    """``pattern`` anchored as Prometheus and Alertmanager anchor a matcher: ``^(?:pattern)$`` (by text,
    so it means exactly what it means there); use ``search`` on the result. :class:`RegexError` names ``what``."""
    return _compile(f"^(?:{pattern})$", pattern, what)


def _is_literal(text: str) -> bool:
    return all(c in _LITERAL_CHARS for c in text)


def _fast_path(pattern: str) -> Callable[[str], bool] | None:
    """A plain-Python test that gives RE2's answer for ``^(?:pattern)$``, for the shapes PromQL users
    write most (Prometheus' own regex matcher takes the same shortcuts), or None. ``.`` never matches
    a newline and a literal here never contains one, so ``.*`` is "no newline"."""
    if _is_literal(pattern):
        return pattern.__eq__
    alternatives = pattern.split("|")
    if all(_is_literal(a) for a in alternatives):
        return frozenset(alternatives).__contains__
    if pattern in (".*", ".+"):
        nonempty = pattern == ".+"
        return lambda v: (bool(v) or not nonempty) and "\n" not in v
    head, dot_star, tail = pattern.partition(".*")
    if not dot_star:
        return None
    if _is_literal(head) and _is_literal(tail):  # prefix.*suffix (either may be empty)
        least = len(head) + len(tail)
        return lambda v: len(v) >= least and v.startswith(head) and v.endswith(tail) and "\n" not in v
    if not head and tail.endswith(".*") and _is_literal(inner := tail[:-2]):  # .*inner.*
        return lambda v: inner in v and "\n" not in v
    return None


def match_anchored(pattern: str, *, what: str = "regexp") -> Callable[[str], bool]:
    """Whether a value matches ``^(?:pattern)$``, as a function of the value: the matchers' hot path.

    Literals, literal alternations (``a|b|c``), ``.*``, ``prefix.*``, ``.*suffix`` and ``.*inner.*``
    are answered in plain Python, giving RE2's answer; anything else asks RE2 once per distinct value,
    remembering up to ``_MEMO_SIZE`` answers (label values repeat from one evaluation to the next).
    :class:`RegexError` (naming ``what``) if RE2 refuses the pattern.
    """
    search = compile_anchored(pattern, what=what).search  # compiled even for a fast path: it validates
    fast = _fast_path(pattern)
    if fast is not None:
        return fast
    memo: dict[str, bool] = {}

    def matches(value: str) -> bool:
        hit = memo.get(value)
        if hit is None:
            if len(memo) >= _MEMO_SIZE:
                memo.clear()
            hit = memo[value] = search(value) is not None
        return hit

    return matches


def expand(template: str, match: Match) -> str:
    """Go's ``Regexp.Expand``: ``$1``/``${1}``/``$name``/``${name}`` become the group's
    text, ``$$`` a dollar; an unknown group, or one that did not take part, expands to
    nothing (``$1x`` means group ``1x``, not group 1 then "x"); a ``$`` that starts no
    reference (``${``, ``$-``) stays as it is."""
    groups, names = match.re.groups, match.re.groupindex

    def one(ref: re.Match[str]) -> str:
        if ref.group(1):
            return "$"
        name = ref.group(2) or ref.group(3)
        if _GROUP_NUMBER.fullmatch(name):
            return (match.group(int(name)) or "") if int(name) <= groups else ""
        return (match.group(name) or "") if name in names else ""

    return _GROUP_REF.sub(one, template)
