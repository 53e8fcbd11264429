"""Shared reads: readers catching up on the same older range are served from one disk read per block.

A spy counts the preads of segment files (the real read still happens), so the tests see exactly how
often the disk was asked, not just that the answers were right. The windows written last are not kept in
memory here (`tail_cache_total_bytes: 0`), so that every read the cache does not serve goes to the disk.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.storage import CorruptRecord, LogStore, StorageConfig
from broker_edge.storage.file_pool import FileHandlePool
from broker_edge.storage.read_cache import BLOCK_RECORDS, cache_cost
from tests.unit.broker_edge.storage.log_helpers import (
    assert_matches,
    entry_positions,
    flip_byte,
    make_record,
    partition_segments,
)

TOPIC = "plant/line-1/temp"


class SegmentReadSpy:
    """Counts preads of `.log` files through the descriptor pool."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        real = FileHandlePool.pread

        def spying(pool: FileHandlePool, path: str, size: int, position: int) -> bytes:
            if path.endswith(".log"):
                self.reads += 1
            return real(pool, path, size, position)

        monkeypatch.setattr(FileHandlePool, "pread", spying)


def _store(directory: Path, count: int, **settings) -> LogStore:
    settings = {"tail_cache_total_bytes": 0, "segment_bytes": 64 * 1024, "retention_ms": None, **settings}
    store = LogStore(directory, StorageConfig(**settings))
    store.open()
    for number in range(count):
        store.append(TOPIC, make_record(number))
    store.flush()
    return store


def _replay(store: LogStore, start: int, stop: int, batch: int) -> list:
    """What a subscriber with an in-flight window of `batch` reads, from `start` to `stop`."""
    records: list = []
    offset = start
    while offset < stop:
        got = store.read(TOPIC, offset, max_records=min(batch, stop - offset))
        records += got
        offset += len(got)
    return records


def test_fifty_readers_of_one_range_read_each_block_from_disk_once(tmp_path: Path, monkeypatch):
    count = 3 * BLOCK_RECORDS + 40
    store = _store(tmp_path, count)
    spy = SegmentReadSpy(monkeypatch)

    replays = [_replay(store, 0, 3 * BLOCK_RECORDS, batch=20) for _ in range(50)]

    assert spy.reads <= 3 + store.log_info(TOPIC).bytes // (64 * 1024) + 1  # a block spanning 2 segments
    assert store.read_cache.fills == 3
    for records in replays:
        assert [record.offset for record in records] == list(range(3 * BLOCK_RECORDS))
    assert all(a is b for a, b in zip(replays[0], replays[49], strict=True))  # the same objects
    for number in (0, 255, 256, 700):
        assert_matches(replays[17][number], number)
    store.close()


def test_without_the_read_cache_every_reader_reads_the_disk(tmp_path: Path, monkeypatch):
    store = _store(tmp_path, 2 * BLOCK_RECORDS, read_cache_bytes=0)
    spy = SegmentReadSpy(monkeypatch)

    for _ in range(5):
        _replay(store, 0, BLOCK_RECORDS, batch=32)

    assert spy.reads >= 5 * BLOCK_RECORDS // 32
    store.close()


def test_the_block_at_the_log_end_is_shared_and_grows_with_the_log(tmp_path: Path, monkeypatch):
    store = _store(tmp_path, BLOCK_RECORDS - 10)
    spy = SegmentReadSpy(monkeypatch)

    for _ in range(3):
        _replay(store, 0, 100, batch=50)

    assert (store.read_cache.fills, spy.reads) == (1, 1)
    for number in range(BLOCK_RECORDS - 10, BLOCK_RECORDS + 30):
        store.append(TOPIC, make_record(number))
    store.flush()
    replays = [_replay(store, 0, BLOCK_RECORDS + 30, batch=64) for _ in range(3)]

    assert store.read_cache.fills == 3  # block 0 grew by its last 10 records, block 1 was read once
    assert spy.reads == 3
    for records in replays:
        assert [record.offset for record in records] == list(range(BLOCK_RECORDS + 30))
    assert_matches(replays[2][BLOCK_RECORDS - 1], BLOCK_RECORDS - 1)
    assert_matches(replays[1][BLOCK_RECORDS + 3], BLOCK_RECORDS + 3)
    store.close()


def test_the_byte_budget_drops_the_least_recently_used_blocks(tmp_path: Path):
    count = 4 * BLOCK_RECORDS + 1
    store = _store(tmp_path, count)
    block_cost = max(  # blocks differ a little: records carry different optional fields
        cache_cost(
            sum(record.size for record in store.read(TOPIC, block * BLOCK_RECORDS, BLOCK_RECORDS, 10**9)),
            BLOCK_RECORDS,
        )
        for block in range(4)
    )
    store.close()
    store = _store(tmp_path / "again", count, read_cache_bytes=2 * block_cost + 100)

    for number in range(4):
        store.read(TOPIC, number * BLOCK_RECORDS, 10)
    store.read(TOPIC, 3 * BLOCK_RECORDS, 10)

    cache = store.read_cache
    assert (len(cache), cache.fills) == (2, 4)
    assert cache.bytes <= cache.max_bytes
    first = store.read(TOPIC, 0, 5)
    assert cache.fills == 5  # block 0 had been dropped: read again
    assert [record.offset for record in first] == list(range(5))
    store.close()


def test_a_damaged_record_is_never_served_from_a_shared_block(tmp_path: Path):
    store = _store(tmp_path, 2 * BLOCK_RECORDS + 5, segment_bytes=1 << 20)
    store.close()
    segment = partition_segments(tmp_path)[0]
    damaged = 100
    flip_byte(segment, entry_positions(segment)[damaged] + 8 + 20)
    store = LogStore(tmp_path, StorageConfig(tail_cache_total_bytes=0, retention_ms=None))
    store.open()

    before = _replay(store, 0, damaged, batch=30)
    with pytest.raises(CorruptRecord) as caught:
        store.read(TOPIC, damaged, 10)
    after = _replay(store, damaged + 1, 2 * BLOCK_RECORDS, batch=30)
    with pytest.raises(CorruptRecord):
        store.read(TOPIC, damaged, 10)  # also once the block is in memory

    assert caught.value.next_offset == damaged + 1
    assert [record.offset for record in before] == list(range(damaged))
    assert [record.offset for record in after] == list(range(damaged + 1, 2 * BLOCK_RECORDS))
    assert_matches(after[0], damaged + 1)
    store.close()


def test_retention_drops_the_blocks_below_the_new_start(tmp_path: Path):
    store = _store(tmp_path, 4 * BLOCK_RECORDS + 1, segment_bytes=16 * 1024, retention_bytes=60_000)
    for number in range(4):
        store.read(TOPIC, number * BLOCK_RECORDS, 10)
    assert len(store.read_cache) == 4

    store.apply_retention()

    start = store.log_info(TOPIC).start_offset
    assert start > BLOCK_RECORDS
    assert len(store.read_cache) == 4 - start // BLOCK_RECORDS
    assert store.read(TOPIC, start, 1)[0].offset == start
    store.close()
    assert len(store.read_cache) == 0
