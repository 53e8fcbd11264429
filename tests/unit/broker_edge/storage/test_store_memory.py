"""What a topic costs in memory, and what the shared blocks hold against what they account.

A quiet topic (a device's, with a record now and then) must cost its name and a few columns, not an object
graph: tracemalloc measures what the store holds per topic with 20,000 of them, each holding a record in
the active segment, and again once that segment is sealed (after a restart). The shared blocks' budget
counts what their `Record`s hold (`cache_cost`), within a quarter of what tracemalloc sees.
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.read_cache import BLOCK_RECORDS
from tests.unit.broker_edge.storage.log_helpers import BASE_TIME_MS

TOPICS = 20_000
T = TypeVar("T")
NAME = "devices/{:06d}/telemetry"  # 24 characters, as fleets name them


def _traced(action: Callable[[], T]) -> tuple[int, T]:
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    result = action()
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return traced, result


def test_a_quiet_topic_costs_a_few_hundred_bytes(tmp_path: Path):
    config = StorageConfig(tail_cache_total_bytes=0, read_cache_bytes=0, durability="none")
    store = LogStore(tmp_path, config)
    store.open()
    fields = (b'{"t": 21.5}', 1, False, "device", (), None, None, None, None, None)

    def fill() -> None:
        for number in range(TOPICS):
            store.append_batch(NAME.format(number), [fields], BASE_TIME_MS)
        store.flush()

    active, _ = _traced(fill)
    store.close()
    reopened = LogStore(tmp_path, config)
    sealed, _ = _traced(reopened.open)

    assert len(reopened) == TOPICS
    # measured: 315 and 219 (its name 80, its columns and the sealer's 112, its id's slots, the listing
    # order's and the names' references); a dict from name to id made them 351 and 254
    assert active / TOPICS < 335, f"{active / TOPICS:.0f} bytes per topic with a record in the active segment"
    assert sealed / TOPICS < 240, f"{sealed / TOPICS:.0f} bytes per topic after a restart"
    reopened.close()


@pytest.mark.parametrize("payload_bytes", [16, 120, 1000])
def test_the_shared_blocks_account_what_their_records_hold(tmp_path: Path, payload_bytes: int):
    store = LogStore(tmp_path, StorageConfig(read_cache_bytes=2**40, tail_cache_total_bytes=0))
    store.open()
    count = 40 * BLOCK_RECORDS
    for first in range(0, count, 10):
        batch = [(os.urandom(payload_bytes), 1, False, "device-00012", (), None, None, None, None, None)] * 10
        store.append_batch("t", batch, timestamp_ms=BASE_TIME_MS + first)
    store.flush()

    def read_all() -> int:
        offset = 0
        while offset < count:
            offset += len(store.read("t", offset, max_records=BLOCK_RECORDS, max_bytes=2**40))
        return offset

    traced, read = _traced(read_all)

    cache = store.read_cache
    assert read == count and len(cache) == 40
    assert 0.75 < cache.bytes / traced < 1.25, f"accounted {cache.bytes:,}, traced {traced:,}"
    store.close()
    assert cache.bytes == 0
