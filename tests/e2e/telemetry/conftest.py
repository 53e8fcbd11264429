"""Fixtures of the telemetry pipeline's tests: brokers whose logs the pipeline reads."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.storage import StorageConfig
from tests.e2e.sources.conftest import EdgeBroker


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[dict[str, EdgeBroker]]:
    """Two brokers' logs and offsets APIs; edge2's small segments let retention delete records at once."""
    started = {
        "edge1": EdgeBroker(tmp_path / "edge1"),
        "edge2": EdgeBroker(tmp_path / "edge2", StorageConfig(group_commit_ms=1, segment_bytes=2048)),
    }
    yield started
    for broker in started.values():
        broker.close()
