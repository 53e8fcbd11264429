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
