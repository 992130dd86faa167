"""The label operations operators share: group keys and match signatures, and the
bounded memo tables an engine keeps them in."""

from __future__ import annotations

import pytest

from agent.errors import PromQLError
from agent.promql.values import Memos
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
    assert Memos().group_keys(without, names)[LABELS] == want


def test_name_not_first_is_dropped_too() -> None:
    """``__name__`` is dropped wherever it sorts (an upper-case label sorts before it)."""
    labels: Labels = (("Z", "1"), ("__name__", "m"), ("a", "2"))
    assert Memos().group_keys(True, ())[labels] == (("Z", "1"), ("a", "2"))


def test_memo_is_shared_and_returns_the_same_key_object() -> None:
    """One memo per grouping in a Memos: asking twice gives the same memo and the same key object."""
    memos = Memos()
    keys = memos.group_keys(False, ("a", "b"))
    assert memos.group_keys(False, ("a", "b")) is keys
    first = keys[LABELS]
    assert keys[tuple(LABELS)] is first


def _labels(n: int) -> Labels:
    return (("__name__", "m"), ("i", str(n)), ("job", str(n % 3)))


def test_two_memos_share_no_table() -> None:
    """Each Memos has its own tables: an entry made in one is not in the other."""
    one, other = Memos(), Memos()
    one.group_keys(False, ("job",))[LABELS]
    assert other.group_keys(False, ("job",)) is not one.group_keys(False, ("job",))
    assert (len(one), len(other)) == (1, 0)


def test_entries_stay_within_the_limit_over_all_tables() -> None:
    """However many distinct label sets pass through, the tables together hold at most ``limit`` entries."""
    memos = Memos(limit=50)
    for n in range(10_000):
        memos.group_keys(False, ("job",))[_labels(n)]
        memos.group_keys(True, ())[_labels(n)]
        memos.of(len)[_labels(n)]
        assert len(memos) <= memos.size <= 50


def test_tables_stay_within_their_limit() -> None:
    """A stream of distinct groupings keeps at most ``tables`` tables."""
    memos = Memos(tables=4)
    for n in range(100):
        memos.group_keys(False, (f"l{n}",))[LABELS]
        assert memos.tables <= 4
    assert len(memos) <= 4


def test_a_held_table_works_after_the_memos_are_cleared() -> None:
    """A table emptied while an operator holds it still answers, and counts its refill."""
    memos = Memos(limit=2)
    keys = memos.group_keys(False, ("job",))
    want = [keys[_labels(n)] for n in range(10)]
    assert [keys[_labels(n)] for n in range(10)] == want
    assert len(memos) <= 2
    memos.clear()
    assert (len(memos), memos.size) == (0, 0)
    assert keys[_labels(4)] == (("job", "1"),)


def test_of_memoises_a_function_by_identity() -> None:
    """``of(fn)`` is one table per function, calling it once per key."""
    calls: list[str] = []

    def shout(s: str) -> str:
        calls.append(s)
        return s.upper()

    memos = Memos()
    assert memos.of(shout) is memos.of(shout)
    assert [memos.of(shout)[w] for w in ("a", "b", "a")] == ["A", "B", "A"]
    assert calls == ["a", "b"]


@pytest.mark.parametrize(("limit", "tables"), [(0, 1), (1, 0)])
def test_limits_must_be_positive(limit: int, tables: int) -> None:
    """A memo that could hold nothing is refused."""
    with pytest.raises(PromQLError):
        Memos(limit, tables)
