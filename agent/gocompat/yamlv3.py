"""YAML read the way Prometheus' Go code reads it (gopkg.in/yaml.v3), not PyYAML's YAML 1.1,
and read safely from files that other people and tools write.

PyYAML resolves ``00000000:18:00.0`` (a PCI bus id) or ``1:30`` as base-60 numbers, a
YAML 1.1 feature Go's yaml.v3 dropped. A rule label or a promtool test expectation
written that way must stay a string, or the agent and Prometheus disagree about the
same file. Every YAML file the agent reads goes through :func:`load` or :func:`load_file`.

The same reader refuses documents that would cost far more to use than to read, because
``file_sd`` files are re-read inside the running daemon and one bad file must never take
the loop down:

* **Alias expansion** ("billion laughs"): PyYAML shares an aliased node instead of copying
  it, so loading a bomb is cheap, but whatever walks the result (pydantic, the rule
  loader, an error message) pays for the fully expanded tree. While composing, the
  loader counts the nodes the document has *after* expansion (an alias adds its
  anchor's expanded size, which costs O(1) per alias, never the expansion itself) and
  refuses the document before anything is constructed, like yaml.v3's "document contains
  excessive aliasing": up to :data:`ALIAS_FREE_NODES` expanded nodes are always fine;
  beyond that a document may expand to at most :data:`ALIAS_RATIO` times the nodes it
  spells out and gain at most :data:`MAX_ALIAS_NODES` nodes through aliases. yaml.v3
  lets 99 % of a small document come from aliases (100x) and falls to 10 % for very
  large ones; the absolute cap plays that second role. An anchor used inside itself
  (``&a [*a]``, a cycle PyYAML would build) is refused like yaml.v3 does.
* **Nesting**: PyYAML composes recursively (two Python frames per level) and its scanner
  re-checks every open flow level on each token; past :data:`MAX_DEPTH` levels the
  document is refused (in the scanner, like yaml.v3's "exceeded max depth", and again
  in the composer) instead of a quadratic scan or a ``RecursionError`` no caller expects.
* **Size**: :func:`load_file` reads at most :data:`MAX_BYTES`; a larger file is refused
  without being read in full.

**Duplicate keys** are refused as yaml.v3 refuses them (its decoder's ``uniqueKeys``, on by
default, which Prometheus' rule files and promtool rely on): two keys of one mapping, at any
depth and in block or flow style, that are the same *as written* (same node kind and text,
so ``1`` and ``"1"`` collide while ``1`` and ``0x1`` do not, and an alias key ``*a`` collides
only with another ``*a``) are ``line 6: mapping key "expr" already defined at line 5``.
Two ``<<`` merge keys in one mapping collide too; a key that overrides one brought by a
merge does not (the mapping's own key wins, as in yaml.v3), and neither do equal keys
from two merged mappings (the first in the merge list wins). Without this the last key
silently won: a rule with two ``expr:`` passed our check and failed promtool's.

Booleans are yaml.v3's: only ``true``/``True``/``TRUE`` and ``false``/``False``/``FALSE``;
YAML 1.1's ``yes``, ``no``, ``on``, ``off`` stay strings (a label ``on`` is the text "on").

Every refusal is a ``yaml.YAMLError`` (the loader's own error family, which each caller
already turns into its ``ConfigError`` or ``RuleError`` naming the file), and its message
gives counts and a position, never the expanded data. A ``MemoryError`` or
``RecursionError`` that still happens while loading is turned into a ``yaml.YAMLError``
too. :func:`brief` gives callers a bounded ``repr`` for values they quote in errors.
"""

from __future__ import annotations

import json
import re
import reprlib
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.scanner import ScannerError

__all__ = ["ALIAS_FREE_NODES", "ALIAS_RATIO", "MAX_ALIAS_NODES", "MAX_BYTES", "MAX_DEPTH",
           "brief", "load", "load_file", "read_capped"]

#: Largest file :func:`load_file` reads. Pure-Python PyYAML reads about 0.2 MB/s here (a
#: 0.8 MB rule file of 5,000 alerts takes ~5 s); our bundled rules are 46 KB in all and a
#: file_sd file of 10,000 targets is well under 1 MB, so 4 MiB leaves room while bounding
#: one read to tens of seconds and a few hundred MB.
MAX_BYTES = 4 << 20
#: Deepest collection nesting. Prometheus configs and rule files nest under 10 levels; at
#: 100 the composer stays far from Python's recursion limit (about 2 frames per level).
MAX_DEPTH = 100
#: Expanded size (in nodes) that any document may reach, whatever its aliasing.
ALIAS_FREE_NODES = 10_000
#: Past that, the expanded document may be at most this many times the nodes written.
ALIAS_RATIO = 100
#: ... and aliases may add at most this many nodes in all (about a second of validation).
MAX_ALIAS_NODES = 1_000_000

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"
_BOOL = "tag:yaml.org,2002:bool"
#: How much of a duplicate key an error message quotes.
_KEY_SHOWN = 80


def _go_quoted(text: str) -> str:
    """A key as yaml.v3's ``%#v`` shows it (a double-quoted Go string), cut to a bounded length."""
    cut = text if len(text) <= _KEY_SHOWN else text[:_KEY_SHOWN] + "..."
    return json.dumps(cut, ensure_ascii=False)


