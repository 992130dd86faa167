"""The ``sre-agent nccl`` command (placeholder until its helper lands)."""

from __future__ import annotations

import argparse
from typing import Any

from agent.exitcodes import EXIT_BAD_INPUT

__all__ = ["add_parser"]


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("nccl", help="(not yet implemented)")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return EXIT_BAD_INPUT
