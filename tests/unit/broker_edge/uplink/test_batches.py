"""The next batch: topics in turn, so a backlog never holds back the others; a batch stays short in topics."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.uplink import batches
from broker_edge.uplink.batches import MAX_TOPICS, next_batch
from tests.unit.broker_edge.storage.log_helpers import make_record


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LogStore]:
    with LogStore(tmp_path / "site", StorageConfig(durability="none")) as opened:
        yield opened


def no_gap(topic: str, position: int, start: int) -> None:
    raise AssertionError(f"no gap expected in {topic}")


def test_a_live_topic_goes_in_the_first_batch_beside_a_long_backlog(store: LogStore) -> None:
    for n in range(600):
        store.append("backlog/topic", make_record(n, payload_size=2000))
    store.append("live/topic", make_record(0))
    store.flush()
    pending = collections.OrderedDict.fromkeys(["backlog/topic", "live/topic"])
    positions: dict[str, int] = {}

    batch = next_batch(store, 0, positions, pending, 1_048_576, no_gap)

    assert batch is not None
    assert [(part.topic, part.first) for part in batch.topics] == [("backlog/topic", 0), ("live/topic", 0)]
    assert batch.topics[0].count < 600 and positions["backlog/topic"] == batch.topics[0].count
    assert list(pending) == [
        "backlog/topic"
    ]  # the live topic is sent up to its end; the backlog waits its turn
    sizes = sum(part.size for part in batch.topics)
    assert sizes == len(batch.frames) <= 1_048_576 + 2100


def test_a_fleet_of_topics_goes_in_batches_of_at_most_max_topics(
    store: LogStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert MAX_TOPICS == 256
    monkeypatch.setattr(batches, "MAX_TOPICS", 4)
    topics = [f"devices/d{n}/telemetry" for n in range(10)]
    for n, topic in enumerate(topics):
        store.append(topic, make_record(n))
    store.flush()
    pending = collections.OrderedDict.fromkeys(topics)
    positions: dict[str, int] = {}
    counts = []
    while (batch := next_batch(store, 0, positions, pending, 1_048_576, no_gap)) is not None:
        counts.append(len(batch.topics))
    assert counts == [4, 4, 2]
    assert positions == dict.fromkeys(topics, 1)


def test_nothing_to_send_is_no_batch(store: LogStore) -> None:
    store.append("a", make_record(0))
    store.flush()
    assert next_batch(store, 0, {"a": 1}, collections.OrderedDict.fromkeys(["a"]), 1000, no_gap) is None


def test_records_missing_in_the_log_are_a_gap_stepped_over_not_a_topic_held_back(
    store: LogStore, tmp_path: Path
) -> None:
    store.append("a", make_record(0))
    with LogStore(tmp_path / "source", StorageConfig(durability="none")) as source:
        source.replicated_log.restart_at("a", 5)
        source.append("a", make_record(5))
        source.flush()
        store.replicated_log.append_at(
            "a", b"".join(source.replicated_log.read_frames("a", 5, 1 << 20)[0]), at=5
        )
    store.flush()
    gaps: list[tuple[str, int, int]] = []
    positions: dict[str, int] = {}
    pending = collections.OrderedDict.fromkeys(["a"])
    sent = []
    while (
        batch := next_batch(store, 0, positions, pending, 1000, lambda *gap: gaps.append(gap))
    ) is not None:
        sent += [(part.first, part.count) for part in batch.topics]
    assert sent == [(0, 1), (5, 1)] and gaps == [("a", 1, 5)] and positions == {"a": 6}
