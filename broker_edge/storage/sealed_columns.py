"""A segment's row columns as numpy arrays, from which the sealer gathers the segment's index entries.

`sealed_index.build` reads a topic's entries from its rows' positions and times. `SegmentColumns` gathers
those of every regular topic of a segment (no marker, cut row or gap in its offsets) with a few array
operations for the whole segment, where the pure-Python path costs calls per topic and per chunk of rows
(with a topic per device, a segment holds tens of thousands of topics of a few rows each); the bytes are
the same either way (the unit tests compare them). numpy is the `arrow` extra's: without it `build` takes
the pure-Python path.

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

    def gather(self, groups: Sequence[Sequence[int]]) -> tuple[bytes, list[int]]:
        """The entries of the rows of every group, group after group (u32 position | u32 size, then i64
        index time, each row's 16 bytes as the sealed index holds them), and each group's bytes of entries
        (headers and frames). A group is a list of row numbers or a busy topic's array of them, in the order
        of their offsets."""
        if not groups:
            return b"", []
        counts = [len(group) for group in groups]
        pieces: list[np.ndarray] = []
        listed: list[int] = []  # the rows of consecutive lists, converted at once: a call per list costs more
        for group in groups:
            if isinstance(group, array):
                if listed:
                    pieces.append(np.array(listed, dtype=np.intp))
                    listed = []
                pieces.append(np.frombuffer(group.tobytes(), dtype=np.uint32).astype(np.intp))
            else:
                listed += group
        pieces.append(np.array(listed, dtype=np.intp))
        taken = np.concatenate(pieces)
        starts = self.bounds[taken]
        sizes = self.bounds[taken + 1] - starts
        chunk = np.empty(2 * len(taken), dtype=np.int64)
        chunk[0::2] = starts | (sizes << 32)
        chunk[1::2] = self.times[taken]
        firsts = np.cumsum([0, *counts[:-1]])  # every group has a row
        return chunk.tobytes(), np.add.reduceat(sizes, firsts).tolist()
