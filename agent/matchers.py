"""Alert-label matchers in Alertmanager's syntax: ``severity="critical"``, ``alertname=~"VLLM.*"``.

Used by routes, actions, scaling services and silences, so one grammar covers every
place a user selects alerts. It follows Alertmanager 0.25's classic parser
(``pkg/labels/parse.go``), checked against ``amtool`` in ``tests/test_matchers.py``:
``name op value`` with ``=``, ``!=``, ``=~``, ``!~``; the value may be double-quoted or
bare, and in either form ``\\"``, ``\\\\`` and ``\\n`` are escapes (any other backslash is
literal); :func:`parse_matchers` also takes Alertmanager's comma-separated list form
(``{a="b", c=~"d"}``), which is how a route's ``matchers:`` entries are read.

Regular expressions are Go's RE2, on Google's RE2 library
(:mod:`agent.gocompat.regex`), anchored at both ends by text as Alertmanager does
(``^(?:re)$``); an unset label matches as ``""``. So a pattern means here what it
means in Alertmanager, what RE2 refuses (look-around, back-references, repeat counts
over 1000) is refused here naming the matcher, and no pattern can make a match take
more than linear time: a silence posted to the API cannot stall the event loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from agent.gocompat.regex import match_anchored

__all__ = ["AlertMatcher", "matchers_from", "matches_all", "parse_matcher", "parse_matchers"]

# Alertmanager's own pattern up to the operator (Go's \s is [\t\n\f\r ]); its "\s*(.*?)\s*$" tail is a strip
# here, since Python's re would take quadratic time over a long run of blanks in text from the API.
_MATCHER_HEAD_RE = re.compile(r"[\t\n\f\r ]*([a-zA-Z_:][a-zA-Z0-9_:]*)[\t\n\f\r ]*(=~|=|!=|!~)")
_GO_SPACE = "\t\n\f\r "
_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class AlertMatcher:
    """One ``name op value`` test on an alert's labels (routes, silences, actions), in Alertmanager's
    syntax. Selecting series from the store is :class:`agent.store.SeriesMatcher`'s job."""

    name: str
    op: str
    value: str
    _rx: Callable[[str], bool] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown matcher operator {self.op!r} (use =, !=, =~ or !~)")
        if self.op in ("=~", "!~"):
            # RegexError (a ValueError) names the matcher: config validation, the API and the CLI report it as such
            object.__setattr__(self, "_rx", match_anchored(self.value, what=f"{self.name}{self.op}"))

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this matcher (a missing label is ``""``)."""
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        assert self._rx is not None
        hit = self._rx(v)
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{escaped}"'


def parse_matcher(text: str) -> AlertMatcher:
    """Parse one matcher; ``ValueError`` says what is wrong with it."""
    m = _MATCHER_HEAD_RE.match(text)
    if m is None:
        raise ValueError(f"bad matcher {text!r}: expected name=\"value\", name!=\"value\", "
                         "name=~\"regex\" or name!~\"regex\"")
    name, op = m.groups()
    return AlertMatcher(name, op, _unquote(text[m.end():].strip(_GO_SPACE), text))


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
