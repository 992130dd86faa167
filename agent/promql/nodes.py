"""The engine's own expression tree, compiled once from promql-parser's AST.

promql-parser's nodes are Rust objects: each attribute read crosses into Rust, durations
come back as ``timedelta``, operators as opaque tokens. A rule is parsed once and
evaluated every interval, so :func:`agent.promql.syntax.parse` translates the tree into
these small frozen dataclasses up front: durations in integer milliseconds, operators
as strings, label matchers as precompiled :class:`agent.store.SeriesMatcher` objects (one
regex compile per expression, not per evaluation), parentheses dropped. The evaluator
dispatches on these classes.

Each node knows its PromQL value type (``"vector"``, ``"scalar"``, ``"matrix"``,
``"string"``), which the parser has already checked.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.store import SeriesMatcher

__all__ = [
    "Aggregate",
    "At",
    "Binary",
    "Call",
    "Expr",
    "MatrixSel",
    "Node",
    "NumberLit",
    "StringLit",
    "Subquery",
    "Unary",
    "VectorSel",
]


class Node:
    """Base of every compiled node."""

    __slots__ = ()

    @property
    def type(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class At:
    """An ``@`` modifier: a fixed time in ms, or the query's ``start()``/``end()``."""

    kind: str  # "at" | "start" | "end"
    ms: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class NumberLit(Node):
    value: float

    @property
    def type(self) -> str:
        return "scalar"


@dataclass(frozen=True, slots=True, eq=False)
class StringLit(Node):
    value: str

    @property
    def type(self) -> str:
        return "string"


@dataclass(frozen=True, slots=True, eq=False)
class VectorSel(Node):
    """``name{matchers} offset o @ t``. ``key`` identifies the series set, so equal
    selectors in one expression share one store lookup per evaluation."""

    name: str | None
    matchers: tuple[SeriesMatcher, ...]
    offset_ms: int
    at: At | None
    key: tuple[tuple[str, str, str], ...]

    @property
    def type(self) -> str:
        return "vector"


@dataclass(frozen=True, slots=True, eq=False)
class MatrixSel(Node):
    sel: VectorSel
    range_ms: int

    @property
    def type(self) -> str:
        return "matrix"


@dataclass(frozen=True, slots=True, eq=False)
class Subquery(Node):
    expr: Node
    range_ms: int
    step_ms: int | None  # None: the engine's default subquery step
    offset_ms: int
    at: At | None

    @property
    def type(self) -> str:
        return "matrix"


@dataclass(frozen=True, slots=True, eq=False)
class Unary(Node):
    """Unary minus (unary plus is dropped by the parser)."""

    expr: Node

    @property
    def type(self) -> str:
        return self.expr.type


@dataclass(frozen=True, slots=True, eq=False)
class Binary(Node):
    """A binary operator. ``card`` is ``one-to-one``, ``many-to-one`` (group_left),
    ``one-to-many`` (group_right) or ``many-to-many`` (set operators); ``on`` says
    whether ``labels`` came from ``on(...)`` or ``ignoring(...)``; ``include`` lists
    the ``group_x(...)`` labels copied from the "one" side."""

    op: str
    lhs: Node
    rhs: Node
    card: str
    on: bool
    labels: tuple[str, ...]
    include: tuple[str, ...]
    return_bool: bool

    @property
    def type(self) -> str:
        return "scalar" if self.lhs.type == "scalar" and self.rhs.type == "scalar" else "vector"


@dataclass(frozen=True, slots=True, eq=False)
class Aggregate(Node):
    op: str
    expr: Node
    param: Node | None
    without: bool
    grouping: tuple[str, ...]

    @property
    def type(self) -> str:
        return "vector"


@dataclass(frozen=True, slots=True, eq=False)
class Call(Node):
    func: str
    args: tuple[Node, ...]
    returns: str

    @property
    def type(self) -> str:
        return self.returns


@dataclass(frozen=True, slots=True)
class Expr:
    """A parsed, validated expression: what :func:`agent.promql.parse` returns and
    :meth:`agent.promql.Engine.instant` accepts. ``type`` is its PromQL value type."""

    text: str
    root: Node

    @property
    def type(self) -> str:
        return self.root.type

    def __str__(self) -> str:
        return self.text
