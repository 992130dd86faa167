"""Go text/template's lexer and parser, for the subset Prometheus rule templates use.

Why: a template is parsed once, when its rule file loads, into the small tree below (text,
pipelines, ``if``/``with`` blocks), and everything that can be wrong without data fails
there: syntax, constructs outside the subset (``range``, ``template``, ``define``...),
Prometheus functions the agent does not offer (``query``, ``first``...), unknown functions,
variables or fields, and wrong static types (``humanize $labels``, ``gt $value 1``). The
grammar, the delimiters' trim markers (``{{-``/``-}}``), comments and literal syntax (Go
strings, raw strings, runes, ints in any base, floats) follow Go's ``text/template/parse``;
types use the names of :mod:`agent.rules.template.values`, and function signatures come from
:mod:`agent.rules.template.funcs`. Errors are :class:`TemplateError` naming ``where``, the
construct and its line and column, as Prometheus reports them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TypeAlias

from agent.errors import TemplateError
from agent.gocompat.fmt import sprintf
from agent.rules.template.funcs import SIGNATURES, go_regexp
from agent.rules.template.values import MAP, ROOT, ROOT_FIELDS, Value, go_type

__all__ = ["Block", "Node", "Pipe", "Term", "locate", "parse"]

_PREDECLARED = [("$", ROOT), ("$labels", MAP), ("$externalLabels", MAP), ("$externalURL", "string"),
                ("$value", "float64")]
_UNSUPPORTED = {"range", "template", "define", "block", "break", "continue", "nil", "else", "end", "if", "with"}
_PROMETHEUS_ONLY = {"query", "first", "label", "value", "strvalue", "sortByLabel", "args", "tmpl", "safeHtml",
                    "graphLink", "tableLink", "pathPrefix", "externalURL", "parseDuration", "toTime", "html", "js",
                    "urlquery", "len", "slice", "call", "print", "println"}
_SPACE = " \t\r\n"
_LEFT_TRIM = re.compile(r"-[ \t\r\n]")
_CLOSE = re.compile(r"[ \t\r\n]-}}|}}")
_TOKEN = re.compile(
    r"""(?P<space>[ \t\r\n]+)|(?P<str>"(?:[^"\\\n]|\\.)*")|(?P<raw>`[^`]*`)|(?P<char>'(?:[^'\\\n]|\\[^\n]+?)')"""
    r"""|(?P<decl>:=)|(?P<assign>=)|(?P<pipe>\|)|(?P<lp>\()|(?P<rp>\))|(?P<var>\$\w*)"""
    r"""|(?P<num>[+-]?(?:0[xXoObB]\w+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?)(?![\w.]))"""
    r"""|(?P<field>(?:\.\w+)+|\.)|(?P<ident>\w+)"""
)
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)", re.S)
_SIMPLE_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
                   "\\": "\\", "'": "'", '"': '"'}


@dataclass(frozen=True)
class _Tok:
    """One token inside an action: its kind (a group name of ``_TOKEN``), text, offset, and
    whether blanks precede it (``.a .b`` is two operands, ``.a.b`` one field chain)."""

    kind: str
    text: str
    pos: int
    spaced: bool


@dataclass(frozen=True)
class Term:
    """One operand: a literal, a variable, dot, a function name or a parenthesised pipeline,
    with the field chain that follows it (``$labels.job``)."""

    kind: str  # "lit" | "var" | "dot" | "func" | "pipe"
    pos: int
    name: str = ""
    lit: Value = ""
    pipe: Pipe | None = None
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pipe:
    """A pipeline: its commands (each a tuple of terms, the first a function or an operand),
    and the variable it declares (``$x :=``) or assigns (``$x =``), if any."""

    cmds: tuple[tuple[Term, ...], ...]
    decl: str = ""
    assign: bool = False


@dataclass(frozen=True)
class Block:
    """``{{if}}``/``{{with}}`` with its body and its ``{{else}}`` (an ``else if`` is a nested block)."""

    kind: str  # "if" | "with"
    pipe: Pipe
    body: tuple[Node, ...]
    orelse: tuple[Node, ...]


Node: TypeAlias = str | Pipe | Block


