"""Syntax the parser accepts but Prometheus 2.42 does not.

promql-parser follows Prometheus 3.x, which added syntax that a 2.42 server rejects:
durations as numbers (``1h + 1``), durations without a unit (``x[5]``, ``offset 5``),
quoted UTF-8 label names (``{"my.label"="x"}``). Our rule files must also load into a
2.42 Prometheus (DESIGN.md decision 1), so :func:`newer_syntax` finds such constructs
in the expression text, and :func:`agent.promql.syntax.parse` rejects them by name.
These constructs leave no trace in the AST (``1h`` is just the number 3600 there),
hence a small scan of the tokens instead.

It also spots a negative ``@`` timestamp, which the parser accepts but cannot hand
back (reading it panics inside Rust).
"""

from __future__ import annotations

import re

__all__ = ["newer_syntax"]

_TOKEN = re.compile(
    r"""(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      | (?P<dur>(?:\d+(?:ms|[smhdwy]))+)(?![\w.])
      | (?P<num>0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
      | (?P<ident>[a-zA-Z_][\w:]*|:[a-zA-Z_:][\w:]*)
      | (?P<ws>\s+)
      | (?P<punct>.)""",
    re.VERBOSE | re.DOTALL,
)


_NEWER = "valid in newer Prometheus, not in 2.42"


def newer_syntax(text: str) -> tuple[str, str] | None:
    """The first construct in ``text`` that the engine must reject although the parser
    took it, with the reason, or None."""
    brackets = braces = 0
    prev = prev2 = ""  # the last two significant tokens (kind:text)
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or ""
        if kind == "ws":
            continue
        tok = m.group()
        after_offset = prev == "ident:offset" or (prev == "punct:-" and prev2 == "ident:offset")
        if kind == "dur" and not brackets and not after_offset:
            return "duration used as a number", _NEWER
        if kind == "num" and (brackets or after_offset):
            return "duration without a time unit", _NEWER
        if kind == "str" and braces and prev in ("punct:{", "punct:,"):
            return "quoted label name", _NEWER
        if kind == "punct":
            if tok == "-" and prev == "punct:@":
                return "@ modifier with a negative timestamp", "the parser cannot represent it"
            brackets += (tok == "[") - (tok == "]")
            braces += (tok == "{") - (tok == "}")
        prev2, prev = prev, f"{kind}:{tok.lower() if kind == 'ident' else tok}"
    return None
