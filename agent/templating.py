"""The Go text/template subset that Prometheus alerting-rule annotations and labels use.

Why: decision 1 keeps our rules plain Prometheus rule files, so ``{{ $value | humanize }}`` must
render here byte for byte as Prometheus 2.42 renders it: Go's text/template with
``missingkey=zero``, Prometheus' ``$labels``/``$externalLabels``/``$externalURL``/``$value``
variables and its function map. A template is parsed once, when its rule file loads; anything
outside the subset (``range``, ``query``, ``template``, unknown functions or fields, statically
wrong types such as ``gt $value 1``, an int that Go refuses to compare with a float64) is a
load-time :class:`TemplateError` naming ``where``, the construct and its line and column.
Failures only the data can cause (``humanize`` of a non-numeric label) raise TemplateError from
``render``; Prometheus shows those as ``<error expanding template: ...>``.

Regexps (``match``, ``reReplaceAll``) run on Python's ``re`` in ASCII mode after refusing the
syntax RE2 lacks or reads differently (look-around, back-references, POSIX classes, possessive
repeats); ``$`` also matches before a final newline there, which label values do not have.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TypeAlias

from agent.errors import TemplateError

__all__ = ["Template", "compile_template"]

MAP = "map[string]string"
ROOT = "struct { Labels map[string]string; ExternalLabels map[string]string; ExternalURL string; Value float64 }"
_ROOT_FIELDS = {"Labels": MAP, "ExternalLabels": MAP, "ExternalURL": "string", "Value": "float64"}
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
_QUOTE_ESCAPES = {v: "\\" + k for k, v in _SIMPLE_ESCAPES.items() if k in "abfnrtv"}
_SPEC = re.compile(r"%([-+# 0]*)(\d*)(?:\.(\d*))?(.?)", re.S)
_FLOAT_SYNTAX = re.compile(r"[+-]?(?:inf(?:inity)?|(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)|nan", re.I)
_NOT_RE2 = re.compile(r"\(\?(?:[=!#>(<]|P=)|\[\[:|[*+?}]\+")
_GROUP_REF = re.compile(r"\$(?:(\$)|\{(\w+)\}|(\w+))")


@dataclass(frozen=True)
class _Root:
    """The data Prometheus hands a rule template (``.Labels``, ``.ExternalLabels``, ...)."""

    Labels: Mapping[str, str]
    ExternalLabels: Mapping[str, str]
    ExternalURL: str
    Value: float


Value: TypeAlias = str | float | int | bool | Mapping[str, str] | _Root


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    pos: int
    spaced: bool


@dataclass(frozen=True)
class _Term:
    kind: str  # "lit" | "var" | "dot" | "func" | "pipe"
    pos: int
    name: str = ""
    lit: Value = ""
    pipe: _Pipe | None = None
    fields: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Pipe:
    cmds: tuple[tuple[_Term, ...], ...]
    decl: str = ""
    assign: bool = False


@dataclass(frozen=True)
class _Block:
    kind: str  # "if" | "with"
    pipe: _Pipe
    body: tuple[_Node, ...]
    orelse: tuple[_Node, ...]


_Node: TypeAlias = str | _Pipe | _Block


def _locate(text: str, pos: int) -> str:
    return f"line {text.count(chr(10), 0, pos) + 1} column {pos - text.rfind(chr(10), 0, pos)}"


class _Parser:
    """Recursive descent over Go's template grammar, typing what it can so mistakes fail at load."""

    def __init__(self, text: str, where: str) -> None:
        self.text, self.where, self.i = text, where, 0
        self.vars: list[tuple[str, str]] = list(_PREDECLARED)
        self.items = self._lex()

    def fail(self, msg: str, pos: int) -> TemplateError:
        return TemplateError(f"{self.where + ': ' if self.where else ''}template {_locate(self.text, pos)}: {msg}")

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

    def parse(self) -> tuple[_Node, ...]:
        nodes, end, pos = self._list(ROOT)
        if end:
            raise self.fail(f"unexpected {{{{{end[0].text}}}}}", pos)
        return nodes

    def _list(self, dot: str) -> tuple[tuple[_Node, ...], list[_Tok], int]:
        """Nodes up to an ``{{end}}``/``{{else}}`` (returned with its tokens) or the end of the text."""
        nodes: list[_Node] = []
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

    def _block(self, kind: str, toks: list[_Tok], pos: int, dot: str) -> _Block:
        mark = len(self.vars)
        pipe, typ, _ = self._pipeline(toks, 0, pos, dot, top=True)
        body, end, epos = self._list(typ if kind == "with" else dot)
        orelse: tuple[_Node, ...] = ()
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
        return _Block(kind, pipe, body, orelse)

    def _pipeline(self, toks: list[_Tok], j: int, pos: int, dot: str, *, top: bool) -> tuple[_Pipe, str, int]:
        decl, assign = "", False
        if top and len(toks) > 1 and toks[0].kind == "var" and toks[1].kind in ("decl", "assign"):
            decl, assign, j = toks[0].text, toks[1].kind == "assign", 2
            if assign:
                self._var(toks[0])
        cmds: list[tuple[_Term, ...]] = []
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
        return _Pipe(tuple(cmds), decl, assign), typ, j

    def _command(self, toks: list[_Tok], j: int, pos: int, dot: str, *, piped: str | None,
                 stage: int) -> tuple[tuple[_Term, ...], int, str]:
        typed: list[tuple[_Term, str]] = []
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

    def _term(self, toks: list[_Tok], j: int, pos: int, dot: str) -> tuple[_Term, str, int]:
        tok = toks[j]
        j += 1
        fields: list[str] = []
        if tok.kind in ("str", "raw", "char", "num"):
            try:
                value = _literal(tok)
            except ValueError as exc:
                raise self.fail(f"bad literal {tok.text}: {exc}", tok.pos) from exc
            return _Term("lit", tok.pos, lit=value), _go_type(value), j
        if tok.kind == "ident":
            if tok.text in ("true", "false"):
                return _Term("lit", tok.pos, lit=tok.text == "true"), "bool", j
            if tok.text in _SIGS:
                return _Term("func", tok.pos, name=tok.text), "", j
            what = "keyword" if tok.text in _UNSUPPORTED else "function"
            extra = "is outside the supported template subset" if tok.text in _PROMETHEUS_ONLY else "not defined"
            raise self.fail(f'{what} "{tok.text}" {extra if what == "function" else "is not allowed here"}', tok.pos)
        if tok.kind == "var":
            term, typ = _Term("var", tok.pos, name=tok.text), self._var(tok)
        elif tok.kind == "field":
            term, typ, fields = _Term("dot", tok.pos), dot, tok.text.split(".")[1:] if tok.text != "." else []
        elif tok.kind == "lp":
            pipe, typ, j = self._pipeline(toks, j, pos, dot, top=False)
            if j >= len(toks):
                raise self.fail("unclosed left paren", tok.pos)
            term, j = _Term("pipe", tok.pos, pipe=pipe), j + 1
        else:
            raise self.fail(f"unexpected {tok.text!r} in command", tok.pos)
        while j < len(toks) and toks[j].kind == "field" and not toks[j].spaced and toks[j].text != ".":
            fields += toks[j].text.split(".")[1:]
            j += 1
        for name in fields:
            if typ == ROOT and name not in _ROOT_FIELDS:
                raise self.fail(f"unknown field .{name} (the data has .Labels .ExternalLabels .ExternalURL .Value)",
                                tok.pos)
            if typ not in ("", ROOT, MAP):
                raise self.fail(f"can't evaluate field {name} in type {typ}", tok.pos)
            typ = _ROOT_FIELDS[name] if typ == ROOT else "string" if typ == MAP else ""
        return replace(term, fields=tuple(fields)), typ, j

    def _var(self, tok: _Tok) -> str:
        for name, typ in reversed(self.vars):
            if name == tok.text:
                return typ
        raise self.fail(f'undefined variable "{tok.text}"', tok.pos)

    def _check_call(self, head: _Term, args: list[str], terms: list[_Term]) -> str:
        name = head.name
        low, high, kind, result = _SIGS[name]
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
                _regexp(first)
            elif first is not None and name == "printf":
                _sprintf(first, ())
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


