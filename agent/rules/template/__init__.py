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

This module is the API and the renderer; the pieces beside it are :mod:`agent.rules.template.parse`
(lexer, parser, the tree and its static checks), :mod:`agent.rules.template.funcs` (Prometheus'
function map), :mod:`agent.gocompat.fmt` (Go's ``fmt`` for ``%v`` and ``printf``) and
:mod:`agent.rules.template.values` (the Go types a template handles).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from agent.errors import TemplateError
from agent.gocompat.fmt import format_value
from agent.rules.template.funcs import FUNCS
from agent.rules.template.parse import Node, Pipe, Term, locate, parse
from agent.rules.template.values import ROOT_FIELDS, Root, Value, go_type, truth

__all__ = ["Template", "compile_template"]


class Template:
    """A template parsed once at rule-load time; :meth:`render` expands it for one alert."""

    __slots__ = ("_nodes", "_where", "text")

    def __init__(self, text: str, nodes: tuple[Node, ...], where: str) -> None:
        self.text, self._nodes, self._where = text, nodes, where

    def render(self, *, labels: Mapping[str, str], value: float, external_labels: Mapping[str, str] | None = None,
               external_url: str = "") -> str:
        """Expand as Prometheus does for one alert; TemplateError if the data fails it (a non-numeric humanize).

        ``labels`` are the sample's labels as the expression returned them: Prometheus includes ``__name__``
        when the expression keeps it, and not the rule's own ``labels:``.
        """
        root = Root(labels, external_labels or {}, external_url, float(value))
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
    return Template(text, parse(text, where), where)


class _Exec:
    """One render: a variable stack over the parsed nodes."""

    def __init__(self, root: Root, text: str) -> None:
        self.text = text
        self.vars: list[tuple[str, Value]] = [
            ("$", root), ("$labels", root.Labels), ("$externalLabels", root.ExternalLabels),
            ("$externalURL", root.ExternalURL), ("$value", root.Value)]

    def walk(self, nodes: Sequence[Node], dot: Value, out: list[str]) -> None:
        for node in nodes:
            if isinstance(node, str):
                out.append(node)
            elif isinstance(node, Pipe):
                value = self.pipe(node, dot)
                if not node.decl:
                    out.append(format_value(value, "", None, None, "v"))
            else:
                mark = len(self.vars)
                value = self.pipe(node.pipe, dot)
                if truth(value):
                    self.walk(node.body, value if node.kind == "with" else dot, out)
                else:
                    self.walk(node.orelse, dot, out)
                del self.vars[mark:]

    def pipe(self, pipe: Pipe, dot: Value) -> Value:
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
        raise TemplateError(f"template {locate(self.text, pos)}: variable {name} is out of scope here")

    def command(self, cmd: tuple[Term, ...], dot: Value, piped: Value | None) -> Value:
        head = cmd[0]
        if head.kind != "func":
            return self.term(head, dot)
        if head.name in ("and", "or"):
            value: Value = False
            for term in cmd[1:]:
                value = self.term(term, dot)
                if truth(value) == (head.name == "or"):
                    return value
            return value if piped is None else piped
        args = [self.term(term, dot) for term in cmd[1:]] + ([] if piped is None else [piped])
        try:
            return FUNCS[head.name](args)
        except TemplateError as exc:
            raise TemplateError(f"template {locate(self.text, head.pos)}: error calling {head.name}: {exc}") from exc

    def term(self, term: Term, dot: Value) -> Value:
        if term.kind == "lit":
            value = term.lit
        elif term.kind == "var":
            value = self.vars[self.slot(term.name, term.pos)][1]
        elif term.kind == "pipe" and term.pipe is not None:
            value = self.pipe(term.pipe, dot)
        else:  # "dot"; a bare function name as an operand never gets here (every function needs an argument)
            value = dot
        for name in term.fields:
            if isinstance(value, Root) and name in ROOT_FIELDS:
                value = getattr(value, name)
            elif isinstance(value, Mapping):
                value = value.get(name, "")
            else:
                where = locate(self.text, term.pos)
                raise TemplateError(f"template {where}: can't evaluate field {name} in type {go_type(value)}")
        return value
