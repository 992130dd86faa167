"""The shared data model: label-name validity."""

from __future__ import annotations

import pytest

from agent.series import is_label_name


@pytest.mark.parametrize("name", ["a", "_", "__name__", "model_name", "A1_b"])
def test_valid_label_names(name: str) -> None:
    """Names of ASCII letters, digits and ``_`` not starting with a digit are valid."""
    assert is_label_name(name)


@pytest.mark.parametrize("name", ["", "1a", "a-b", "a:b", "a b", "é", "a\n", "\ta"])
def test_invalid_label_names(name: str) -> None:
    """Empty names, a leading digit, other characters (a trailing newline too) are invalid."""
    assert not is_label_name(name)
