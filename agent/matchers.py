"""Alert-label matchers in Alertmanager's syntax: ``severity="critical"``, ``alertname=~"VLLM.*"``.

Used by routes, actions, scaling services and silences, so one grammar covers every
place a user selects alerts. It follows Alertmanager 0.25's classic parser
(``pkg/labels/parse.go``), checked against ``amtool`` in ``tests/test_matchers.py``:
``name op value`` with ``=``, ``!=``, ``=~``, ``!~``; the value may be double-quoted or
bare, and in either form ``\\"``, ``\\\\`` and ``\\n`` are escapes (any other backslash is
literal); :func:`parse_matchers` also takes Alertmanager's comma-separated list form
(``{a="b", c=~"d"}``), which is how a route's ``matchers:`` entries are read.

Regular expressions are Go's RE2 dialect, anchored at both ends (``^(?:re)$``); an
unset label matches as ``""``. :func:`_go_regex` rewrites the places where Python's
``re`` reads the same text differently (``(?i)`` in mid-pattern, ``$`` before a final
newline, ``\\d``/``\\w``/``\\s`` beyond ASCII, ``\\z``, ``[[:alpha:]]``, ``{,n}``) and
rejects what RE2 has not got (look-around, back-references, possessive quantifiers),
so a pattern means here what it means in Alertmanager. ``\\pL``-style classes and
other RE2-only escapes are not translated: Python rejects them, loudly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["AlertMatcher", "matchers_from", "matches_all", "parse_matcher", "parse_matchers"]

# Alertmanager's own pattern; Go's \s is [\t\n\f\r ] and its $ is the end of the text.
_MATCHER_RE = re.compile(r"[\t\n\f\r ]*([a-zA-Z_:][a-zA-Z0-9_:]*)[\t\n\f\r ]*(=~|=|!=|!~)[\t\n\f\r ]*(.*?)[\t\n\f\r ]*",
                         re.DOTALL)
_GO_SPACE = "\t\n\f\r "
_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class AlertMatcher:
    """One ``name op value`` test on an alert's labels (routes, silences, actions), in Alertmanager's
    syntax. Selecting series from the store is :class:`agent.store.SeriesMatcher`'s job."""

    name: str
    op: str
    value: str
    _rx: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown matcher operator {self.op!r} (use =, !=, =~ or !~)")
        if self.op in ("=~", "!~"):
            try:
                # fullmatch anchors at both ends like Go's ^(?:re)$ (Python's $ would also match before a final \n)
                object.__setattr__(self, "_rx", re.compile(_go_regex(self.value)))
            except (re.error, ValueError) as exc:
                raise ValueError(f"{self.name}{self.op}: not a regular expression: {self.value!r} ({exc})") from exc

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this matcher (a missing label is ``""``)."""
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        assert self._rx is not None
        hit = self._rx.fullmatch(v) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{escaped}"'


_ASCII_CLASSES = {"d": "0-9", "w": "0-9A-Za-z_", "s": "\\t\\n\\f\\r "}
_POSIX_CLASSES = {
    "alnum": "0-9A-Za-z", "alpha": "A-Za-z", "ascii": "\\x00-\\x7f", "blank": "\\t ", "cntrl": "\\x00-\\x1f\\x7f",
    "digit": "0-9", "graph": "!-~", "lower": "a-z", "print": " -~", "punct": "!-/:-@\\[-`{-~",
    "space": "\\t\\n\\v\\f\\r ", "upper": "A-Z", "word": "0-9A-Za-z_", "xdigit": "0-9A-Fa-f",
}
_FLAGS_RE = re.compile(r"\(\?([imsU]*(?:-[imsU]*)?)([:)])")
_EMPTY_MIN_REPEAT_RE = re.compile(r"\{,[0-9]*\}")
_REPEAT_RE = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")


@dataclass
class _Group:
    multiline: bool
    opener: str = ""  # for a mid-group "(?i)": the Python group standing in for it (it closes with its enclosing group)


def _go_regex(rx: str) -> str:
    """Go RE2 pattern -> an equivalent Python pattern for ``fullmatch``; ``ValueError`` if RE2 lacks a construct."""
    out: list[str] = []
    groups = [_Group(multiline=False)]
    i, quantified = 0, False  # quantified: the previous token was a repetition (so a "+" would be possessive)
    while i < len(rx):
        c = rx[i]
        was_quantified, quantified = quantified, False
        if c == "\\":
            nxt = rx[i + 1: i + 2]
            if nxt and nxt.lower() in _ASCII_CLASSES:
                out.append(("[^" if nxt.isupper() else "[") + _ASCII_CLASSES[nxt.lower()] + "]")
            elif nxt == "z":
                out.append(r"\Z")
            elif nxt and nxt in "123456789":
                raise ValueError(f"back-references (\\{nxt}) are not RE2 syntax")
            else:
                out.append(c + nxt)
            i += 2
        elif c == "[":
            i = _char_class(rx, i, out)
        elif c == "(":
            i = _open_group(rx, i, out, groups)
        elif c in ")|":
            # "(?i)" flags hold across "|" to the end of the enclosing group: close and reopen their Python groups.
            virtual = []
            while len(groups) > 1 and groups[-1].opener:
                virtual.append(groups.pop())
                out.append(")")
            if c == ")" and len(groups) > 1:
                groups.pop()
            out.append(c)
            if c == "|":
                for g in reversed(virtual):
                    groups.append(g)
                    out.append(g.opener)
            i += 1
        elif c == "$":
            out.append("$" if groups[-1].multiline else r"\Z")
            i += 1
        elif c == "{" and (m := _EMPTY_MIN_REPEAT_RE.match(rx, i)):
            out.append("\\" + m.group())  # RE2 reads {,n} literally; Python 3.11 as {0,n}
            i = m.end()
        elif c in "*+?" or (c == "{" and _REPEAT_RE.match(rx, i)):
            if c == "+" and was_quantified:
                raise ValueError("possessive quantifiers (a++, a*+) are not RE2 syntax")
            m = _REPEAT_RE.match(rx, i) if c == "{" else None
            token = m.group() if m else c
            out.append(token)
            quantified = True
            i += len(token)
        else:
            out.append(c)
            i += 1
    out.extend(")" for g in groups if g.opener)
    return "".join(out)


def _open_group(rx: str, i: int, out: list[str], groups: list[_Group]) -> int:
    """Translate the group opening at ``rx[i]`` (``(``, ``(?:``, ``(?P<n>``, ``(?flags)``, ``(?flags:``)."""
    if not rx.startswith("(?", i) or rx.startswith("(?P<", i):
        opener = "(?P<" if rx.startswith("(?P<", i) else "("
        groups.append(_Group(groups[-1].multiline))
        out.append(opener)
        return i + len(opener)
    m = _FLAGS_RE.match(rx, i)
    if m is None:
        raise ValueError(f"{rx[i:i + 4]!r}...: look-around, atomic and conditional groups are not RE2 syntax")
    on, _, off = m.group(1).partition("-")
    multiline = ("m" in on) or (groups[-1].multiline and "m" not in off)
    on, off = on.replace("U", ""), off.replace("U", "")  # ungreedy changes no match/no-match answer
    opener = f"(?{on}{'-' + off if off else ''}:" if on or off else "(?:"
    out.append(opener)
    groups.append(_Group(multiline, opener if m.group(2) == ")" else ""))
    return m.end()


def _char_class(rx: str, i: int, out: list[str]) -> int:
    """Translate the bracket expression starting at ``rx[i] == "["``; return the index after it."""
    out.append("[")
    i += 1
    if rx.startswith("^", i):
        out.append("^")
        i += 1
    first = True
    while i < len(rx):
        c = rx[i]
        if c == "]" and not first:
            out.append("]")
            return i + 1
        first = False
        if c == "\\":
            nxt = rx[i + 1: i + 2]
            out.append(_ASCII_CLASSES.get(nxt, c + nxt))
            i += 2
        elif c == "[" and rx.startswith("[:", i):
            end = rx.find(":]", i + 2)
            name = rx[i + 2: end] if end > 0 else ""
            if name.startswith("^"):
                raise ValueError(f"negated POSIX class [:{name}:] is not supported")
            if name not in _POSIX_CLASSES:
                raise ValueError(f"unknown POSIX class [:{name}:]")
            out.append(_POSIX_CLASSES[name])
            i = end + 2
        elif c in "[&~|]":  # "]" here is the first character, a literal
            out.append("\\" + c)  # literal in RE2; Python reserves "[", "&&", "~~", "||" for set operations
            i += 1
        else:
            out.append(c)
            i += 1
    raise ValueError("missing closing ]")


def parse_matcher(text: str) -> AlertMatcher:
    """Parse one matcher; ``ValueError`` says what is wrong with it."""
    m = _MATCHER_RE.fullmatch(text)
    if m is None:
        raise ValueError(f"bad matcher {text!r}: expected name=\"value\", name!=\"value\", "
                         "name=~\"regex\" or name!~\"regex\"")
    name, op, raw = m.groups()
    return AlertMatcher(name, op, _unquote(raw, text))


def _unquote(raw: str, text: str) -> str:
    """Alertmanager's unescaping: an optional pair of quotes; \\n, \\" and \\\\ escapes; other backslashes literal."""
    quoted = raw.startswith('"')
    body = raw[1:] if quoted else raw
    out: list[str] = []
    escaped = False
    for i, c in enumerate(body):
        if escaped:
            escaped = False
            out.append({"n": "\n", '"': '"', "\\": "\\"}.get(c, "\\" + c))
        elif c == "\\":
            if i < len(body) - 1:
                escaped = True
            else:
                out.append(c)  # a backslash as the last character is literal
        elif c == '"':
            if not quoted or i < len(body) - 1:
                raise ValueError(f"bad matcher {text!r}: unescaped double quote in the value")
            quoted = False  # the closing quote
        else:
            out.append(c)
    if quoted:
        raise ValueError(f"bad matcher {text!r}: the value's closing quote is missing")
    return "".join(out)


def parse_matchers(text: str) -> list[AlertMatcher]:
    """Alertmanager's list form: ``{a="b", c=~"d"}`` or ``a=b,c=~d`` (braces optional, a trailing comma allowed).

    Commas inside double quotes do not split; an empty string gives no matchers.
    """
    s = text.removeprefix("{").removesuffix("}")
    tokens: list[str] = []
    token: list[str] = []
    inside_quotes = escaped = False
    for c in s:  # a transcription of ParseMatchers' tokenizer, quirks included
        if c == ",":
            if not inside_quotes:
                tokens.append("".join(token))
                token = []
                continue
        elif c == '"':
            if not escaped:
                inside_quotes = not inside_quotes
            else:
                escaped = False
        elif c == "\\":
            escaped = not escaped
        else:
            escaped = False
        token.append(c)
    last = "".join(token).strip(_GO_SPACE)
    if last:
        tokens.append(last)
    return [parse_matcher(t) for t in tokens]


def matchers_from(
    matchers: Iterable[str] = (), match: Mapping[str, str] | None = None, match_re: Mapping[str, str] | None = None
) -> list[AlertMatcher]:
    """Every form of matching a config item can use, as one list (all must hold).

    Each ``matchers`` entry is read with :func:`parse_matchers`, as Alertmanager reads a
    route's ``matchers:``, so ``'a="b",c="d"'`` is two matchers.
    """
    out = [m for t in matchers for m in parse_matchers(t)]
    out += [AlertMatcher(k, "=", v) for k, v in (match or {}).items()]
    out += [AlertMatcher(k, "=~", v) for k, v in (match_re or {}).items()]
    return out


def matches_all(matchers: Iterable[AlertMatcher], labels: Mapping[str, str]) -> bool:
    """Whether every matcher holds (vacuously true for none)."""
    return all(m.matches(labels) for m in matchers)
