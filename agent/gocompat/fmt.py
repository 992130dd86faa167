"""Go's ``fmt`` and ``strconv`` formatting, for the values a rule template prints.

Why: Prometheus renders ``{{ $value }}`` with Go's ``%v`` and ``printf`` with Go's
``fmt.Sprintf``, and alert annotations must read byte for byte the same here. Python's
``format`` differs in the details that show: Go's ``%v`` of a float64 is the shortest
round-tripping form, in exponent form from ``1e+06`` up and below ``1e-04``
(``strconv.FormatFloat(x, 'g', -1, 64)``, :func:`shortest`) with two-digit exponents;
infinities are ``+Inf``/``-Inf``, hex floats ``0x1.8p+01``, ``%q`` is ``strconv.Quote``, and a
verb that does not fit its operand prints ``%!verb(type=value)`` instead of failing. Only the
verbs and flags rule templates use are here (``%s %d %f %e %g %v %q %x %t`` with ``-+0`` and
space, width and precision); anything else is a :class:`TemplateError`, raised when the
template loads if its format string is a literal.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol, TypeAlias

from agent.errors import TemplateError

__all__ = ["MAP", "GoStruct", "GoValue", "format_float", "format_value", "go_type", "quote", "shortest", "sprintf"]

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
        text = format_float(v, flags, width, prec, verb) if verb in "vgGeEfFxX" else None
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


def format_float(x: float, flags: str, width: int | None, prec: int | None, verb: str) -> str:
    if not math.isfinite(x):
        num = "NaN" if math.isnan(x) else "Inf"
        sign = "-" if x < 0 else "+" if "+" in flags else " " if " " in flags else "+" if num == "Inf" else ""
        return _pad(sign + num, flags, width, zero=False)
    if verb in "xX":
        if prec is not None:
            raise TemplateError("printf %.Nx of a float is outside the supported subset")
        sign = "-" if math.copysign(1.0, x) < 0 else ""
        mant, exp = math.frexp(abs(x))
        digits = f"{int((mant * 2 - 1) * (1 << 52)):013x}".rstrip("0")
        body = f"0x1{'.' if digits else ''}{digits}p{'-' if exp < 1 else '+'}{abs(exp - 1):02d}" if x else "0x0p+00"
        num = sign + (body.upper() if verb == "X" else body)
    elif prec is None and verb in "vgG":
        num = shortest(x, "E" if verb == "G" else "e")
    else:
        num = format(x, f".{6 if prec is None else prec}{'g' if verb == 'v' else verb}")
    return _sign_pad(num, flags, width)


def shortest(x: float, e: str = "e") -> str:
    """Go's ``strconv.FormatFloat(x, 'g', -1, 64)``: shortest digits, exponent form from 1e+06 and below 1e-04."""
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return sign + "0"
    mant, _, exp = repr(abs(x)).partition("e")
    whole, _, frac = mant.partition(".")
    digits = (whole + frac).lstrip("0")
    point = len(whole) + int(exp or 0) - (len(whole + frac) - len(digits))
    digits = digits.rstrip("0")
    if not -4 <= point - 1 < 6:
        rest = f".{digits[1:]}" if len(digits) > 1 else ""
        return f"{sign}{digits[0]}{rest}{e}{'-' if point < 1 else '+'}{abs(point - 1):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return f"{sign}{digits[:point]}.{digits[point:]}"


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
