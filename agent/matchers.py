"""Alert-label matchers in Alertmanager's syntax: ``severity="critical"``, ``alertname=~"VLLM.*"``.

Used by routes, actions, scaling services and silences, so one grammar covers every
place a user selects alerts. It follows Alertmanager 0.25's classic parser
(``pkg/labels/parse.go``): ``name op value`` with ``=``, ``!=``, ``=~``, ``!~``; the
value may be double-quoted (with ``\\"``, ``\\\\`` and ``\\n`` escapes) or bare;
regular expressions are anchored at both ends; an unset label matches as ``""``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = ["Matcher", "matchers_from", "matches_all", "parse_matcher"]

_MATCHER_RE = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(=~|=|!=|!~)\s*(.*?)\s*$", re.DOTALL)
_OPS = ("=", "!=", "=~", "!~")


@dataclass(frozen=True)
class Matcher:
    name: str
    op: str
    value: str
    _rx: re.Pattern[str] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.op not in _OPS:
            raise ValueError(f"unknown matcher operator {self.op!r} (use =, !=, =~ or !~)")
        if self.op in ("=~", "!~"):
            try:
                object.__setattr__(self, "_rx", re.compile(f"^(?:{self.value})$", re.DOTALL))
            except re.error as exc:
                raise ValueError(f"{self.name}{self.op}: not a regular expression: {self.value!r} ({exc})") from exc

    def matches(self, labels: Mapping[str, str]) -> bool:
        v = labels.get(self.name, "")
        if self.op == "=":
            return v == self.value
        if self.op == "!=":
            return v != self.value
        assert self._rx is not None
        hit = self._rx.match(v) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'{self.name}{self.op}"{escaped}"'


def parse_matcher(text: str) -> Matcher:
    """Parse one matcher; ``ValueError`` says what is wrong with it."""
    m = _MATCHER_RE.match(text)
    if m is None:
        raise ValueError(f"bad matcher {text!r}: expected name=\"value\", name!=\"value\", "
                         "name=~\"regex\" or name!~\"regex\"")
    name, op, raw = m.groups()
    return Matcher(name, op, _unquote(raw, text))


def _unquote(raw: str, text: str) -> str:
    if not (len(raw) >= 2 and raw[0] == '"' and raw[-1] == '"'):
        if '"' in raw:
            raise ValueError(f"bad matcher {text!r}: unbalanced quotes")
        return raw
    out, i, body = [], 0, raw[1:-1]
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            out.append({"n": "\n", '"': '"', "\\": "\\"}.get(nxt, "\\" + nxt))
            i += 2
            continue
        if c == '"':
            raise ValueError(f"bad matcher {text!r}: unescaped quote inside the value")
        out.append(c)
        i += 1
    return "".join(out)


def matchers_from(
    matchers: Iterable[str] = (), match: Mapping[str, str] | None = None, match_re: Mapping[str, str] | None = None
) -> list[Matcher]:
    """Every form of matching a config item can use, as one list (all must hold)."""
    out = [parse_matcher(t) for t in matchers]
    out += [Matcher(k, "=", v) for k, v in (match or {}).items()]
    out += [Matcher(k, "=~", v) for k, v in (match_re or {}).items()]
    return out


def matches_all(matchers: Iterable[Matcher], labels: Mapping[str, str]) -> bool:
    return all(m.matches(labels) for m in matchers)
