"""YAML read the way Prometheus' Go code reads it (gopkg.in/yaml.v3), not PyYAML's YAML 1.1.

PyYAML resolves ``00000000:18:00.0`` (a PCI bus id) or ``1:30`` as base-60 numbers, a
YAML 1.1 feature Go's yaml.v3 dropped. A rule label or a promtool test expectation
written that way must stay a string, or the agent and Prometheus disagree about the
same file. Every YAML file the agent reads goes through :func:`load`.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

__all__ = ["load"]

_INT = "tag:yaml.org,2002:int"
_FLOAT = "tag:yaml.org,2002:float"


class _Loader(yaml.SafeLoader):
    """SafeLoader without the sexagesimal int/float forms."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
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


def load(text: str) -> Any:
    """Parse one YAML document (raises ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader
