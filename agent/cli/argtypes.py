"""argparse ``type=`` functions for numbers and durations that refuse what no command can use.

``type=float`` accepts ``nan``, ``inf`` and ``1e999``; ``type=int`` accepts ``0``, ``-3`` and
integers too large for SQLite or a socket. Left to the command, such a value ends in a
traceback (``cannot convert float NaN to integer``, ``bind(): port must be 0-65535``) or in a
wrong answer (``nan`` compares false with every bound). These refuse it where argparse reads
it, so the command exits 2 (:data:`~agent.cli.exitcodes.EXIT_BAD_INPUT`) with one line that
names the flag and the value: ``argument --time-scale: must be a finite number > 0, got 'nan'``.

:func:`checked` turns any ``str -> value`` converter that raises :class:`ValueError` into such
a type, keeping the converter's message (argparse shows only "invalid value" otherwise).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

from agent.config import parse_duration

__all__ = ["checked", "duration", "duration_text", "integer", "number", "port"]

T = TypeVar("T")

#: SQLite's INTEGER is 64-bit signed: the largest id or count a state database query can take.
MAX_SQL_INT = 2**63 - 1


def checked(convert: Callable[[str], T]) -> Callable[[str], T]:
    """``convert`` as an argparse type whose :class:`ValueError` message reaches the user."""
    def check(text: str) -> T:
        try:
            return convert(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from exc
    check.__name__ = getattr(convert, "__name__", "value")
    return check


def integer(minimum: int, maximum: int = MAX_SQL_INT) -> Callable[[str], int]:
    """A whole number in ``[minimum, maximum]``."""
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError as exc:
            raise ValueError(f"must be an integer ≥ {minimum}, got {text!r:.40}") from exc
        if not minimum <= value <= maximum:
            raise ValueError(f"must be an integer from {minimum} to {maximum:,}, got {text!r:.40}")
        return value
    convert.__name__ = "integer"
    return checked(convert)


def number(*, minimum: float = 0.0, inclusive: bool = False, maximum: float = math.inf) -> Callable[[str], float]:
    """A finite float above ``minimum`` (or equal to it with ``inclusive``) and at most ``maximum``:
    ``nan``, ``inf`` and ``1e999`` are refused."""
    bound = f"≥ {minimum:g}" if inclusive else f"> {minimum:g}"
    if maximum < math.inf:
        bound += f" and ≤ {maximum:g}"

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError as exc:
            raise ValueError(f"must be a finite number {bound}, got {text!r:.40}") from exc
        if not math.isfinite(value) or value < minimum or (value == minimum and not inclusive) or value > maximum:
            raise ValueError(f"must be a finite number {bound}, got {text!r:.40}")
        return value
    convert.__name__ = "number"
    return checked(convert)


def port(*, allow_off: bool = False) -> Callable[[str], int]:
    """A TCP port, 0 (any free one) to 65535; ``-1`` too with ``allow_off`` (the exporter turned off)."""
    return integer(-1 if allow_off else 0, 65535)


def _positive_duration(text: str) -> str:
    if parse_duration(text) <= 0:
        raise ValueError(f"must be a positive duration such as 15s, got {text!r:.40}")
    return text


def _seconds(text: str) -> float:
    return parse_duration(_positive_duration(text))


#: A positive Prometheus duration (``15s``, ``1m30s``, ``500ms``) in seconds.
duration: Callable[[str], float] = checked(_seconds)
#: The same, validated but kept as written, for a command that passes it on to a config.
duration_text: Callable[[str], str] = checked(_positive_duration)
