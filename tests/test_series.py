"""The shared data model: label-name validity, timestamps as text."""

from __future__ import annotations

import pytest

from agent.series import is_label_name, iso_ms


@pytest.mark.parametrize("name", ["a", "_", "__name__", "model_name", "A1_b"])
def test_valid_label_names(name: str) -> None:
    """Names of ASCII letters, digits and ``_`` not starting with a digit are valid."""
    assert is_label_name(name)


@pytest.mark.parametrize("name", ["", "1a", "a-b", "a:b", "a b", "é", "a\n", "\ta"])
def test_invalid_label_names(name: str) -> None:
    """Empty names, a leading digit, other characters (a trailing newline too) are invalid."""
    assert not is_label_name(name)


def test_iso_ms_has_three_fraction_digits_in_utc() -> None:
    """Unix ms print as RFC 3339 UTC with exactly three fraction digits, as Prometheus' API does."""
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1_795_977_602_123) == "2026-11-29T18:40:02.123Z"
    assert iso_ms(1_795_977_602_007) == "2026-11-29T18:40:02.007Z"
