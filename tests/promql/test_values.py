"""The label operations operators share: group keys and match signatures."""

from __future__ import annotations

import pytest

from agent.promql.values import group_keys
from agent.series import Labels

LABELS: Labels = (("__name__", "m"), ("a", "1"), ("b", "2"), ("c", "3"))


@pytest.mark.parametrize(
    ("without", "names", "want"),
    [
        (False, ("b",), (("b", "2"),)),
        (False, ("a", "c"), (("a", "1"), ("c", "3"))),
        (False, ("z",), ()),
        (False, (), ()),
        (True, ("b",), (("a", "1"), ("c", "3"))),
        (True, ("b", "z"), (("a", "1"), ("c", "3"))),
        (True, (), (("a", "1"), ("b", "2"), ("c", "3"))),
    ],
)
def test_group_key(without: bool, names: tuple[str, ...], want: Labels) -> None:
    """``by``/``on`` keep only the names; ``without``/``ignoring`` drop them and ``__name__``."""
    assert group_keys(without, names)[LABELS] == want


def test_name_not_first_is_dropped_too() -> None:
    """``__name__`` is dropped wherever it sorts (an upper-case label sorts before it)."""
    labels: Labels = (("Z", "1"), ("__name__", "m"), ("a", "2"))
    assert group_keys(True, ())[labels] == (("Z", "1"), ("a", "2"))


def test_memo_is_shared_and_returns_the_same_key_object() -> None:
    """One memo per grouping: asking twice gives the same memo and the same key object."""
    keys = group_keys(False, ("a", "b"))
    assert group_keys(False, ("a", "b")) is keys
    first = keys[LABELS]
    assert keys[tuple(LABELS)] is first
