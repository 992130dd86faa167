"""The import layers of agent/: no cycle, nothing upward, nothing sideways, integrations as leaves.

DESIGN.md's data flow is one way (sources -> store -> evaluate -> act, diagnostics beside),
and the folders are that diagram: foundation (errors, series, matchers, store, config/,
gocompat/) -> collect -> promql -> rules | diagnose | simulate -> act -> app -> cli. This test
reads every module with ``ast`` (imports inside functions and under ``TYPE_CHECKING``
count too, since a cycle there is still a cycle of concepts) and fails naming the file, the
line, the module and the names of every import that breaks a rule.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "agent"

#: The rank of each top-level part of ``agent``; an import may only go to an equal or lower rank.
FOUNDATION = ("agent", "agent.errors", "agent.series", "agent.matchers", "agent.store", "agent.config",
              "agent.gocompat")
RANKS = {
    **dict.fromkeys(FOUNDATION, 0),
    "agent.collect": 1,
    "agent.promql": 2,
    "agent.rules": 3,
    "agent.diagnose": 3,
    "agent.simulate": 3,
    "agent.act": 4,
    "agent.app": 5,
    "agent.cli": 6,
    "agent.__main__": 7,
}
#: Receiver integrations (Alertmanager's ``notify/<kind>``): only the sink package itself (its
#: registry builds them) may import one; the rest of the agent uses the registry and the shared parts.
SINKS = "agent.act.sinks"
SINK_SHARED = {f"{SINKS}.http", f"{SINKS}.signing", f"{SINKS}.registry"}
SINK_IMPORTERS: set[str] = set()


@dataclass(frozen=True)
class Edge:
    """One import: ``source`` (file, line) imports ``target`` for ``names``."""

    source: str
    path: Path
    line: int
    target: str
    names: tuple[str, ...]

    def where(self) -> str:
        names = f" ({', '.join(self.names)})" if self.names else ""
        return f"{self.path.relative_to(REPO)}:{self.line} imports {self.target}{names}"


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (REPO / rel).with_suffix(".py").is_file() or (REPO / rel / "__init__.py").is_file()


def imports_of(path: Path) -> list[Edge]:
    """Every import of an ``agent`` module in one file, resolved to the module that defines the name."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    edges = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            edges += [Edge(me, path, node.lineno, a.name, ()) for a in node.names if a.name.split(".")[0] == "agent"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.split(".")[0] != "agent":
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                target = sub if is_module(sub) else base
                edges.append(Edge(me, path, node.lineno, target, () if target == sub else (alias.name,)))
    return edges


def part_of(module: str) -> str:
    """The top-level part a module belongs to (its key in :data:`RANKS`)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANKS:
            return ".".join(parts[:n])
    raise AssertionError(f"{module} belongs to no layer: add its package to RANKS in tests/test_layers.py")


def all_edges() -> list[Edge]:
    return [e for path in sorted(PACKAGE.rglob("*.py")) for e in imports_of(path)]


def layer_problems(edges: list[Edge]) -> list[str]:
    problems = []
    for e in edges:
        src, dst = part_of(e.source), part_of(e.target)
        if RANKS[dst] > RANKS[src]:
            problems.append(f"{e.where()}: upward ({src} is layer {RANKS[src]}, {dst} is layer {RANKS[dst]})")
        elif RANKS[dst] == RANKS[src] and src != dst and RANKS[src] != 0:
            problems.append(f"{e.where()}: sideways ({src} and {dst} are both layer {RANKS[src]})")
        elif (e.target.startswith(f"{SINKS}.") and e.target not in SINK_SHARED
              and not e.source.startswith(SINKS) and e.source not in SINK_IMPORTERS):
            problems.append(f"{e.where()}: a receiver integration is a leaf; use what {SINKS} exports")
    return problems


def cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.source, set()).add(e.target)
        graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_module_belongs_to_a_layer() -> None:
    """Each module under agent/ falls in one of the layers above (a new package must be placed)."""
    for path in PACKAGE.rglob("*.py"):
        part_of(module_name(path))


def test_no_upward_sideways_or_leaf_imports() -> None:
    """No import goes to a higher layer, to another package of the same layer, or into one sink."""
    problems = layer_problems(all_edges())
    assert not problems, "layer violations:\n" + "\n".join(problems)


def test_no_import_cycle() -> None:
    """The module graph has no cycle, not even through imports under TYPE_CHECKING or in functions."""
    edges = all_edges()
    found = cycles(edges)
    detail = []
    for component in found:
        members = set(component)
        detail.append(" <-> ".join(component))
        detail += [f"    {e.where()}" for e in edges if e.source in members and e.target in members]
    assert not found, "import cycles:\n" + "\n".join(detail)


@pytest.mark.parametrize(("source", "target", "rule"), [
    ("agent.config.act", "agent.diagnose.nccl.interconnects", "upward"),
    ("agent.rules.manager", "agent.diagnose.findings", "sideways"),
    ("agent.act.dispatch", "agent.act.sinks.alertmanager", "leaf"),
])
def test_the_checker_catches_each_kind(source: str, target: str, rule: str) -> None:
    """The checker itself: a planted upward, sideways or into-a-sink import is reported."""
    planted = Edge(source, PACKAGE / "planted.py", 1, target, ("x",))
    problems = layer_problems([planted])
    assert len(problems) == 1 and (rule in problems[0]), problems


def test_the_checker_finds_a_planted_cycle() -> None:
    """A two-module cycle is found and named; a chain is not a cycle."""
    a = Edge("agent.store", PACKAGE / "store.py", 1, "agent.series", ())
    b = Edge("agent.series", PACKAGE / "series.py", 1, "agent.store", ())
    assert cycles([a, b]) == [["agent.series", "agent.store"]]
    assert cycles([a]) == []
