"""Go's ``strconv.FormatFloat`` and ``fmt`` formatting, for every float the agent shows as Prometheus would.

Why: Prometheus prints floats with Go, and where a user or a tool reads the text it must be byte
for byte the same here. :func:`format_float` is the one float formatter: Go's
``strconv.FormatFloat(x, fmt, prec, 64)`` for ``'e' 'E' 'f' 'g' 'G' 'x' 'X'``, shortest round-trip digits
for precision -1, ``NaN``/``+Inf``/``-Inf``, a sign on ``-0`` and at least two exponent digits.
The API's alert ``value`` is its ``'e'`` form (``2e+01``), ``count_values`` labels its ``'f'`` form,
``{{ $value }}`` and ``printf`` in rule templates are Go's ``fmt`` built on it (``%v`` is ``'g'``
shortest: exponent form from ``1e+06`` up and below ``1e-04``). Python's ``format`` differs in
the details that show (no shortest ``e``, ``inf``, hex floats), so it only supplies correctly rounded
digits. Beyond floats, ``%q`` is ``strconv.Quote`` and a verb that does not fit its operand
prints ``%!verb(type=value)`` instead of failing. Only the verbs and flags rule templates use are
here (``%s %d %f %e %g %v %q %x %t`` with ``-+0`` and space, width and precision); anything else
is a :class:`TemplateError`, raised when the template loads if its format string is a literal.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeAlias

from agent.errors import TemplateError

__all__ = ["MAP", "GoStruct", "GoValue", "format_float", "format_value", "go_type", "quote", "sprintf"]

#: The Go type name of a string-to-string map (``$labels``, ``$externalLabels``).
MAP = "map[string]string"


class GoStruct(Protocol):
    """A Go struct value: a dataclass whose ``GO_TYPE`` is its Go type name; fields print in order."""

    GO_TYPE: ClassVar[str]
    __dataclass_fields__: ClassVar[dict[str, Any]]


#: The Go values ``fmt`` prints here: ``string``, ``float64``, ``int``, ``bool``,
#: ``map[string]string`` and structs of them.
GoValue: TypeAlias = str | float | int | bool | Mapping[str, str] | GoStruct


def go_type(v: GoValue) -> str:
    """The Go type name of a value, as Go's messages and ``%T`` spell it."""
    if isinstance(v, Mapping):
        return MAP
    if not isinstance(v, str | float | int | bool):
        return type(v).GO_TYPE
    return {bool: "bool", int: "int", float: "float64"}.get(type(v), "string")

_SPEC = re.compile(r"%([-+# 0]*)(\d*)(?:\.(\d*))?(.?)", re.S)
#: The control characters ``strconv.Quote`` writes as a one-letter escape.
_QUOTE_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t",
                  "\v": "\\v"}


