"""The duplicate rule of one device's rows, on numbers alone: what the state store's function decides."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from pipelines.telemetry.dedup import decode, duplicates, encode, recent

WINDOW = 600_000_000  # 600 s in microseconds
S = 1_000_000


def ints(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


NONE = ints()


def test_a_copy_within_the_window_is_a_duplicate_and_a_reused_id_after_it_is_not():
    flags = duplicates(ints(7, 7, 7, 8), ints(0, 600 * S, 1201 * S, 0), NONE, NONE, WINDOW)
    assert flags.tolist() == [False, True, False, False]


def test_each_copy_is_compared_with_the_one_before_it():
    """Copies 600 s apart in a chain are all one message, however long the chain."""
    flags = duplicates(ints(7, 7, 7), ints(0, 600 * S, 1200 * S), NONE, NONE, WINDOW)
    assert flags.tolist() == [False, True, True]


def test_a_stored_id_within_the_window_either_way_makes_a_duplicate():
    stored_ids, stored_us = ints(7, 9), ints(1000 * S, 0)
    flags = duplicates(
        ints(7, 7, 7, 9), ints(400 * S, 1600 * S, 2201 * S, 601 * S), stored_ids, stored_us, WINDOW
    )
    assert flags.tolist() == [True, True, False, False]


def test_only_ids_that_may_still_match_are_kept():
    ids, us = recent(ints(1, 2, 3), ints(0, 400 * S, 1000 * S), WINDOW)
    assert (ids.tolist(), us.tolist()) == ([2, 3], [400 * S, 1000 * S])
    assert recent(NONE, NONE, WINDOW)[0].size == 0


@given(st.lists(st.tuples(st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**62)), max_size=50))
def test_the_state_bytes_give_back_the_ids_and_times(pairs):
    ids = np.array([i for i, _ in pairs], dtype=np.int64)
    us = np.array([t for _, t in pairs], dtype=np.int64)
    got_ids, got_us = decode(encode(ids, us))
    assert got_ids.tolist() == ids.tolist() and got_us.tolist() == us.tolist()


def rule(ids: list[int], us: list[int], stored: list[tuple[int, int]], window: int) -> list[bool]:
    """The rule as a reader states it, row by row: a row repeats the row of its id just before it in the
    batch if at most ``window`` older, or a stored id within ``window`` either way."""
    flags = []
    for row, (message, time) in enumerate(zip(ids, us, strict=True)):
        before = [us[j] for j in range(row) if ids[j] == message]
        follows = bool(before) and time - before[-1] <= window
        known = any(i == message and abs(time - t) <= window for i, t in stored)
        flags.append(follows or known)
    return flags


@given(
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3000)), max_size=40),
    st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3000)), max_size=10),
)
def test_the_flags_are_the_rule_row_by_row(rows, stored):
    """Rows in the batch's order (event time first), ids and times drawn from small ranges so that copies,
    chains and stored matches are common; the window is 600 of these units."""
    rows = sorted(rows, key=lambda row: row[1])
    ids, us = [i for i, _ in rows], [t for _, t in rows]
    flags = duplicates(
        np.array(ids, dtype=np.int64),
        np.array(us, dtype=np.int64),
        np.array([i for i, _ in stored], dtype=np.int64),
        np.array([t for _, t in stored], dtype=np.int64),
        600,
    )
    assert flags.tolist() == rule(ids, us, stored, 600)