def _go_type(v: Value) -> str:
    if isinstance(v, _Root):
        return ROOT
    if isinstance(v, Mapping):
        return MAP
    return {bool: "bool", int: "int", float: "float64"}.get(type(v), "string")


def _truth(v: Value) -> bool:
    if isinstance(v, str | Mapping):
        return len(v) > 0
    return isinstance(v, _Root) or bool(v)


class _Exec:
    """One render: a variable stack over the parsed nodes."""

    def __init__(self, root: _Root, text: str) -> None:
        self.text = text
        self.vars: list[tuple[str, Value]] = [
            ("$", root), ("$labels", root.Labels), ("$externalLabels", root.ExternalLabels),
            ("$externalURL", root.ExternalURL), ("$value", root.Value)]

    def walk(self, nodes: Sequence[_Node], dot: Value, out: list[str]) -> None:
        for node in nodes:
            if isinstance(node, str):
                out.append(node)
            elif isinstance(node, _Pipe):
                value = self.pipe(node, dot)
                if not node.decl:
                    out.append(_fmt(value, "", None, None, "v"))
            else:
                mark = len(self.vars)
                value = self.pipe(node.pipe, dot)
                if _truth(value):
                    self.walk(node.body, value if node.kind == "with" else dot, out)
                else:
                    self.walk(node.orelse, dot, out)
                del self.vars[mark:]

    def pipe(self, pipe: _Pipe, dot: Value) -> Value:
        value = self.command(pipe.cmds[0], dot, None)
        for cmd in pipe.cmds[1:]:
            value = self.command(cmd, dot, value)
        if pipe.assign:
            self.vars[self.slot(pipe.decl, 0)] = (pipe.decl, value)
        elif pipe.decl:
            self.vars.append((pipe.decl, value))
        return value

    def slot(self, name: str, pos: int) -> int:
        for k in range(len(self.vars) - 1, -1, -1):
            if self.vars[k][0] == name:
                return k
        raise TemplateError(f"template {_locate(self.text, pos)}: variable {name} is out of scope here")

    def command(self, cmd: tuple[_Term, ...], dot: Value, piped: Value | None) -> Value:
        head = cmd[0]
        if head.kind != "func":
            return self.term(head, dot)
        if head.name in ("and", "or"):
            value: Value = False
            for term in cmd[1:]:
                value = self.term(term, dot)
                if _truth(value) == (head.name == "or"):
                    return value
            return value if piped is None else piped
        args = [self.term(term, dot) for term in cmd[1:]] + ([] if piped is None else [piped])
        try:
            return _FUNCS[head.name](args)
        except TemplateError as exc:
            raise TemplateError(f"template {_locate(self.text, head.pos)}: error calling {head.name}: {exc}") from exc

    def term(self, term: _Term, dot: Value) -> Value:
        if term.kind == "lit":
            value = term.lit
        elif term.kind == "var":
            value = self.vars[self.slot(term.name, term.pos)][1]
        elif term.kind == "pipe" and term.pipe is not None:
            value = self.pipe(term.pipe, dot)
        else:  # "dot"; a bare function name as an operand never gets here (every function needs an argument)
            value = dot
        for name in term.fields:
            if isinstance(value, _Root) and name in _ROOT_FIELDS:
                value = getattr(value, name)
            elif isinstance(value, Mapping):
                value = value.get(name, "")
            else:
                where = _locate(self.text, term.pos)
                raise TemplateError(f"template {where}: can't evaluate field {name} in type {_go_type(value)}")
        return value