class _Loader(yaml.SafeLoader):
    """SafeLoader without the sexagesimal int/float forms, with expansion and depth budgets."""

    def __init__(self, stream: str | bytes) -> None:
        super().__init__(stream)
        self._depth = 0
        self._written = 0  # nodes spelled out in the document
        self._expanded = 0  # nodes after alias expansion
        self._anchor_sizes: dict[str, int] = {}
        self._open_anchors: set[str] = set()

    def fetch_flow_collection_start(self, token_class: Any) -> None:
        # The scanner looks ahead over every open flow level on each token: bound them here,
        # as yaml.v3's scanner does, or ``[[[[...`` costs quadratic time before composing starts.
        if self.flow_level >= MAX_DEPTH:
            raise ScannerError(None, None, f"exceeded max depth of {MAX_DEPTH}", self.get_mark())
        super().fetch_flow_collection_start(token_class)

    def add_indent(self, column: int) -> bool:
        if len(self.indents) >= MAX_DEPTH:
            raise ScannerError(None, None, f"exceeded max depth of {MAX_DEPTH}", self.get_mark())
        added: bool = super().add_indent(column)
        return added

    def compose_document(self) -> yaml.Node | None:
        self._written = self._expanded = 0
        self._anchor_sizes.clear()
        node = super().compose_document()
        budget = max(ALIAS_FREE_NODES, min(ALIAS_RATIO * self._written, self._written + MAX_ALIAS_NODES))
        if self._expanded > budget:
            raise ComposerError(None, None,
                                f"document contains excessive aliasing: {self._expanded:,} nodes after alias "
                                f"expansion from {self._written:,} written (limit {budget:,})", None)
        return node

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:  # the stubs mistype anchor (a str or None)
        """PyYAML's composer, plus yaml.v3's duplicate-key check: a key is its node kind and its text
        as written (an alias key is its anchor's name), compared within this one mapping."""
        start_event = self.get_event()  # type: ignore[no-untyped-call]
        tag = start_event.tag
        if tag is None or tag == "!":
            tag = self.resolve(yaml.MappingNode, None, start_event.implicit)  # type: ignore[no-untyped-call]
        node = yaml.MappingNode(tag, [], start_event.start_mark, None, flow_style=start_event.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
        seen: dict[tuple[str, str], int] = {}
        while not self.check_event(yaml.MappingEndEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            key = self.compose_node(node, None)  # type: ignore[arg-type]
            if isinstance(event, yaml.AliasEvent):
                ident = ("alias", str(event.anchor))
            else:
                ident = (type(key).__name__, key.value if isinstance(key, yaml.ScalarNode) else "")
            line = event.start_mark.line + 1
            if ident in seen:
                raise ComposerError(None, None, f"line {line}: mapping key {_go_quoted(ident[1])} "
                                    f"already defined at line {seen[ident]}", None)
            seen[ident] = line
            value = self.compose_node(node, key)  # type: ignore[arg-type]
            node.value.append((key, value))
        end_event = self.get_event()  # type: ignore[no-untyped-call]
        node.end_mark = end_event.end_mark
        return node

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            anchor = event.anchor
            if anchor in self._open_anchors:
                raise ComposerError(None, None, f"anchor {brief(anchor)} value contains itself", event.start_mark)
            self._expanded += self._anchor_sizes.get(anchor, 0)  # undefined: PyYAML reports it
            return super().compose_node(parent, index)
        event = self.peek_event()  # type: ignore[no-untyped-call]
        anchor = event.anchor
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(None, None, f"exceeded max depth of {MAX_DEPTH}", event.start_mark)
        before = self._expanded
        self._written += 1
        self._expanded += 1
        if anchor is not None:
            self._open_anchors.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor is not None:
                self._open_anchors.discard(anchor)
        if anchor is not None:
            self._anchor_sizes[anchor] = self._expanded - before
        return node


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT, _BOOL)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_Loader.add_implicit_resolver(
    _INT, re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)
_Loader.add_implicit_resolver(
    _FLOAT,
    re.compile(r"^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."),
)

_brief = reprlib.Repr()
_brief.maxstring = _brief.maxother = 60
_brief.maxlevel = 2


def brief(value: object) -> str:
    """A ``repr`` of at most 80 characters that never walks more of ``value`` than it shows."""
    text = _brief.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def load(text: str | bytes) -> Any:
    """Parse one YAML document (raises ``yaml.YAMLError``, also for the budgets above)."""
    if len(text) > MAX_BYTES:
        raise yaml.YAMLError(f"document of {len(text):,} bytes is over the {MAX_BYTES:,}-byte limit")
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
    except (MemoryError, RecursionError) as exc:
        raise yaml.YAMLError(f"document too large to load ({type(exc).__name__})") from exc


def read_capped(path: Path, limit: int = MAX_BYTES) -> bytes:
    """A file's bytes, refusing (``yaml.YAMLError``) one over ``limit`` without reading it all.

    ``OSError`` from opening or reading propagates unchanged.
    """
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise yaml.YAMLError(f"file is over the {limit:,}-byte limit")
    return data


def load_file(path: Path) -> Any:
    """:func:`load` on a file read with :func:`read_capped` (UTF-8, or UTF-16 with a BOM)."""
    return load(read_capped(path))
