"""The values a Prometheus rule template handles, and the Go types they stand for.

Why a module of its own: the template parser types what it can at load time, the renderer
walks real values, and Go's ``fmt`` and the template functions print and check them; all four
must agree on one model. A template sees five Go types: ``string``, ``float64`` (``$value``),
``int`` and ``bool`` (literals, comparisons), ``map[string]string`` (``$labels``) and the root
struct that holds them (``.``). In Python they are ``str``, ``float``, ``int``, ``bool``,
a ``Mapping`` and :class:`Root`; :func:`go_type` names a value's Go type as Go's error
messages and ``%T`` do, and the parser uses the same names as static types (``""`` where a
type is only known when rendering).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, TypeAlias

from agent.gocompat.fmt import MAP, go_type

__all__ = ["MAP", "ROOT", "ROOT_FIELDS", "Root", "Value", "go_type", "truth"]

#: The Go type name of the root data ``.`` (``$labels`` and ``$externalLabels`` are :data:`MAP`).
ROOT = "struct { Labels map[string]string; ExternalLabels map[string]string; ExternalURL string; Value float64 }"
#: The root's fields and their types.
ROOT_FIELDS = {"Labels": MAP, "ExternalLabels": MAP, "ExternalURL": "string", "Value": "float64"}


@dataclass(frozen=True)
class Root:
    """The data Prometheus hands a rule template (``.Labels``, ``.ExternalLabels``, ...)."""

    GO_TYPE: ClassVar[str] = ROOT
    Labels: Mapping[str, str]
    ExternalLabels: Mapping[str, str]
    ExternalURL: str
    Value: float


Value: TypeAlias = str | float | int | bool | Mapping[str, str] | Root


def truth(v: Value) -> bool:
    """Go template truth (``if``, ``and``, ``or``, ``not``): non-empty, non-zero, or the root."""
    if isinstance(v, str | Mapping):
        return len(v) > 0
    return isinstance(v, Root) or bool(v)
