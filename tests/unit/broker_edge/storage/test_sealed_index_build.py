"""The sealed index made from a segment's rows: a topic's entries read column by column from its chain of
rows give the same file as walking every row one by one, whatever the segment holds (busy and quiet
topics, markers, cut rows, offsets with gaps, a chain that misses rows), and the entries gathered with
numpy the same as without it."""

from __future__ import annotations

import random

import pytest

from broker_edge.storage import sealed_index
from broker_edge.storage.active_index import HOT, NO_PREVIOUS, ActiveIndex, pointer
from broker_edge.storage.entry import RESTART, TRUNCATE
from broker_edge.storage.sealed_index import MISSING, SORT_CHUNK, build

RECORD = 90
"""Bytes of each made-up entry."""


class SegmentRows:
    """An `ActiveIndex` filled the way a partition log fills it: each topic's rows chained in log order."""

    def __init__(self) -> None:
        self.rows = ActiveIndex()
        self.size = 0
        self._last: dict[int, int] = {}
        self._count: dict[int, int] = {}
        self._next: dict[int, int] = {}

    def append(
        self, topic_id: int, count: int = 1, time: int = 1_000, skip: int = 0, unchained: bool = False
    ) -> None:
        """``count`` records of the topic; ``skip`` offsets before them are missing (lost to damage);
        ``unchained``: their first row does not point at the topic's row before it."""
        offset = self._next.get(topic_id, 0) + skip
        positions = [self.size + RECORD * index for index in range(count)]
        self.size += RECORD * count
        prev = self._last.get(topic_id, pointer(3, 7) if topic_id % 2 else NO_PREVIOUS)
        if unchained:
            prev = NO_PREVIOUS
        self._last[topic_id] = self.rows.add_rows(
            topic_id, positions, offset, time, prev, self._count.get(topic_id, 0)
        )
        self._count[topic_id] = self._count.get(topic_id, 0) + count
        self._next[topic_id] = offset + count

    def marker(self, topic_id: int, kind: int, offset: int, dropped: int = 0) -> None:
        prev = self._last.get(topic_id, NO_PREVIOUS)
        self._last[topic_id] = self.rows.add_marker(topic_id, self.size, offset, kind, dropped, prev)
        self.size += RECORD
        if kind == RESTART:
            self._next[topic_id] = offset
            self._count[topic_id] = 0

    def data(self) -> bytes:
        return build(self.rows, 5, 4096, self.size).data

    def walked(self) -> bytes:
        return build(self.rows, 5, 4096, self.size, walk_all=True).data


def interleaved(topics: int, records: int, per_append: int, seed: int) -> SegmentRows:
    segment = SegmentRows()
    chosen = random.Random(seed)
    while len(segment.rows) < records:
        segment.append(chosen.randrange(topics), per_append, time=chosen.randrange(10**6))
    return segment


@pytest.mark.parametrize(
    ("topics", "records", "per_append"),
    [
        (1, 3 * SORT_CHUNK + 5, 16),  # one busy topic over several chunks
        (1, SORT_CHUNK + 1, 1),  # a busy topic whose last chunk is one row
        (8, 2 * SORT_CHUNK, 8),  # fan-in: a few busy topics, appended in runs
        (3_000, 2 * SORT_CHUNK, 1),  # a topic per device: quiet topics, chained rows only
        (400, 20_000, 3),  # topics on both sides of HOT
    ],
)
def test_column_entries_match_walked_rows(topics: int, records: int, per_append: int) -> None:
    segment = interleaved(topics, records, per_append, seed=topics)
    assert any(len(hot) >= HOT for hot in segment.rows.hot.values()) or topics == 3_000
    assert segment.data() == segment.walked()


def test_markers_cut_rows_and_gaps_are_walked_like_before() -> None:
    segment = interleaved(50, 5_000, 2, seed=1)
    segment.append(7, 3, skip=4)  # a gap: offsets lost to damage stay MISSING
    segment.marker(11, RESTART, 0)
    segment.append(11, 40)
    segment.marker(12, TRUNCATE, 2, dropped=300)
    segment.append(12, 2)
    segment.rows.kill(13, [row for row, topic in enumerate(segment.rows.topic_ids) if topic == 13][:5])
    assert segment.data() == segment.walked()
    entries = build(segment.rows, 5, 4096, segment.size).data
    assert MISSING.to_bytes(4, "little") in entries


def test_a_chain_that_misses_rows_falls_back_to_sorting_every_row() -> None:
    segment = interleaved(500, 2_000, 1, seed=2)  # quiet topics: their rows come from their chains
    segment.append(3, unchained=True)  # a row of topic 3 its chain does not reach back from
    assert segment.data() == segment.walked()
    rows_of_3 = sum(1 for topic in segment.rows.topic_ids if topic == 3)
    assert build(segment.rows, 5, 4096, segment.size).groups[3].count == rows_of_3


@pytest.mark.parametrize(
    ("topics", "records", "per_append"),
    [
        (1, SORT_CHUNK + 5, 5),  # one busy topic over two chunks of the pure-Python path
        (8, 2 * SORT_CHUNK, 8),  # fan-in
        (1_000, 40_000, 1),  # a fleet's segment: about 40 rows a topic, busy and quiet ones
        (3_000, SORT_CHUNK, 1),  # a wide fleet's: about 5 rows a topic (walked without numpy)
    ],
)
def test_topics_gathered_with_numpy_give_the_file_the_pure_python_path_gives(
    monkeypatch: pytest.MonkeyPatch, topics: int, records: int, per_append: int
) -> None:
    segment = interleaved(topics, records, per_append, seed=3)
    segment.append(7, 3, skip=4)  # a gap, and a marker: topics walked either way
    segment.marker(11, TRUNCATE, 0, dropped=90)
    assert sealed_index._columns(segment.rows, segment.size) is not None
    with_numpy = segment.data()
    monkeypatch.setattr(sealed_index, "_columns", lambda rows, data_size: None)  # as without numpy
    assert segment.data() == with_numpy
