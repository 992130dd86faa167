"""Go's regexp size limit, which C++ RE2 does not have: a pattern Go refuses as "too large".

Since Go 1.19.2 (CVE-2022-41715) ``regexp/syntax`` refuses a pattern whose compiled program
would exceed 128 MB: while parsing it estimates each node's instruction count
(``calcSize``) and panics with ``ErrLarge`` ("expression too large"; Go 1.19's backport,
which Alertmanager 0.25 and Prometheus 2.42 are built with, says "internal error") past
:data:`GO_MAX_SIZE` instructions. C++ RE2 bounds memory differently (``max_mem``, 8 MiB) and
simplifies first: it folds a repeat of empty-width assertions (``(?:\\b\\b...){1000}``) and
coalesces ``a*a*a*`` into one loop, so it compiles small programs for patterns Go refuses.
``amtool`` refuses ``(?:a*a*...){1000}`` with 1,200 ``a*`` and accepts it with 1,000; without
this check the agent accepted both.

:func:`go_size` walks the pattern once (no recursion, so nesting depth costs nothing) and
gives Go's estimate with Go's own formulas: a literal rune, class, ``.`` or assertion is 1; a
capture and ``x*`` add 2; ``x+`` and ``x?`` add 1; ``x{n,m}`` is ``m * x + (m - n)``;
``x{n,}`` is ``1 + n * x``; amtool's thresholds match these exactly (``(?:a*...){1000}`` passes
with 1,118 ``a*`` and fails with 1,119; ``(?:\\b...){1000}`` with 3,355 and 3,356). One
deliberate difference: Go factors alternations
(``abc|abd`` is ``ab[cd]``, ``a|b`` is ``[ab]``) before measuring them, which this walk does not
reproduce: an alternation counts as Go counts it (``sum + branches - 1``) only where no two
neighbouring branches start alike or are single atoms, and otherwise as its largest branch,
a lower bound. The check can therefore miss a
pattern Go would refuse (C++ RE2's own, smaller budget catches most of those), but never
refuses one Go accepts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["GO_MAX_SIZE", "go_size", "too_large"]

#: Go's ``maxSize``: 128 MB of program at ``instSize`` (40 bytes) per instruction.
GO_MAX_SIZE = (128 << 20) // 40
_CLASS_ESCAPES = frozenset("dDsSwWpP")
_EMPTY_ESCAPES = frozenset("bBAz")
#: Flags that start a branch (``(?i)``), skipped to find what it starts with. Internal syntax, so Python's ``re``.
_FLAGS = re.compile(r"^\(\?[a-zA-Z-]*\)")


@dataclass
class _Item:
    size: int


@dataclass
class _Frame:
    capture: bool
    start: int  # where the alternative being read starts in the pattern
    branches: list[int] = field(default_factory=list)  # sizes of the finished alternatives
    heads: list[tuple[str, bool]] = field(default_factory=list)  # their first character, and whether one atom
    items: list[_Item] = field(default_factory=list)  # the alternative being read

    def close_branch(self, pattern: str, end: int) -> None:
        self.branches.append(max(1, sum(i.size for i in self.items)))
        text = _FLAGS.sub("", pattern[self.start : end], count=1)  # (?i)ab starts with a, as Go factors it
        self.heads.append((text[:2] if text.startswith("\\") else text[:1].lower(),
                           len(self.items) == 1 and self.items[0].size == 1))
        self.items, self.start = [], end + 1

    def size(self, pattern: str, end: int) -> int:
        """Go's size of the alternation (``sum + branches - 1``), or, where Go's factoring could shrink
        it (two neighbours that start alike, or two single atoms it would merge into a class), a lower
        bound: its largest branch."""
        self.close_branch(pattern, end)
        if len(self.branches) == 1:
            return self.branches[0]
        pairs = zip(self.heads, self.heads[1:], strict=False)
        if any(a[0] == b[0] or (a[1] and b[1]) for a, b in pairs):
            return max(self.branches)
        return sum(self.branches) + len(self.branches) - 1


def _repeat_bounds(pattern: str, i: int) -> tuple[int, int, int] | None:
    """``{n}``, ``{n,}`` or ``{n,m}`` at ``i`` as (min, max or -1, index after it), or None where Go reads
    the brace as a literal (no digits, a leading zero, no closing brace)."""
    end = pattern.find("}", i)
    if end < 0:
        return None
    body = pattern[i + 1 : end]
    lo, comma, hi = body.partition(",")
    if not _number(lo) or (hi and not _number(hi)):
        return None
    return int(lo), (int(hi) if hi else -1 if comma else int(lo)), end + 1


def _number(text: str) -> bool:
    return text.isascii() and text.isdigit() and (len(text) == 1 or text[0] != "0") and len(text) <= 8


def _skip_class(pattern: str, i: int) -> int:
    """The index after the character class starting at ``i`` (``[``)."""
    i += 1
    i += pattern.startswith("^", i)
    i += pattern.startswith("]", i)  # a "]" first in the class is literal
    while i < len(pattern) and pattern[i] != "]":
        if pattern.startswith("[:", i) and (end := pattern.find(":]", i + 2)) > 0:
            i = end + 2
        else:
            i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _escape(pattern: str, i: int) -> tuple[list[_Item], int]:
    """The atoms of the escape at ``i`` (a backslash) and the index after it."""
    c = pattern[i + 1 : i + 2]
    if c == "Q":
        end = pattern.find("\\E", i + 2)
        text = pattern[i + 2 :] if end < 0 else pattern[i + 2 : end]
        return [_Item(1) for _ in text], len(pattern) if end < 0 else end + 2
    if c in _CLASS_ESCAPES:
        brace = c in "pP" and pattern.startswith("{", i + 2)
        end = pattern.find("}", i + 2) + 1 if brace else i + 3 if c in "pP" else i + 2
        return [_Item(1)], max(end, i + 2)
    if c in _EMPTY_ESCAPES:
        return [_Item(1)], i + 2
    if c == "x" and pattern.startswith("{", i + 2):
        return [_Item(1)], max(pattern.find("}", i + 3) + 1, i + 3)
    if c == "x":
        return [_Item(1)], i + 4
    return [_Item(1)], i + 2


def go_size(pattern: str) -> int:
    """Go's size estimate for ``pattern``, in program instructions (see the module docstring)."""
    stack = [_Frame(capture=False, start=0)]
    i = 0
    while i < len(pattern):
        frame, c = stack[-1], pattern[i]
        if c == "\\":
            atoms, i = _escape(pattern, i)
            frame.items.extend(atoms)
            continue
        if c == "[":
            frame.items.append(_Item(1))
            i = _skip_class(pattern, i)
            continue
        if c == "(":
            if pattern.startswith("(?", i) and not pattern.startswith(("(?P<", "(?<"), i):
                end = min((j for j in (pattern.find(")", i), pattern.find(":", i)) if j >= 0), default=len(pattern))
                if end < len(pattern) and pattern[end] == ")":  # (?i): flags for the rest of the group
                    i = end + 1
                    continue
                stack.append(_Frame(capture=False, start=end + 1))
                i = end + 1
                continue
            if pattern.startswith(("(?P<", "(?<"), i):
                end = pattern.find(">", i)
                i = len(pattern) if end < 0 else end + 1
            else:
                i += 1
            stack.append(_Frame(capture=True, start=i))
            continue
        if c == ")" and len(stack) > 1:
            done = stack.pop()
            stack[-1].items.append(_Item(done.size(pattern, i) + (2 if done.capture else 0)))
            i += 1
            continue
        if c == "|":
            frame.close_branch(pattern, i)
            i += 1
            continue
        bounds = _repeat_bounds(pattern, i) if c == "{" else None
        if c in "*+?" or bounds is not None:
            if not frame.items:  # a repetition of nothing: both RE2s refuse it with their own message
                i += 1
                continue
            sub = frame.items.pop().size
            if c == "*":
                size, i = 2 + sub, i + 1
            elif c in "+?":
                size, i = 1 + sub, i + 1
            else:
                assert bounds is not None
                lo, hi, i = bounds
                size = (2 + sub if lo == 0 else 1 + lo * sub) if hi < 0 else hi * sub + (hi - lo)
            i += pattern.startswith("?", i)  # non-greedy
            frame.items.append(_Item(max(1, size)))
            continue
        frame.items.append(_Item(1))
        i += 1
    while len(stack) > 1:  # an unclosed group: RE2 refuses the pattern; measure what there is
        done = stack.pop()
        stack[-1].items.append(_Item(done.size(pattern, len(pattern))))
    return stack[0].size(pattern, len(pattern))


def too_large(pattern: str) -> bool:
    """Whether Go's ``regexp/syntax`` refuses ``pattern`` as too large (see the module docstring)."""
    return go_size(pattern) > GO_MAX_SIZE
