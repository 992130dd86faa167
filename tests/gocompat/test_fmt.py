"""Go's ``strconv.FormatFloat``: the one float formatter behind alert values, ``count_values`` and templates.

The expectations are Go's own output, worked out from ``strconv/ftoa.go`` (shortest digits, then
``%e``/``%f``/``%g`` layout with at least two exponent digits) and checked against Go through
promtool; none is produced by the code under test.
"""

from __future__ import annotations

import math

import pytest

from agent.gocompat.fmt import format_float

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(("x", "e", "f", "g"), [
    (0.0, "0e+00", "0", "0"),
    (-0.0, "-0e+00", "-0", "-0"),
    (20.0, "2e+01", "20", "20"),
    (0.5, "5e-01", "0.5", "0.5"),
    (-3.25, "-3.25e+00", "-3.25", "-3.25"),
    (1e-7, "1e-07", "0.0000001", "1e-07"),
    (0.0001, "1e-04", "0.0001", "0.0001"),
    (1e-5, "1e-05", "0.00001", "1e-05"),
    (100000.0, "1e+05", "100000", "100000"),
    (1e6, "1e+06", "1000000", "1e+06"),
    (123456789.0, "1.23456789e+08", "123456789", "1.23456789e+08"),
    (1e21, "1e+21", "1" + "0" * 21, "1e+21"),
    (1.5e300, "1.5e+300", "15" + "0" * 299, "1.5e+300"),
    (5e-324, "5e-324", "0." + "0" * 323 + "5", "5e-324"),
    (2.0**53 + 2, "9.007199254740994e+15", "9007199254740994", "9.007199254740994e+15"),
    (0.1, "1e-01", "0.1", "0.1"),
    (1.7976931348623157e308, "1.7976931348623157e+308", "17976931348623157" + "0" * 292, "1.7976931348623157e+308"),
])
def test_shortest_forms(x: float, e: str, f: str, g: str) -> None:
    """Precision -1 gives the fewest digits that read back as x, laid out as 'e', 'f' and 'g' (exponent from 1e+06)."""
    assert (format_float(x, "e"), format_float(x, "f"), format_float(x, "g")) == (e, f, g)
    assert format_float(x) == g


@pytest.mark.parametrize(("x", "fmt", "want"), [
    (1e-7, "E", "1E-07"), (1e-7, "G", "1E-07"), (123456789.0, "E", "1.23456789E+08"), (20.0, "G", "20"),
])
def test_upper_case_forms_write_a_capital_e(x: float, fmt: str, want: str) -> None:
    """'E' and 'G' are 'e' and 'g' with the exponent marker in upper case."""
    assert format_float(x, fmt) == want


@pytest.mark.parametrize(("x", "fmt", "prec", "want"), [
    (20.0, "e", 0, "2e+01"),
    (1234.5678, "e", 3, "1.235e+03"),
    (0.0, "e", 3, "0.000e+00"),
    (-0.0, "e", 2, "-0.00e+00"),
    (5e-324, "e", 3, "4.941e-324"),  # the exact binary value is 4.9406564584124654...e-324
    (2.0**53 + 2, "e", 3, "9.007e+15"),
    (9.99, "e", 1, "1.0e+01"),
    (1.5, "E", 2, "1.50E+00"),
    (0.125, "f", 2, "0.12"),  # an exact tie rounds to even
    (0.375, "f", 2, "0.38"),
    (2.675, "f", 2, "2.67"),  # 2.674999... in binary
    (2.5, "f", 0, "2"),
    (0.5, "f", 0, "0"),
    (9.99, "f", 1, "10.0"),
    (-0.0, "f", 3, "-0.000"),
    (-0.001, "f", 1, "-0.0"),
    (1e21, "f", 0, "1000000000000000000000"),
    (0.5, "f", 3, "0.500"),
    (1234.5678, "g", 0, "1e+03"),  # precision 0 counts as 1
    (1234.5678, "g", 3, "1.23e+03"),
    (1.5, "g", 4, "1.5"),  # 'g' drops trailing zeros
    (100.0, "g", 3, "100"),
    (100.0, "g", 2, "1e+02"),
    (123456789.0, "g", 10, "123456789"),
    (0.0001234, "g", 3, "0.000123"),
    (0.00001234, "g", 3, "1.23e-05"),
    (0.1, "g", 17, "0.10000000000000001"),
    (5e-324, "g", 17, "4.9406564584124654e-324"),
    (-0.0, "g", 3, "-0"),
    (1e-7, "G", 2, "1E-07"),
])
def test_explicit_precision(x: float, fmt: str, prec: int, want: str) -> None:
    """An explicit precision rounds the exact binary value (ties to even): digits after the point for 'e'/'f',
    significant digits for 'g'."""
    assert format_float(x, fmt, prec) == want


@pytest.mark.parametrize(("x", "fmt", "prec", "want"), [
    (1.5, "x", -1, "0x1.8p+00"),
    (20.0, "X", -1, "0X1.4P+04"),
    (0.0, "x", -1, "0x0p+00"),
    (-0.0, "x", 2, "-0x0.00p+00"),
    (5e-324, "x", -1, "0x1p-1074"),  # subnormals are normalised
    (1.7976931348623157e308, "x", -1, "0x1.fffffffffffffp+1023"),
    (1.0, "x", 3, "0x1.000p+00"),
    (1.5, "x", 0, "0x1p+01"),  # 0x1.8 is a tie: to even, 0x2p+00, written 0x1p+01
    (2.5, "x", 0, "0x1p+01"),  # 0x1.4p+01 rounds down
    (1.96875, "x", 1, "0x1.0p+01"),  # 0x1.f8 rounds up past 0x1.f
])
def test_hex_forms(x: float, fmt: str, prec: int, want: str) -> None:
    """'x' and 'X' write the binary mantissa in hex with a decimal power-of-two exponent, rounded to prec digits."""
    assert format_float(x, fmt, prec) == want


@pytest.mark.parametrize("fmt", ["e", "E", "f", "g", "G", "x", "X"])
@pytest.mark.parametrize("prec", [-1, 0, 3])
def test_nan_and_infinities_ignore_format_and_precision(fmt: str, prec: int) -> None:
    """NaN, +Inf and -Inf are written the same whatever the format and precision."""
    assert [format_float(v, fmt, prec) for v in (NAN, INF, -INF)] == ["NaN", "+Inf", "-Inf"]


def test_unknown_format_is_an_error() -> None:
    """A format outside e E f g G x X is a ValueError, not a guess."""
    with pytest.raises(ValueError, match="'b'"):
        format_float(1.0, "b")
