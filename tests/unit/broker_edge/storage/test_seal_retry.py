"""A seal that outlasts the sealer's patience on a full disk is not given up until the next start: it and the
later seals of its partition wait, in order, and are tried again at each retention pass, so a broker whose
disk had space again seals (and can delete) those segments while it runs.

The sealed indexes' writes meet ENOSPC while the "disk" is full (``write_index`` raises it, as the kernel
would); the real write runs otherwise.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage import sealer as sealer_module
from broker_edge.storage.segment import SEALED
from tests.unit.broker_edge.storage.log_helpers import BASE_TIME_MS, make_record

TOPIC = "site/gateway-3/temp"
OTHER = "site/gateway-4/temp"
RECORDS = 300


class FullIndexDisk:
    """Sealed indexes cannot be written while ``full``, or only the first one when ``first_only``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, first_only: bool = False) -> None:
        self.full = True
        self.refused: set[str] = set()
        real = sealer_module.write_index

        def write_index(path: str, data, sync: bool = True) -> None:
            if self.full and (not first_only or not self.refused or path in self.refused):
                self.refused.add(path)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            real(path, data, sync)

        monkeypatch.setattr(sealer_module, "write_index", write_index)
        monkeypatch.setattr(sealer_module, "SHORTAGE_PATIENCE_S", 0.05)


def _config() -> StorageConfig:
    return StorageConfig(partitions=1, segment_bytes=4096, retention_ms=None)


def _records(store: LogStore, topic: str) -> list[tuple[int, bytes]]:
    return [(r.offset, r.payload) for r in store.read(topic, 0, max_records=10 * RECORDS, max_bytes=1 << 24)]


def _expected(numbers: range) -> list[tuple[int, bytes]]:
    return [(offset, make_record(n).payload) for offset, n in enumerate(numbers)]


async def _fill(store: LogStore) -> None:
    for number in range(RECORDS):
        store.append(TOPIC if number % 2 else OTHER, make_record(number))
    await store.wait_durable()
    assert store._sealer is not None
    store._sealer.wait_idle()


@pytest.mark.parametrize("first_only", [True, False], ids=["the first seal", "every seal"])
def test_seals_given_up_on_a_full_disk_wait_in_order_and_are_made_at_a_pass_once_there_is_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, first_only: bool
):
    disk = FullIndexDisk(monkeypatch, first_only)
    store = LogStore(tmp_path, _config())
    store.open()

    async def scenario() -> None:
        with caplog.at_level(logging.ERROR, logger=sealer_module.__name__):
            await _fill(store)
        rolled = store._partitions[0].segments[:-1]
        assert len(rolled) > 3
        assert not any(segment.state == SEALED for segment in rolled), "none sealed past the one held"
        assert _records(store, TOPIC) == _expected(range(1, RECORDS, 2))  # served from memory meanwhile
        assert "tried again at the next retention pass" in caplog.text

        disk.full = False
        store.apply_retention(now_ms=BASE_TIME_MS)  # nothing past retention: only the held seals
        assert store._sealer is not None
        store._sealer.wait_idle()
        assert all(segment.state == SEALED for segment in rolled)
        assert store._sealer.seals == len(rolled) and not store._sealer.seals_held

    asyncio.run(scenario())
    assert _records(store, OTHER) == _expected(range(0, RECORDS, 2))
    store.close()

    reopened = LogStore(tmp_path, _config())
    report = reopened.open()
    assert report.clean_shutdown and report.indexes_rebuilt == 0
    assert _records(reopened, TOPIC) == _expected(range(1, RECORDS, 2))
    assert _records(reopened, OTHER) == _expected(range(0, RECORDS, 2))
    reopened.close()


def test_seals_still_held_at_close_leave_no_clean_shutdown_marker_and_the_next_start_seals_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    FullIndexDisk(monkeypatch)
    store = LogStore(tmp_path, _config())
    store.open()

    async def scenario() -> None:
        await _fill(store)
        assert store._sealer is not None and store._sealer.seals_held

    asyncio.run(scenario())
    store.close()  # the disk is still full: the held seals fail once more, the active segment's waits too
    monkeypatch.undo()

    reopened = LogStore(tmp_path, _config())
    report = reopened.open()
    assert not report.clean_shutdown
    assert _records(reopened, TOPIC) == _expected(range(1, RECORDS, 2))
    assert _records(reopened, OTHER) == _expected(range(0, RECORDS, 2))
    reopened.close()  # it sealed them at open
    last = LogStore(tmp_path, _config())
    assert last.open().clean_shutdown
    last.close()
