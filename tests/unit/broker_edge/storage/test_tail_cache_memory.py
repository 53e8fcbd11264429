"""The tail caches' budget counts what the cached records hold in memory, not only their frame bytes."""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

import pytest

from broker_edge.storage import CommitLog, LogConfig
from broker_edge.storage.tail_cache import TailCacheBudget
from tests.unit.broker_edge.storage.log_helpers import BASE_TIME_MS

RECORDS = 20_000


def _append(log: CommitLog, payload_bytes: int, batched: bool) -> None:
    if batched:
        for first in range(0, RECORDS, 10):
            batch = [
                (os.urandom(payload_bytes), 1, False, "device-00012", (), None, None, None, None, None)
                for _ in range(10)
            ]
            log.append_batch(batch, timestamp_ms=BASE_TIME_MS + first)
    else:
        for number in range(RECORDS):
            log.append_message(
                os.urandom(payload_bytes), 1, False, "device-00012", timestamp_ms=BASE_TIME_MS + number
            )


@pytest.mark.parametrize("payload_bytes", [16, 120, 1000])
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("read", [False, True])
def test_the_accounted_size_tracks_traced_memory(
    tmp_path: Path, payload_bytes: int, batched: bool, read: bool
):
    budget = TailCacheBudget(2**40)
    config = LogConfig(tail_cache_records=10**6, tail_cache_bytes=2**40, retention_ms=None, segment_ms=None)
    log = CommitLog("t", tmp_path, config, cache_budget=budget)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    _append(log, payload_bytes, batched)
    log.flush(sync=False)
    if read:  # every cached record becomes a `Record`
        assert len(log.read(0, max_records=RECORDS, max_bytes=2**40)) == RECORDS
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    assert len(log.tail_cache) == RECORDS
    assert budget.bytes == log.tail_cache.cost
    assert 0.8 < budget.bytes / traced < 1.25, f"accounted {budget.bytes:,}, traced {traced:,}"
    assert budget.bytes > 1.5 * log.tail_cache.bytes  # far from the frame bytes alone
    log.close()
    assert budget.bytes == 0
