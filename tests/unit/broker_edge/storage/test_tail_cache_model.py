"""A property test of the tail cache: whatever is appended and asked for, it holds the newest records
within its bounds and a slice is exactly the records a plain list would give within the byte budget."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from broker_edge.storage.tail_cache import TailCache, TailCacheBudget, cache_cost


def _entry(offset: int, size: int) -> tuple:
    frame = bytes([offset % 251]) * size
    return (offset, frame, (frame[:1], 1, False, "c", [], None, None, None, None, None))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 120), min_size=1, max_size=300),
    max_records=st.integers(1, 40),
    max_bytes=st.integers(1, 2000),
    reads=st.lists(st.tuples(st.integers(0, 400), st.integers(1, 50), st.integers(1, 3000)), max_size=20),
)
def test_the_cache_matches_a_list_of_the_newest_records(sizes, max_records, max_bytes, reads):
    budget = TailCacheBudget(10**9)
    cache = TailCache(max_records, max_bytes, 0, budget)
    appended: list[int] = []
    for offset, size in enumerate(sizes):
        cache.add(_entry(offset, size), size)
        appended.append(size)
        kept = len(cache)
        first = cache.first_offset
        assert first == len(appended) - kept
        assert cache.bytes == sum(appended[first:])
        assert budget.bytes == cache.cost == cache_cost(cache.bytes, kept)
        assert kept >= 1 and kept <= max(max_records, 1)
        assert cache.bytes <= max_bytes or kept == 1
        for start, count, budget_bytes in [(0, kept, max_bytes), *reads]:  # the oldest, then random
            offset_asked = first + start % kept
            stop = min(len(appended), offset_asked + count)
            got = cache.slice(offset_asked, stop, budget_bytes)
            expected: list[int] = []
            used = 0
            for wanted in range(offset_asked, stop):
                used += appended[wanted]
                if used > budget_bytes and expected:
                    break
                expected.append(wanted)
                if used > budget_bytes:
                    break
            assert [record.offset for record in got] == expected
            assert all(len(record.frame) == appended[record.offset] for record in got)
