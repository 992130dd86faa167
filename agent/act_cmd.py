"""``sre-agent silence`` and ``sre-agent incidents`` (placeholder until implemented)."""

from __future__ import annotations

from typing import Any

__all__ = ["add_parsers"]


def add_parsers(sub: Any) -> None:
    """Register the act-layer subcommands."""
