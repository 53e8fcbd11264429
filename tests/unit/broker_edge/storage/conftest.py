"""Fixtures of the storage tests: small segments, and a flushed store whose topics span several of them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig
from tests.unit.broker_edge.storage.log_helpers import make_record

FILLED_TOPIC = "plant/line-1/temp"


@pytest.fixture
def small_segments() -> StorageConfig:
    """Segments of ~4 KiB so a few dozen records span several segments."""
    return StorageConfig(segment_bytes=4096, retention_ms=None, index_checkpoint_bytes=1024)


@pytest.fixture
def filled_store(tmp_path: Path, small_segments: StorageConfig) -> Iterator[LogStore]:
    """A flushed store whose topic `FILLED_TOPIC` holds 200 records over several segments, interleaved with
    another topic's."""
    store = LogStore(tmp_path / "data", small_segments)
    store.open()
    for number in range(200):
        store.append(FILLED_TOPIC, make_record(number))
        store.append("plant/line-2/temp", make_record(number + 1000))
    store.flush()
    yield store
    store.close()
