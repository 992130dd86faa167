"""Tests for agent.diagnose.nccl.parse on numbers that are no measurement: a non-finite or negative
value in any numeric column, or in the footer, makes no row and is recorded with its line.

The rows are edited copies of a real output (the A100 fixture); the expected line numbers and
values are read off the file, not produced by the parser.
"""

from __future__ import annotations

import math

import pytest

from agent.diagnose.nccl.parse import parse_nccl
from tests.conftest import FIXTURES

TEXT = (FIXTURES / "nccl" / "a100x8_nvswitch_allreduce.txt").read_text(encoding="utf-8")
LINES = TEXT.splitlines()
LARGEST = 47  # 1-based line of the 4 GiB row: "4294967296 1073741824 float sum -1 32336 132.82 232.44 0 ..."
FOOTER = 49  # "# Avg bus bandwidth    : 66.2058"
ROWS = 30  # result rows in the file, 8 B to 4 GiB
# (token index in the row, column name): every numeric column of both halves except root (-1 is legal there).
COLUMNS = [(0, "size"), (1, "count"), (5, "time"), (6, "algbw"), (7, "busbw"), (8, "#wrong"),
           (9, "time"), (10, "algbw"), (11, "busbw"), (12, "#wrong")]
VALUES = ["inf", "-inf", "nan", "NaN", "1e999", "-3", "+Infinity"]


def _with(lineno: int, line: str) -> str:
    lines = list(LINES)
    lines[lineno - 1] = line
    return "\n".join(lines) + "\n"


def test_the_unedited_file_is_all_measurements() -> None:
    """The baseline: 30 rows, the footer's 66.2058, nothing invalid."""
    result = parse_nccl(TEXT)
    assert (len(result.rows), result.avg_busbw_gbps, result.invalid) == (ROWS, 66.2058, [])
    assert LINES[LARGEST - 1].split()[0] == "4294967296" and "Avg bus bandwidth" in LINES[FOOTER - 1]


@pytest.mark.parametrize("value", VALUES)
@pytest.mark.parametrize(("index", "column"), COLUMNS, ids=[f"{i}-{c}" for i, c in COLUMNS])
def test_a_value_that_is_no_measurement_drops_its_row_and_is_recorded(index: int, column: str, value: str) -> None:
    """inf, -inf, nan, 1e999 (inf as a float) or a negative number in any numeric column: the row is not
    a result row, and ``invalid`` names the line, the column and the value."""
    tokens = LINES[LARGEST - 1].split()
    tokens[index] = value
    result = parse_nccl(_with(LARGEST, "  ".join(tokens)))
    assert result.invalid == [f"line {LARGEST}: {column} is {value!r}, not a measurement (a finite number ≥ 0)"]
    assert len(result.rows) == ROWS - 1
    assert all(math.isfinite(m.busbw_gbps) and m.busbw_gbps >= 0 for r in result.rows
               for m in (r.out_of_place, r.in_place) if m is not None)


@pytest.mark.parametrize("value", VALUES)
def test_a_footer_that_is_no_measurement_is_recorded(value: str) -> None:
    """The "Avg bus bandwidth" line with a non-finite or negative figure: recorded, no average taken from
    it, and the run still counts as finished (not truncated)."""
    result = parse_nccl(_with(FOOTER, f"# Avg bus bandwidth    : {value}"))
    assert result.invalid == [f"line {FOOTER}: Avg bus bandwidth is {value!r}, not a measurement "
                              "(a finite number ≥ 0)"]
    assert result.avg_busbw_gbps is not None and math.isfinite(result.avg_busbw_gbps)
    assert not result.truncated and len(result.rows) == ROWS


def test_root_minus_one_and_na_wrong_stay_legal() -> None:
    """root -1 (no root) and #wrong N/A (validation off) are what nccl-tests prints, not bad values."""
    tokens = LINES[LARGEST - 1].split()
    tokens[8] = tokens[12] = "N/A"
    result = parse_nccl(_with(LARGEST, "  ".join(tokens)))
    assert result.invalid == [] and len(result.rows) == ROWS
    assert result.rows[-1].root == -1 and result.rows[-1].out_of_place.wrong is None