# --- fmt: Go's Sprintf for the verbs and flags rule templates use ---------------------------------------------


def _sprintf(fmt: str, args: Sequence[Value]) -> str:
    out, n, last = [], 0, 0
    for m in _SPEC.finditer(fmt):
        out.append(fmt[last:m.start()])
        last = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%" or not verb:
            out.append("%" if verb else "%!(NOVERB)")
        elif verb not in "vsdfFeEgGqxXt" or "#" in flags:
            raise TemplateError(f"printf verb %{flags}{width}{verb} is outside the supported subset "
                                "(%s %d %f %e %g %v %q %x %t with flags -+0 and space, width, precision)")
        elif n >= len(args):
            out.append(f"%!{verb}(MISSING)")
        else:
            out.append(_fmt(args[n], flags, int(width) if width else None, None if prec is None else int(prec or 0),
                            verb))
            n += 1
    out.append(fmt[last:])
    if n < len(args):
        extra = ", ".join(_go_type(a) + "=" + _fmt(a, "", None, None, "v") for a in args[n:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _fmt(v: Value, flags: str, width: int | None, prec: int | None, verb: str) -> str:
    """One operand as Go's fmt prints it; a verb that does not fit the type gives Go's ``%!verb(type=value)``."""
    if isinstance(v, Mapping):
        spec = (flags, width, prec, verb)
        pairs = (_fmt(k, *spec) + ":" + _fmt(x, *spec) for k, x in sorted(v.items()))
        return f"map[{' '.join(pairs)}]"
    if isinstance(v, _Root):
        fields = (v.Labels, v.ExternalLabels, v.ExternalURL, v.Value)
        return "{" + " ".join(_fmt(x, flags, width, prec, verb) for x in fields) + "}"
    text = None
    if isinstance(v, bool):
        text = _pad("true" if v else "false", flags, width) if verb in "tv" else None
    elif isinstance(v, int):
        text = _fmt_int(v, flags, width, prec, verb) if verb in "dvxXq" else None
    elif isinstance(v, float):
        text = _fmt_float(v, flags, width, prec, verb) if verb in "vgGeEfFxX" else None
    elif verb in "xX":
        data = v.encode()[:prec] if prec is not None else v.encode()
        text = _pad((" " if " " in flags else "").join(format(b, "02" + verb) for b in data), flags, width)
    elif verb in "svq":
        s = v if prec is None else v[:prec]
        text = _pad(_quote(s, '"') if verb == "q" else s, flags, width)
    return text if text is not None else f"%!{verb}({_go_type(v)}={_fmt(v, flags, width, prec, 'v')})"


def _pad(body: str, flags: str, width: int | None, *, zero: bool = True) -> str:
    if width is None or len(body) >= width:
        return body
    if "-" in flags:
        return body + " " * (width - len(body))
    return ("0" if zero and "0" in flags else " ") * (width - len(body)) + body


def _sign_pad(num: str, flags: str, width: int | None) -> str:
    if not num.startswith("-"):
        num = ("+" if "+" in flags else " " if " " in flags else "") + num
    if "0" in flags and "-" not in flags and width and len(num) < width:
        sign = num[:1] if num[:1] in ("+", "-", " ") else ""
        return sign + num[len(sign):].rjust(width - len(sign), "0")
    return _pad(num, flags, width, zero=False)


def _fmt_int(n: int, flags: str, width: int | None, prec: int | None, verb: str) -> str:
    if verb == "q":
        char = chr(n) if 0 <= n <= 0x10FFFF and not 0xD800 <= n <= 0xDFFF else "\ufffd"
        return _pad(_quote(char, "'"), flags, width)
    digits = format(abs(n), verb if verb in "xX" else "d")
    if prec is not None:
        digits = "" if prec == 0 and n == 0 else digits.rjust(prec, "0")
        flags = flags.replace("0", "")
    return _sign_pad(("-" if n < 0 else "") + digits, flags, width)


def _fmt_float(x: float, flags: str, width: int | None, prec: int | None, verb: str) -> str:
    if not math.isfinite(x):
        num = "NaN" if math.isnan(x) else "Inf"
        sign = "-" if x < 0 else "+" if "+" in flags else " " if " " in flags else "+" if num == "Inf" else ""
        return _pad(sign + num, flags, width, zero=False)
    if verb in "xX":
        if prec is not None:
            raise TemplateError("printf %.Nx of a float is outside the supported subset")
        sign = "-" if math.copysign(1.0, x) < 0 else ""
        mant, exp = math.frexp(abs(x))
        digits = f"{int((mant * 2 - 1) * (1 << 52)):013x}".rstrip("0")
        body = f"0x1{'.' if digits else ''}{digits}p{'-' if exp < 1 else '+'}{abs(exp - 1):02d}" if x else "0x0p+00"
        num = sign + (body.upper() if verb == "X" else body)
    elif prec is None and verb in "vgG":
        num = _shortest(x, "E" if verb == "G" else "e")
    else:
        num = format(x, f".{6 if prec is None else prec}{'g' if verb == 'v' else verb}")
    return _sign_pad(num, flags, width)


def _shortest(x: float, e: str = "e") -> str:
    """Go's ``strconv.FormatFloat(x, 'g', -1, 64)``: shortest digits, exponent form from 1e+06 and below 1e-04."""
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return sign + "0"
    mant, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mant.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + int(exp or 0) - (len(whole + frac) - len(digits))
    digits = digits.rstrip("0")
    if not -4 <= point - 1 < 6:
        rest = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{rest}{e}{'-' if point < 1 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _quote(s: str, q: str) -> str:
    """Go's strconv.Quote (q='"') or QuoteRune (q="'")."""
    out = [q]
    for c in s:
        if c in (q, "\\"):
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif c in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[c])
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x20 or o == 0x7F else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out) + q


# --- Prometheus' template functions -------------------------------------------------------------------------------


def _to_float(v: Value) -> float:
    if isinstance(v, str):
        if not _FLOAT_SYNTAX.fullmatch(v):
            raise TemplateError(f"strconv.ParseFloat: parsing {_quote(v, chr(34))}: invalid syntax")
        if math.isinf(float(v)) and "inf" not in v.lower():
            raise TemplateError(f"strconv.ParseFloat: parsing {_quote(v, chr(34))}: value out of range")
        return float(v)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise TemplateError(f"can't convert {_go_type(v)} to float")
    return float(v)


def _g4(x: float) -> str:
    return _fmt_float(x, "", None, 4, "g")


def _shrink(x: float) -> tuple[float, str]:
    prefix = ""
    for p in "munpfazy":
        if abs(x) >= 1:
            break
        prefix, x = p, x * 1000
    return x, prefix


def _humanize(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return _g4(x)
    if abs(x) < 1:
        x, prefix = _shrink(x)
        return _g4(x) + prefix
    prefix = ""
    for p in "kMGTPEZY":
        if abs(x) < 1000:
            break
        prefix, x = p, x / 1000
    return _g4(x) + prefix


def _humanize1024(x: float) -> str:
    if abs(x) <= 1 or not math.isfinite(x):
        return _g4(x)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(x) < 1024:
            break
        prefix, x = p, x / 1024
    return _g4(x) + prefix


def _humanize_duration(x: float) -> str:
    if not math.isfinite(x) or x == 0:
        return _g4(x) + ("s" if x == 0 else "")
    if abs(x) < 1:
        x, prefix = _shrink(x)
        return f"{_g4(x)}{prefix}s"
    sign, x = ("-", -x) if x < 0 else ("", x)
    total = int(x) if x < 2.0**63 else 2**63  # Go's int64(x) on amd64 overflows to MinInt64 = -(2**63)
    days, hours, minutes, seconds = (t if x < 2.0**63 else -t for t in (total // 86400, total // 3600 % 24,
                                                                         total // 60 % 60, total % 60))
    if days:
        return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
    if hours:
        return f"{sign}{hours}h {minutes}m {seconds}s"
    return f"{sign}{minutes}m {seconds}s" if minutes else f"{sign}{_g4(x)}s"


def _humanize_timestamp(x: float) -> str:
    if not math.isfinite(x):
        return _g4(x)
    if not -(2.0**63) <= x * 1e9 <= 2.0**63:
        raise TemplateError(f"{_shortest(x)} cannot be represented as a nanoseconds timestamp since it overflows int64")
    nanos = int(x * 1e9)
    millis = abs(nanos) // 1_000_000 * (-1 if nanos < 0 else 1)  # Go truncates toward zero
    t = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=millis)
    frac = f".{t.microsecond // 1000:03d}".rstrip("0").rstrip(".")
    return f"{t.year:04d}-{t.month:02d}-{t.day:02d} {t.hour:02d}:{t.minute:02d}:{t.second:02d}{frac} +0000 UTC"


def _str(v: Value) -> str:
    if not isinstance(v, str):
        raise TemplateError(f"wrong type for value; expected string; got {_go_type(v)}")
    return v


def _rune_case(c: str, how: Callable[[str], str]) -> str:
    """Go's simple (one-rune) case mapping; Python's full mapping can be longer (ß -> SS), then Go keeps the rune."""
    m = how(c)
    if len(m) > 1 and how is str.upper:
        m = c.title()  # letters with iota subscript: the one-rune title case is the simple upper case
    return m if len(m) == 1 else {"İ": "i"}.get(c, c)


def _case(s: str, how: Callable[[str], str]) -> str:
    return "".join(_rune_case(c, how) for c in s)


def _is_separator(c: str) -> bool:
    """Go's strings.Title word boundary: ASCII other than [0-9A-Za-z_], or a non-ASCII space."""
    if c.isascii():
        return not (c.isalnum() or c == "_")
    return not (c.isalpha() or c.isdecimal()) and c.isspace()


def _title(s: str) -> str:
    return "".join(_rune_case(c, str.title) if _is_separator(prev) else c for prev, c in zip(" " + s, s, strict=False))


def _strip_port(s: str) -> str:
    """Go's net.SplitHostPort host part; the input unchanged where Go reports an error."""
    colon = s.rfind(":")
    if colon < 0:
        return s
    if s.startswith("["):
        end = s.find("]")
        if end < 0 or end + 1 != colon or "[" in s[1:] or "]" in s[end + 1:]:
            return s
        return s[1:end]
    host = s[:colon]
    return s if ":" in host or "[" in s or "]" in s else host


@functools.lru_cache(maxsize=256)
def _regexp(pattern: str) -> re.Pattern[str]:
    """A Go (RE2) regexp on Python's re, refusing syntax the two read differently."""

    def escape(m: re.Match[str]) -> str:
        if m.group(1) in "123456789Z":
            raise TemplateError(f"regexp {pattern!r}: \\{m.group(1)} is not RE2 syntax")
        return r"\Z" if m.group(1) == "z" else m.group(0)

    translated = re.sub(r"\\(.)", escape, pattern, flags=re.S)
    if _NOT_RE2.search(re.sub(r"\\.", "_", pattern, flags=re.S)):
        raise TemplateError(f"regexp {pattern!r}: look-around, back-references, POSIX classes and possessive "
                            "repeats are outside RE2 or read differently by Python")
    try:
        return re.compile(translated, re.ASCII)
    except re.error as exc:
        raise TemplateError(f"regexp {pattern!r}: {exc}") from exc


def _expand(template: str, m: re.Match[str]) -> str:
    """Go's Regexp.Expand: ``$1``, ``${1}``, ``$name``, ``$$``; an unknown group is empty (so ``$1x`` is too)."""

    def one(ref: re.Match[str]) -> str:
        if ref.group(1):
            return "$"
        name = ref.group(2) or ref.group(3)
        if re.fullmatch(r"0|[1-9][0-9]{0,8}", name):
            return (m.group(int(name)) or "") if int(name) <= m.re.groups else ""
        return (m.group(name) or "") if name in m.re.groupindex else ""

    return _GROUP_REF.sub(one, template)


def _re_replace_all(pattern: str, repl: str, text: str) -> str:
    """Go's ReplaceAllString: an empty match right after a previous match is not replaced."""
    rx, out, last, pos = _regexp(pattern), list[str](), 0, 0
    while pos <= len(text) and (m := rx.search(text, pos)) is not None:
        out.append(text[last:m.start()])
        if m.end() > last or m.start() == 0:
            out.append(_expand(repl, m))
        last, pos = m.end(), max(m.end(), pos + 1)
    return "".join(out) + text[last:]


def _kind(v: Value) -> str:
    kind = _go_type(v)
    if kind in (MAP, ROOT):
        raise TemplateError("invalid type for comparison")
    return kind


def _eq(args: Sequence[Value]) -> bool:
    for other in args[1:]:
        if _kind(args[0]) != _kind(other):
            raise TemplateError("incompatible types for comparison")
        if args[0] == other:
            return True
    return False


def _lt(a: Value, b: Value) -> bool:
    if _kind(a) != _kind(b):
        raise TemplateError("incompatible types for comparison")
    if _kind(a) == "bool":
        raise TemplateError("invalid type for comparison")
    return a < b  # type: ignore[operator]  # same basic kind, checked above


# name: (min args, max args or -1, static parameter check, static result type; "*" = the arguments' type)
_SIGS: dict[str, tuple[int, int, str, str]] = {
    **dict.fromkeys(["humanize", "humanize1024", "humanizeDuration", "humanizePercentage", "humanizeTimestamp"],
                    (1, 1, "num", "string")),
    **dict.fromkeys(["toUpper", "toLower", "title", "stripPort"], (1, 1, "str", "string")),
    **dict.fromkeys(["ne", "lt", "le", "gt", "ge"], (2, 2, "cmp", "bool")),
    "printf": (1, -1, "fmt", "string"), "reReplaceAll": (3, 3, "str", "string"), "match": (2, 2, "str", "bool"),
    "eq": (2, -1, "cmp", "bool"), "and": (1, -1, "", "*"), "or": (1, -1, "", "*"), "not": (1, 1, "", "bool"),
    "index": (2, 2, "index", "string"),
}
_FUNCS: dict[str, Callable[[list[Value]], Value]] = {
    "humanize": lambda a: _humanize(_to_float(a[0])),
    "humanize1024": lambda a: _humanize1024(_to_float(a[0])),
    "humanizeDuration": lambda a: _humanize_duration(_to_float(a[0])),
    "humanizePercentage": lambda a: _g4(_to_float(a[0]) * 100) + "%",
    "humanizeTimestamp": lambda a: _humanize_timestamp(_to_float(a[0])),
    "printf": lambda a: _sprintf(_str(a[0]), a[1:]),
    "toUpper": lambda a: _case(_str(a[0]), str.upper),
    "toLower": lambda a: _case(_str(a[0]), str.lower),
    "title": lambda a: _title(_str(a[0])),
    "stripPort": lambda a: _strip_port(_str(a[0])),
    "reReplaceAll": lambda a: _re_replace_all(_str(a[0]), _str(a[1]), _str(a[2])),
    "match": lambda a: _regexp(_str(a[0])).search(_str(a[1])) is not None,
    "eq": _eq,
    "ne": lambda a: not _eq(a),
    "lt": lambda a: _lt(a[0], a[1]),
    "le": lambda a: _lt(a[0], a[1]) or _eq(a),
    "gt": lambda a: not (_lt(a[0], a[1]) or _eq(a)),
    "ge": lambda a: not _lt(a[0], a[1]),
    "not": lambda a: not _truth(a[0]),
    "index": lambda a: _field_of(a[0], a[1]),
}


def _field_of(m: Value, key: Value) -> str:
    if not isinstance(m, Mapping) or not isinstance(key, str):
        raise TemplateError(f"can't index item of type {_go_type(m)} with {_go_type(key)}")
    return m.get(key, "")


class Template:
    """A template parsed once at rule-load time; :meth:`render` expands it for one alert."""

    __slots__ = ("_nodes", "_where", "text")

    def __init__(self, text: str, nodes: tuple[_Node, ...], where: str) -> None:
        self.text, self._nodes, self._where = text, nodes, where

    def render(self, *, labels: Mapping[str, str], value: float, external_labels: Mapping[str, str] | None = None,
               external_url: str = "") -> str:
        """Expand as Prometheus does for one alert; TemplateError if the data fails it (a non-numeric humanize).

        ``labels`` are the sample's labels as the expression returned them: Prometheus includes ``__name__``
        when the expression keeps it, and not the rule's own ``labels:``.
        """
        root = _Root(labels, external_labels or {}, external_url, float(value))
        out: list[str] = []
        try:
            _Exec(root, self.text).walk(self._nodes, root, out)
        except TemplateError as exc:
            raise TemplateError(f"{self._where}: {exc}" if self._where else str(exc)) from exc
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.text!r})"


def compile_template(text: str, *, where: str = "") -> Template:
    """Parse ``text`` once; a TemplateError names ``where``, the offending construct and its line and column."""
    return Template(text, _Parser(text, where).parse(), where)
