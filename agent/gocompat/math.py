"""Go's float64 arithmetic in Python, where the two differ.

Prometheus computes with Go's ``math`` package, which never raises: ``1/0`` is +Inf,
``0/0`` and ``Mod(x, 0)`` are NaN, ``Log(0)`` is -Inf, ``Exp(1000)`` is +Inf. Python's
``math`` raises ``ZeroDivisionError``, ``ValueError`` or ``OverflowError`` in those
cases, and ``floor``/``ceil`` return ints. Every operator and function of the engine
goes through these helpers so results (and special values) match Prometheus exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = [
    "UNARY",
    "ceil",
    "div",
    "floor",
    "fmax",
    "fmin",
    "int64_ok",
    "mod",
    "parse_float",
    "pow_",
]

INF = math.inf
NAN = math.nan
_INT64_MAX = 9.223372036854775807e18


def div(x: float, y: float) -> float:
    try:
        return x / y
    except ZeroDivisionError:
        if math.isnan(x) or x == 0:
            return NAN
        return math.copysign(INF, x) * math.copysign(1.0, y)


def mod(x: float, y: float) -> float:
    """Go's ``math.Mod``: the sign follows ``x``; NaN for ``y == 0`` or infinite ``x``."""
    try:
        return math.fmod(x, y)
    except ValueError:
        return NAN


def _odd_int(y: float) -> bool:
    return math.isfinite(y) and y.is_integer() and abs(y) < 2**53 and int(y) % 2 == 1


def pow_(x: float, y: float) -> float:
    """Go's ``math.Pow`` special cases: overflow to ±Inf, ``0**-y`` to ±Inf, a negative
    base with a fractional exponent to NaN."""
    try:
        return math.pow(x, y)
    except OverflowError:
        return -INF if x < 0 and _odd_int(y) else INF
    except ValueError:
        if x == 0:
            return -INF if _odd_int(y) and math.copysign(1.0, x) < 0 else INF
        return NAN


def floor(x: float) -> float:
    return float(math.floor(x)) if math.isfinite(x) else x


def ceil(x: float) -> float:
    return float(math.ceil(x)) if math.isfinite(x) else x


def fmax(x: float, y: float) -> float:
    """Go's ``math.Max``: +Inf wins over NaN, NaN over everything else."""
    if INF in (x, y):
        return INF
    if math.isnan(x) or math.isnan(y):
        return NAN
    if x == 0 and y == 0:
        return y if math.copysign(1.0, x) < 0 else x
    return x if x > y else y


def fmin(x: float, y: float) -> float:
    """Go's ``math.Min``: -Inf wins over NaN, NaN over everything else."""
    if -INF in (x, y):
        return -INF
    if math.isnan(x) or math.isnan(y):
        return NAN
    if x == 0 and y == 0:
        return x if math.copysign(1.0, x) < 0 else y
    return x if x < y else y


def _guard(
    fn: Callable[[float], float], on_overflow: Callable[[float], float] | None = None
) -> Callable[[float], float]:
    """Wrap a ``math`` function so a domain error gives NaN and an overflow gives what
    Go returns (``on_overflow(x)``, by default +Inf)."""

    def wrapped(x: float) -> float:
        try:
            return fn(x)
        except ValueError:
            return NAN
        except OverflowError:
            return on_overflow(x) if on_overflow else INF

    return wrapped


def _log(fn: Callable[[float], float]) -> Callable[[float], float]:
    def wrapped(x: float) -> float:
        if x == 0:
            return -INF
        if x < 0 or math.isnan(x):
            return NAN
        return fn(x)

    return wrapped


def _atanh(x: float) -> float:
    if x in (1, -1):
        return math.copysign(INF, x)
    try:
        return math.atanh(x)
    except ValueError:
        return NAN


def _sgn(x: float) -> float:
    if x > 0:
        return 1.0
    if x < 0:
        return -1.0
    return x  # 0, -0 and NaN stay as they are


#: The element-wise functions of PromQL that take one float and return one.
UNARY: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "ceil": ceil,
    "floor": floor,
    "exp": _guard(math.exp),
    "sqrt": _guard(math.sqrt),
    "ln": _log(math.log),
    "log2": _log(math.log2),
    "log10": _log(math.log10),
    "sgn": _sgn,
    "sin": _guard(math.sin),
    "cos": _guard(math.cos),
    "tan": _guard(math.tan),
    "asin": _guard(math.asin),
    "acos": _guard(math.acos),
    "atan": math.atan,
    "sinh": _guard(math.sinh, lambda x: math.copysign(INF, x)),
    "cosh": _guard(math.cosh),
    "tanh": math.tanh,
    "asinh": math.asinh,
    "acosh": _guard(math.acosh),
    "atanh": _atanh,
    "deg": lambda x: x * 180 / math.pi,
    "rad": lambda x: x * math.pi / 180,
}


def int64_ok(x: float) -> bool:
    """Whether Go's ``int64(x)`` is meaningful (Prometheus' ``convertibleToInt64``)."""
    return -_INT64_MAX <= x <= _INT64_MAX


_INF_WORDS = frozenset({"inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})


def parse_float(text: str) -> float | None:
    """``strconv.ParseFloat(text, 64)``, or None where Go reports an error (Python's
    ``float`` also takes whitespace, underscores and out-of-range input, Go does not)."""
    if not text or text != text.strip() or "_" in text:
        return None
    try:
        value = float(text)
    except ValueError:
        try:
            value = float.fromhex(text) if "p" in text.lower() else math.nan
        except (ValueError, OverflowError):
            return None
        if math.isnan(value):
            return None
    if math.isinf(value) and text.lower() not in _INF_WORDS:
        return None
    return value