def locate(text: str, pos: int) -> str:
    """``line L column C`` of an offset, as Go's template errors name a place."""
    return f"line {text.count(chr(10), 0, pos) + 1} column {pos - text.rfind(chr(10), 0, pos)}"


def parse(text: str, where: str) -> tuple[Node, ...]:
    """The parsed, statically checked tree of one template."""
    return _Parser(text, where).parse()


class _Parser:
    """Recursive descent over Go's template grammar, typing what it can so mistakes fail at load."""

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.i = text, where, 0
        self.vars: list[tuple[str, str]] = list(_PREDECLARED)
        self.items = self._lex()

    def fail(self, msg: str, pos: int) -> TemplateError:
        return TemplateError(f"{self.where + ': ' if self.where else ''}template {locate(self.text, pos)}: {msg}")

    def _lex(self) -> list[str | tuple[int, list[_Tok]]]:
        text, items, pos, trim = self.text, list[str | tuple[int, list[_Tok]]](), 0, False
        while True:
            start = text.find("{{", pos)
            chunk = text[pos:] if start < 0 else text[pos:start]
            chunk = chunk.lstrip(_SPACE) if trim else chunk
            if start < 0:
                return [*items, chunk] if chunk else items
            p = start + 2
            if _LEFT_TRIM.match(text, p):
                chunk, p = chunk.rstrip(_SPACE), p + 2
            if chunk:
                items.append(chunk)
            if text.startswith("/*", p):
                end = text.find("*/", p + 2)
                close = _CLOSE.match(text, end + 2) if end >= 0 else None
                if close is None:
                    raise self.fail("unclosed comment" if end < 0 else "comment ends before closing delimiter", start)
                pos, trim = close.end(), len(close.group()) > 2
                continue
            toks, spaced, trim = list[_Tok](), False, False
            while not text.startswith("}}", p):
                m = _TOKEN.match(text, p)
                if m is None or m.lastgroup is None:
                    if p >= len(text):
                        raise self.fail("unclosed action", start)
                    quote = text[p] in "\"'`"
                    raise self.fail("unterminated quoted string" if quote else f"unexpected {text[p]!r} in action", p)
                if m.lastgroup == "space" and text.startswith("-}}", m.end()):
                    p, trim = m.end() + 1, True
                    break
                if m.lastgroup != "space":
                    toks.append(_Tok(m.lastgroup, m.group(), p, spaced))
                spaced, p = m.lastgroup == "space", m.end()
            pos = p + 2
            items.append((start, toks))

    def parse(self) -> tuple[Node, ...]:
        nodes, end, pos = self._list(ROOT)
        if end:
            raise self.fail(f"unexpected {{{{{end[0].text}}}}}", pos)
        return nodes

    def _list(self, dot: str) -> tuple[tuple[Node, ...], list[_Tok], int]:
        """Nodes up to an ``{{end}}``/``{{else}}`` (returned with its tokens) or the end of the text."""
        nodes: list[Node] = []
        while self.i < len(self.items):
            item = self.items[self.i]
            self.i += 1
            if isinstance(item, str):
                nodes.append(item)
                continue
            pos, toks = item
            head = toks[0].text if toks and toks[0].kind == "ident" else ""
            if head in ("end", "else"):
                return tuple(nodes), toks, pos
            if head in ("if", "with"):
                nodes.append(self._block(head, toks[1:], pos, dot))
            elif head in _UNSUPPORTED:
                raise self.fail(f"{{{{{head}}}}} is outside the supported template subset", pos)
            else:
                nodes.append(self._pipeline(toks, 0, pos, dot, top=True)[0])
        return tuple(nodes), [], len(self.text)

    def _block(self, kind: str, toks: list[_Tok], pos: int, dot: str) -> Block:
        mark = len(self.vars)
        pipe, typ, _ = self._pipeline(toks, 0, pos, dot, top=True)
        body, end, epos = self._list(typ if kind == "with" else dot)
        orelse: tuple[Node, ...] = ()
        if end and end[0].text == "else":
            if len(end) > 1 and end[1].text == "if" and kind == "if":
                orelse = (self._block("if", end[2:], epos, dot),)
                end = [_Tok("ident", "end", epos, False)]
            elif len(end) > 1:
                raise self.fail(f"{{{{else {end[1].text}}}}} is outside the supported template subset", epos)
            else:
                orelse, end, epos = self._list(dot)
        if not end:
            raise self.fail(f"{{{{{kind}}}}} has no matching {{{{end}}}}", pos)
        if end[0].text != "end" or len(end) > 1:
            raise self.fail(f"expected {{{{end}}}} for {{{{{kind}}}}}", epos)
        del self.vars[mark:]
        return Block(kind, pipe, body, orelse)

    def _pipeline(self, toks: list[_Tok], j: int, pos: int, dot: str, *, top: bool) -> tuple[Pipe, str, int]:
        decl, assign = "", False
        if top and len(toks) > 1 and toks[0].kind == "var" and toks[1].kind in ("decl", "assign"):
            decl, assign, j = toks[0].text, toks[1].kind == "assign", 2
            if assign:
                self._var(toks[0])
        cmds: list[tuple[Term, ...]] = []
        typ = ""
        while True:
            terms, j, typ = self._command(toks, j, pos, dot, piped=typ if cmds else None, stage=len(cmds) + 1)
            cmds.append(terms)
            if j >= len(toks) or toks[j].kind == "rp":
                break
            j += 1
        if top and j < len(toks):
            raise self.fail("unexpected ')'", toks[j].pos)
        if decl:
            found = [k for k, (name, _) in enumerate(self.vars) if name == decl]
            if assign and self.vars[found[-1]][1] != typ:
                self.vars[found[-1]] = (decl, "")
            elif not assign:
                self.vars.append((decl, typ))
        return Pipe(tuple(cmds), decl, assign), typ, j

    def _command(self, toks: list[_Tok], j: int, pos: int, dot: str, *, piped: str | None,
                 stage: int) -> tuple[tuple[Term, ...], int, str]:
        typed: list[tuple[Term, str]] = []
        while j < len(toks) and toks[j].kind not in ("pipe", "rp"):
            term, typ, j = self._term(toks, j, pos, dot)
            typed.append((term, typ))
        if not typed:
            raise self.fail(f"missing command in pipeline stage {stage}", toks[j].pos if j < len(toks) else pos)
        head, typ = typed[0]
        args = [t for _, t in typed[1:]] + ([] if piped is None else [piped])
        if head.kind == "func":
            return tuple(t for t, _ in typed), j, self._check_call(head, args, [t for t, _ in typed[1:]])
        if args:
            raise self.fail(f"pipeline stage {stage} is not a function call and takes no arguments", head.pos)
        return (head,), j, typ

    def _term(self, toks: list[_Tok], j: int, pos: int, dot: str) -> tuple[Term, str, int]:
        tok = toks[j]
        j += 1
        fields: list[str] = []
        if tok.kind in ("str", "raw", "char", "num"):
            try:
                value = _literal(tok)
            except ValueError as exc:
                raise self.fail(f"bad literal {tok.text}: {exc}", tok.pos) from exc
            return Term("lit", tok.pos, lit=value), go_type(value), j
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return Term("lit", tok.pos, lit=tok.text == "true"), "bool", j
            if tok.text in SIGNATURES:
                return Term("func", tok.pos, name=tok.text), "", j
            what = "keyword" if tok.text in _UNSUPPORTED else "function"
            extra = "is outside the supported template subset" if tok.text in _PROMETHEUS_ONLY else "not defined"
            raise self.fail(f'{what} "{tok.text}" {extra if what == "function" else "is not allowed here"}', tok.pos)
        if tok.kind == "var":
            term, typ = Term("var", tok.pos, name=tok.text), self._var(tok)
        elif tok.kind == "field":
            term, typ, fields = Term("dot", tok.pos), dot, tok.text.split(".")[1:] if tok.text != "." else []
        elif tok.kind == "lp":
            pipe, typ, j = self._pipeline(toks, j, pos, dot, top=False)
            if j >= len(toks):
                raise self.fail("unclosed left paren", tok.pos)
            term, j = Term("pipe", tok.pos, pipe=pipe), j + 1
        else:
            raise self.fail(f"unexpected {tok.text!r} in command", tok.pos)
        while j < len(toks) and toks[j].kind == "field" and not toks[j].spaced and toks[j].text != ".":
            fields += toks[j].text.split(".")[1:]
            j += 1
        for name in fields:
            if typ == ROOT and name not in ROOT_FIELDS:
                raise self.fail(f"unknown field .{name} (the data has .Labels .ExternalLabels .ExternalURL .Value)",
                                tok.pos)
            if typ not in ("", ROOT, MAP):
                raise self.fail(f"can't evaluate field {name} in type {typ}", tok.pos)
            typ = ROOT_FIELDS[name] if typ == ROOT else "string" if typ == MAP else ""
        return replace(term, fields=tuple(fields)), typ, j

    def _var(self, tok: _Tok) -> str:
        for name, typ in reversed(self.vars):
            if name == tok.text:
                return typ
        raise self.fail(f'undefined variable "{tok.text}"', tok.pos)

    def _check_call(self, head: Term, args: list[str], terms: list[Term]) -> str:
        name = head.name
        low, high, kind, result = SIGNATURES[name]
        if not low <= len(args) <= (high if high >= 0 else len(args)):
            raise self.fail(f"wrong number of args for {name}: want {low}{'+' if high < 0 else ''} got {len(args)}",
                            head.pos)
        known = {t for t in args if t}
        bad = ""
        if kind == "num" and known & {"bool", MAP, ROOT}:
            bad = f"can't convert {min(known & {'bool', MAP, ROOT})} to float"
        elif kind == "str" and known - {"string"}:
            bad = f"wrong type for value; expected string; got {min(known - {'string'})}"
        elif kind == "fmt" and args[0] not in ("", "string"):
            bad = f"wrong type for value; expected string; got {args[0]}"
        elif kind == "cmp" and (known & {MAP, ROOT} or (name not in ("eq", "ne") and "bool" in known)):
            bad = "invalid type for comparison"
        elif kind == "cmp" and len(known) > 1:
            hint = " (write 1.0, not 1, to compare with a float64 such as $value)" if "float64" in known else ""
            bad = f"incompatible types for comparison: {' and '.join(sorted(known))}{hint}"
        elif kind == "index" and (args[0] not in ("", MAP) or args[1] not in ("", "string")):
            bad = f"can't index {args[0] or 'value'} with {args[1] or 'value'}"
        if bad:
            raise self.fail(f"{name}: {bad}", head.pos)
        first = terms[0].lit if terms and terms[0].kind == "lit" and isinstance(terms[0].lit, str) else None
        try:
            if first is not None and name in ("reReplaceAll", "match"):
                go_regexp(first)
            elif first is not None and name == "printf":
                sprintf(first, ())
        except TemplateError as exc:
            raise self.fail(f"{name}: {exc}", terms[0].pos) from exc
        return result if result != "*" else (args[0] if len(set(args)) == 1 else "")


def _literal(tok: _Tok) -> Value:
    body = tok.text[1:-1]
    if tok.kind == "raw":
        return body.replace("\r", "")
    if tok.kind in ("str", "char"):
        text = _ESCAPE.sub(_unescape, body)
        if tok.kind == "str":
            return text
        if len(text) != 1:
            raise ValueError("a character literal holds one character")
        return ord(text)
    digits = tok.text.lstrip("+-")
    if not re.search(r"[.eE]", digits) or digits[:2].lower() == "0x":
        sign = -1 if tok.text.startswith("-") else 1
        octal = re.fullmatch(r"0[0-7_]+", digits)
        return sign * int(digits.replace("_", ""), 8) if octal else sign * int(digits, 0)
    return float(tok.text)


def _unescape(m: re.Match[str]) -> str:
    esc = m.group(1)
    if esc in _SIMPLE_ESCAPES:
        return _SIMPLE_ESCAPES[esc]
    if len(esc) == 1:
        raise ValueError(f"unknown escape sequence \\{esc}")
    return chr(int(esc[1:], 16) if esc[0] in "xuU" else int(esc, 8))
