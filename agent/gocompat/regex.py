"""Go (RE2) regular-expression syntax, translated to Python's ``re``.

PromQL regexes (``=~``, ``!~``, ``label_replace``) are Go's. Most are valid Python as
they stand; the differences that matter in practice are rewritten here:

* ``(?i)`` in the middle of a pattern sets the flag until the end of the enclosing
  group in Go; Python 3.11 only allows global flags at the very start. It becomes a
  scoped ``(?i:...)`` group, closed and reopened around ``|`` so alternation keeps
  its meaning (``a(?i)b|c`` is ``a(?i:b)|(?i:c)``).
* POSIX classes inside brackets (``[[:alpha:]]``) become explicit ranges.
* ``\\z`` (end of text) is ``\\Z`` in Python.
* ``.`` does not match a newline in Go (nor in Prometheus 2.42); :func:`to_python`
  wraps the result in ``(?-s:...)`` so a caller compiling with ``re.DOTALL`` still
  gets Go's meaning.

What has no Python equivalent (``\\pL`` Unicode classes, the ``U`` flag) is left for
``re`` to reject, so the expression fails to load instead of matching differently.

:func:`expand` is Go's ``Regexp.Expand``, the replacement syntax of both
``label_replace`` and the template function ``reReplaceAll``.
"""

from __future__ import annotations

import re

__all__ = ["expand", "to_python"]

_FLAGS_ONLY = re.compile(r"\(\?([imsU]*(?:-[imsU]*)?)\)")
#: A reference in a replacement: ``$$``, ``${name}`` or ``$name`` (Go reads a name as
#: letters, digits and ``_``, as far as they go).
_GROUP_REF = re.compile(r"\$(?:(\$)|\{(\w+)\}|(\w+))")
#: A name Go reads as a group number: no leading zero, at most 9 digits.
_GROUP_NUMBER = re.compile(r"0|[1-9][0-9]{0,8}")
_POSIX = {
    "alnum": "0-9A-Za-z",
    "alpha": "A-Za-z",
    "ascii": "\\x00-\\x7f",
    "blank": "\\t ",
    "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9",
    "graph": "!-~",
    "lower": "a-z",
    "print": " -~",
    "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ",
    "upper": "A-Z",
    "word": "0-9A-Za-z_",
    "xdigit": "0-9A-Fa-f",
}


def _char_class(p: str, i: int) -> tuple[str, int]:
    """Copy the bracket expression starting at ``p[i] == '['``, expanding POSIX classes."""
    out = ["["]
    j = i + 1
    if p.startswith("^", j):
        out.append("^")
        j += 1
    if p.startswith("]", j):
        out.append("\\]")
        j += 1
    while j < len(p) and p[j] != "]":
        if p[j] == "\\":
            out.append(p[j : j + 2])
            j += 2
            continue
        if p.startswith("[:", j):
            end = p.find(":]", j + 2)
            name = p[j + 2 : end] if end > 0 else ""
            negated = name.startswith("^")
            chars = _POSIX.get(name.lstrip("^"))
            if chars is not None and not negated:
                out.append(chars)
                j = end + 2
                continue
        if p[j] == "[":
            out.append("\\[")  # a literal '[' inside a class (Python would warn)
            j += 1
            continue
        out.append(p[j])
        j += 1
    out.append("]")
    return "".join(out), j + 1


def _translate(p: str) -> str:
    out: list[str] = []
    # For each open group: the flag groups opened inside it that must close with it.
    stack: list[list[str]] = [[]]
    i = 0
    while i < len(p):
        c = p[i]
        if c == "\\":
            nxt = p[i + 1 : i + 2]
            out.append("\\Z" if nxt == "z" else p[i : i + 2])
            i += 2
        elif c == "[":
            text, i = _char_class(p, i)
            out.append(text)
        elif c == "(":
            m = _FLAGS_ONLY.match(p, i)
            if m is not None:
                if m.group(1) not in ("", "-"):
                    out.append(f"(?{m.group(1)}:")
                    stack[-1].append(m.group(1))
                i = m.end()
            else:
                stack.append([])
                out.append(c)
                i += 1
        elif c == ")":
            out.append(")" * len(stack.pop()) if len(stack) > 1 else "")
            out.append(")")
            i += 1
        elif c == "|" and stack[-1]:
            flags = stack[-1]
            out.append(")" * len(flags) + "|" + "".join(f"(?{f}:" for f in flags))
            i += 1
        else:
            out.append(c)
            i += 1
    out.append(")" * len(stack[0]))
    return "".join(out)


def to_python(pattern: str) -> str:
    """``pattern`` (Go syntax) as an equivalent Python pattern; see the module docstring."""
    return f"(?-s:{_translate(pattern)})"


def expand(template: str, match: re.Match[str]) -> str:
    """Go's ``Regexp.Expand``: ``$1``/``${1}``/``$name``/``${name}`` become the group's
    text, ``$$`` a dollar; an unknown group, or one that did not take part, expands to
    nothing (``$1x`` means group ``1x``, not group 1 then "x"); a ``$`` that starts no
    reference (``${``, ``$-``) stays as it is."""

    def one(ref: re.Match[str]) -> str:
        if ref.group(1):
            return "$"
        name = ref.group(2) or ref.group(3)
        if _GROUP_NUMBER.fullmatch(name):
            return (match.group(int(name)) or "") if int(name) <= match.re.groups else ""
        return (match.group(name) or "") if name in match.re.groupindex else ""

    return _GROUP_REF.sub(one, template)