def sprintf(fmt: str, args: Sequence[GoValue]) -> str:
    """Go's ``fmt.Sprintf(fmt, args...)``, including its ``%!(MISSING)``/``%!(EXTRA ...)`` notes."""
    out, n, last = [], 0, 0
    for m in _SPEC.finditer(fmt):
        out.append(fmt[last:m.start()])
        last = m.end()
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        if verb == "%" or not verb:
            out.append("%" if verb else "%!(NOVERB)")
        elif verb not in "vsdfFeEgGqxXt" or "#" in flags:
            raise TemplateError(f"printf verb %{flags}{width}{verb} is outside the supported subset "
                                "(%s %d %f %e %g %v %q %x %t with flags -+0 and space, width, precision)")
        elif n >= len(args):
            out.append(f"%!{verb}(MISSING)")
        else:
            out.append(format_value(args[n], flags, int(width) if width else None,
                                    None if prec is None else int(prec or 0), verb))
            n += 1
    out.append(fmt[last:])
    if n < len(args):
        extra = ", ".join(go_type(a) + "=" + format_value(a, "", None, None, "v") for a in args[n:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def format_value(v: GoValue, flags: str, width: int | None, prec: int | None, verb: str) -> str:
    """One operand as Go's fmt prints it; a verb that does not fit the type gives Go's ``%!verb(type=value)``."""
    if isinstance(v, Mapping):
        spec = (flags, width, prec, verb)
        pairs = (format_value(k, *spec) + ":" + format_value(x, *spec) for k, x in sorted(v.items()))
        return f"map[{' '.join(pairs)}]"
    if not isinstance(v, str | float | int | bool):  # a struct: its fields in order
        fields = (getattr(v, f.name) for f in dataclasses.fields(v))
        return "{" + " ".join(format_value(x, flags, width, prec, verb) for x in fields) + "}"
    text = None
    if isinstance(v, bool):
        text = _pad("true" if v else "false", flags, width) if verb in "tv" else None
    elif isinstance(v, int):
        text = _fmt_int(v, flags, width, prec, verb) if verb in "dvxXq" else None
    elif isinstance(v, float):
        text = _fmt_float(v, flags, width, prec, verb) if verb in "vgGeEfFxX" else None
    elif verb in "xX":
        data = v.encode()[:prec] if prec is not None else v.encode()
        text = _pad((" " if " " in flags else "").join(format(b, "02" + verb) for b in data), flags, width)
    elif verb in "svq":
        s = v if prec is None else v[:prec]
        text = _pad(quote(s, '"') if verb == "q" else s, flags, width)
    return text if text is not None else f"%!{verb}({go_type(v)}={format_value(v, flags, width, prec, 'v')})"


def _pad(body: str, flags: str, width: int | None, *, zero: bool = True) -> str:
    if width is None or len(body) >= width:
        return body
    if "-" in flags:
        return body + " " * (width - len(body))
    return ("0" if zero and "0" in flags else " ") * (width - len(body)) + body


def _sign_pad(num: str, flags: str, width: int | None) -> str:
    if not num.startswith("-"):
        num = ("+" if "+" in flags else " " if " " in flags else "") + num
    if "0" in flags and "-" not in flags and width and len(num) < width:
        sign = num[:1] if num[:1] in ("+", "-", " ") else ""
        return sign + num[len(sign):].rjust(width - len(sign), "0")
    return _pad(num, flags, width, zero=False)


def _fmt_int(n: int, flags: str, width: int | None, prec: int | None, verb: str) -> str:
    if verb == "q":
        char = chr(n) if 0 <= n <= 0x10FFFF and not 0xD800 <= n <= 0xDFFF else "\ufffd"
        return _pad(quote(char, "'"), flags, width)
    digits = format(abs(n), verb if verb in "xX" else "d")
    if prec is not None:
        digits = "" if prec == 0 and n == 0 else digits.rjust(prec, "0")
        flags = flags.replace("0", "")
    return _sign_pad(("-" if n < 0 else "") + digits, flags, width)


def _fmt_float(x: float, flags: str, width: int | None, prec: int | None, verb: str) -> str:
    """A float under a printf verb, as Go's ``fmt`` prints it: :func:`format_float`, then sign and padding."""
    if verb in "xX" and prec is not None:
        raise TemplateError("printf %.Nx of a float is outside the supported subset")
    conv = {"v": "g", "F": "f"}.get(verb, verb)
    num = format_float(x, conv, (-1 if conv in "gGxX" else 6) if prec is None else prec)
    if math.isfinite(x):
        return _sign_pad(num, flags, width)
    # Go keeps the sign of +Inf unless asked for a space, drops NaN's unless asked, and never pads with zeros.
    sign = "-" if x < 0 else "+" if "+" in flags else " " if " " in flags else "+" if math.isinf(x) else ""
    return _pad(sign + num.lstrip("+-"), flags, width, zero=False)


def format_float(x: float, fmt: str = "g", prec: int = -1) -> str:
    """Go's ``strconv.FormatFloat(x, fmt, prec, 64)``; a negative ``prec`` means the fewest digits that read back.

    ``fmt`` is one of ``e E f g G x X``: ``format_float(20, "e")`` is ``2e+01``, ``format_float(1e21, "f")``
    is ``1000000000000000000000``, ``format_float(1e6)`` is ``1e+06``, ``format_float(0.125, "f", 2)`` is
    ``0.12`` (exact ties round to even). Anything else is a ValueError.
    """
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    if fmt in ("x", "X"):
        return _fmt_x(x, fmt, prec)
    if fmt not in ("e", "E", "f", "g", "G"):
        raise ValueError(f"strconv.FormatFloat format {fmt!r} is not one of e E f g G x X")
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    shortest = prec < 0
    if shortest:  # repr is the shortest round trip too, and the closest of those to x, as Go's
        digits, point = _digits(repr(abs(x)))
        prec = {"e": len(digits) - 1, "f": len(digits) - point, "g": len(digits)}[fmt.lower()]
    elif fmt == "f":  # Python rounds the exact binary value correctly, ties to even, as Go's decimal does
        digits, point = _digits(format(abs(x), f".{prec}f"))
    else:
        if fmt in "gG":
            prec = max(prec, 1)  # Go's %.0g is %.1g
        digits, point = _digits(format(abs(x), f".{prec - 1 if fmt in 'gG' else prec}e"))
    return sign + _layout(digits, point, max(prec, 0), fmt, shortest)


def _digits(text: str) -> tuple[str, int]:
    """Decimal text (``12.50``, ``1.5e-07``) as Go's decimal: significant digits and the point's place (value
    ``0.<digits> * 10**point``); zero is ``("", 0)``."""
    mant, _, exp = text.partition("e")
    whole, _, frac = mant.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + int(exp or 0) - (len(whole + frac) - len(digits))
    digits = digits.rstrip("0")
    return (digits, point) if digits else ("", 0)


def _layout(digits: str, point: int, prec: int, fmt: str, shortest: bool) -> str:
    """Go's ``formatDigits``: the digits in ``e``/``E``, ``f`` or ``g``/``G`` form with ``prec`` digits."""
    if fmt in "eE":
        return _fmt_e(digits, point, prec, fmt)
    if fmt == "f":
        return _fmt_f(digits, point, prec)
    exp = point - 1
    if exp < -4 or exp >= (6 if shortest else prec):  # the precision decides, shortest or not as if it were 6
        return _fmt_e(digits, point, min(prec, len(digits)) - 1, "e" if fmt == "g" else "E")
    return _fmt_f(digits, point, max((len(digits) if prec > point else prec) - point, 0))


def _fmt_e(digits: str, point: int, prec: int, e: str) -> str:
    exp = point - 1 if digits else 0
    frac = "." + digits[1:prec + 1].ljust(prec, "0") if prec > 0 else ""
    return f"{digits[:1] or '0'}{frac}{e}{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _fmt_f(digits: str, point: int, prec: int) -> str:
    whole = digits[:point].ljust(point, "0") if point > 0 else "0"
    frac = "".join(digits[j] if 0 <= j < len(digits) else "0" for j in range(point, point + prec))
    return whole + ("." + frac if prec > 0 else "")


def _fmt_x(x: float, fmt: str, prec: int) -> str:
    """Go's ``fmtX``: ``-0x1.yyyp+dd``, the mantissa rounded to ``prec`` hex digits (ties to even) if ``prec >= 0``."""
    mant, exp = math.frexp(abs(x))
    m, exp = (int(mant * (1 << 61)), exp - 1) if x else (0, 0)  # the leading 1 at bit 60, as Go shifts it
    if 0 <= prec < 15:
        shift = 60 - prec * 4
        extra, m = m & ((1 << shift) - 1), m >> shift
        if (extra << (60 - shift)) | (m & 1) > 1 << 59:
            m += 1
        m <<= shift
        if m >> 61:  # rounded up to 0x2.0: renormalise
            m, exp = m >> 1, exp + 1
    hexdigits = format(m & ((1 << 60) - 1), "015x")
    frac = hexdigits.rstrip("0") if prec < 0 else hexdigits[:prec].ljust(prec, "0")
    body = f"0x{m >> 60}{'.' if frac else ''}{frac}p{'-' if exp < 0 else '+'}{abs(exp):02d}"
    return ("-" if math.copysign(1.0, x) < 0 else "") + (body.upper() if fmt == "X" else body)


def quote(s: str, q: str) -> str:
    """Go's strconv.Quote (q='"') or QuoteRune (q="'")."""
    out = [q]
    for c in s:
        if c in (q, "\\"):
            out.append("\\" + c)
        elif c.isprintable():
            out.append(c)
        elif c in _QUOTE_ESCAPES:
            out.append(_QUOTE_ESCAPES[c])
        else:
            o = ord(c)
            out.append(f"\\x{o:02x}" if o < 0x20 or o == 0x7F else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out) + q
