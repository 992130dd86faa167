"""Go's ``Regexp.Expand``, the replacement syntax ``label_replace`` and ``reReplaceAll`` share."""

from __future__ import annotations

import re

import pytest

from agent.gocompat.regex import expand

_ADDR = re.compile(r"(?P<host>[^:]+):(\d+)")


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("$1", "db-1"),
        ("${2}x", "9100x"),
        ("${host}:$2", "db-1:9100"),
        ("$host-$$", "db-1-$"),
        ("$0", "db-1:9100"),
        ("plain", "plain"),
    ],
)
def test_references_expand_to_group_text(template: str, want: str) -> None:
    """``$n``, ``${n}``, ``$name``, ``${name}`` are the group's text and ``$$`` is a dollar."""
    m = _ADDR.fullmatch("db-1:9100")
    assert m is not None
    assert expand(template, m) == want


@pytest.mark.parametrize(
    ("template", "want"),
    [
        ("$2x", ""),  # the name is "2x", not group 2 then "x"
        ("$9", ""),  # no group 9
        ("$01", ""),  # a leading zero is not a number, and no group is named "01"
        ("${nope}!", "!"),
    ],
)
def test_unknown_groups_expand_to_nothing(template: str, want: str) -> None:
    """A reference to a group the regexp lacks expands to the empty string, as in Go."""
    m = _ADDR.fullmatch("db-1:9100")
    assert m is not None
    assert expand(template, m) == want


@pytest.mark.parametrize("template", ["$", "${", "a$-b", "${}"])
def test_dollar_that_starts_no_reference_stays(template: str) -> None:
    """A ``$`` not followed by a name, ``{name}`` or ``$`` is copied as it is."""
    m = _ADDR.fullmatch("db-1:9100")
    assert m is not None
    assert expand(template, m) == template


def test_group_that_did_not_take_part_is_empty() -> None:
    """A group outside the matched alternative expands to nothing."""
    m = re.fullmatch(r"(a)|(b)", "b")
    assert m is not None
    assert expand("[$1][$2]", m) == "[][b]"
