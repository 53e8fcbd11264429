"""What a broker's logs can hold as numbers: integers only, within the bounds, shown briefly when refused."""

from __future__ import annotations

import re

import pytest

from broker_edge import bounds
from broker_edge.bounds import MAX_OFFSET, OutOfBounds


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (1.0, "got 1.0"),
        (True, "got True"),
        ("7", "got '7'"),
        (None, "got None"),
        (float("inf"), "got inf"),
        (float("nan"), "got nan"),
        ([1], "got [1]"),
    ],
)
def test_anything_but_an_integer_is_refused_naming_the_field(value: object, shown: str) -> None:
    with pytest.raises(OutOfBounds, match="^" + re.escape(f"first must be an integer, {shown}")):
        bounds.offset(value, "first")


def test_offsets_end_at_the_ceiling_and_spans_may_not_pass_it() -> None:
    assert bounds.offset(0, "o") == 0 and bounds.offset(MAX_OFFSET, "o") == MAX_OFFSET
    for value in (-1, MAX_OFFSET + 1, 2**63 - 1):
        with pytest.raises(OutOfBounds, match=rf"o must be within \[0, {MAX_OFFSET}\]"):
            bounds.offset(value, "o")
    bounds.offset_span(MAX_OFFSET - 2, 2, "t")
    with pytest.raises(OutOfBounds, match=f"t: 3 records from offset {MAX_OFFSET - 2} end past {MAX_OFFSET}"):
        bounds.offset_span(MAX_OFFSET - 2, 3, "t")
    assert bounds.count(1, "c", 1) == 1 and bounds.size(10, "s", 1, 64) == 10
    with pytest.raises(OutOfBounds, match=r"s must be within \[1, 64\]"):
        bounds.size(65, "s", 1, 64)


def test_a_refused_number_is_shown_briefly_however_large() -> None:
    with pytest.raises(OutOfBounds) as refused:
        bounds.offset(10**5000, "first")
    assert str(refused.value) == f"first must be within [0, {MAX_OFFSET}], got an integer of 16610 bits"
    assert bounds.shown("x" * 100) == "'" + "x" * 39 + "..."
