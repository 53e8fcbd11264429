"""A segment's row columns as numpy arrays, from which the sealer gathers a busy topic's index entries.

`sealed_index.build` reads a topic's entries from its rows' positions and times. For a busy topic (a
fan-in's few topics hold every row of a segment) `SegmentColumns` gathers a chunk of them with a few array
operations, where the pure-Python path costs calls per row; the bytes are the same either way (the unit
tests compare them). numpy is the `arrow` extra's: without it `build` takes the pure-Python path.

The columns are copied (`array.tobytes`), never viewed: the sealer thread holds no buffer of an array the
event loop's side owns, which an append there would then fail on.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np

from .active_index import ActiveIndex

__all__ = ["SegmentColumns"]


class SegmentColumns:
    """Where each row of a segment starts and ends, and its index time."""

    __slots__ = ("bounds", "times")

    def __init__(self, rows: ActiveIndex, data_size: int) -> None:
        count = len(rows.positions)
        bounds = np.empty(count + 1, dtype=np.int64)
        bounds[:count] = np.frombuffer(rows.positions.tobytes(), dtype=np.uint32)
        bounds[count] = data_size  # the end of the last row's entry
        self.bounds = bounds
        """Row ``r``'s entry is ``bounds[r]`` up to ``bounds[r + 1]``."""
        self.times = np.frombuffer(rows.times.tobytes(), dtype=np.int64)

    def ends(self) -> array:
        """`bounds` as the array of 64-bit integers the pure-Python path reads."""
        ends = array("q")
        ends.frombytes(self.bounds.tobytes())
        return ends

    def add_entries(self, part: Sequence[int], entries: array) -> int:
        """Append the entries of the rows ``part`` (u32 position | u32 size, then i64 index time, as
        ``entries``' 64-bit integers); returns the bytes of their entries (headers and frames). ``part``
        is a list of row numbers or a busy topic's array of them."""
        if isinstance(part, array):
            taken = np.frombuffer(part.tobytes(), dtype=np.uint32).astype(np.intp)
        else:
            taken = np.array(part, dtype=np.intp)
        starts = self.bounds[taken]
        sizes = self.bounds[taken + 1] - starts
        chunk = np.empty(2 * len(taken), dtype=np.int64)
        chunk[0::2] = starts | (sizes << 32)
        chunk[1::2] = self.times[taken]
        entries.frombytes(chunk.tobytes())
        return int(sizes.sum())
