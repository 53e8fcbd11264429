"""The downlink's batch of logs a cluster hub's member holds no copy of: the stored frames read from the
member holding them, at their offsets, topics in turn, from the site's positions, gaps told."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, Record, StorageConfig
from broker_edge.uplink.batches_elsewhere import batch_elsewhere
from broker_edge.uplink.mirror import Gap, LocalMirrorLogs, apply_batch
from broker_edge.uplink.wire import Batch
from tests.unit.broker_edge.storage.log_helpers import make_record


class HeldElsewhere(LocalMirrorLogs):
    """The ``mirror_logs`` port of a member whose downlinked logs are all in ``holder`` (the store of the
    member holding them), read as ``read_committed`` reads them: from the log's start when the offset asked
    is below it."""

    def __init__(self, holder: LogStore) -> None:
        super().__init__(holder)
        self.holder = holder

    def holds(self, topic: str) -> bool:
        return False

    async def logs_elsewhere(self, filters: Sequence[str]) -> dict[str, tuple[int, int]]:
        store = self.holder
        return {
            info.topic: (info.start_offset, info.end_offset)
            for topic_filter in filters
            for info in store.logs(topic_filter)
        }

    async def read_elsewhere(self, topic: str, offset: int, max_bytes: int) -> list[Record]:
        store = self.holder
        return store.read(topic, max(offset, store.start_offset(topic)), 1000, max_bytes)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[LogStore]:
    with LogStore(tmp_path / "holder", StorageConfig(durability="none")) as opened:
        yield opened


@pytest.fixture
def site(tmp_path: Path) -> Iterator[LogStore]:
    with LogStore(tmp_path / "site", StorageConfig(durability="none")) as opened:
        yield opened


def batch_of(
    holder: LogStore,
    positions: dict[str, int],
    budget: int,
    gaps: list[tuple[str, int, int]],
    keep: Callable[[str], bool] = lambda _topic: True,
) -> tuple[Batch | None, dict[str, tuple[int, int]]]:
    logs = HeldElsewhere(holder)
    filters = ["actions/all", "actions/groups/#"]
    return asyncio.run(
        batch_elsewhere(logs, 0, filters, positions, budget, lambda *gap: gaps.append(gap), keep)
    )


def frames(store: LogStore, topic: str) -> bytes:
    return b"".join(store.replicated_log.read_frames(topic, store.start_offset(topic), 1 << 30)[0])


def test_the_logs_held_elsewhere_arrive_verbatim_at_their_offsets_topics_in_turn(
    holder: LogStore, site: LogStore
) -> None:
    for n in range(300):
        holder.append("actions/groups/a", make_record(n, payload_size=1000))
    for n in range(3):
        holder.append("actions/all", make_record(n))
    holder.append("telemetry/x", make_record(0))  # not downlinked
    holder.flush()
    positions: dict[str, int] = {}
    gaps: list[tuple[str, int, int]] = []

    first, elsewhere = batch_of(holder, positions, 100_000, gaps)

    assert elsewhere and first is not None
    all_part, backlog = first.topics  # the live topic beside the backlog's share, not after it
    assert (all_part.topic, all_part.first, all_part.count) == ("actions/all", 0, 3)
    assert (backlog.topic, backlog.first) == ("actions/groups/a", 0) and 0 < backlog.count < 300
    batches = [first]
    while (more := batch_of(holder, positions, 100_000, gaps)[0]) is not None:
        assert [part.topic for part in more.topics] == ["actions/groups/a"]
        batches.append(more)
    assert positions == {"actions/all": 3, "actions/groups/a": 300} and not gaps
    for batch in batches:
        site_gaps: list[Gap] = []
        apply_batch(site, batch, site_gaps, str)
        site.flush()  # durable before the next, as the site waits for it
        assert not site_gaps
    assert frames(site, "actions/all") == frames(holder, "actions/all")
    assert frames(site, "actions/groups/a") == frames(holder, "actions/groups/a")
    assert "telemetry/x" not in site


def test_records_gone_before_the_site_had_them_are_a_gap_told_once(holder: LogStore, tmp_path: Path) -> None:
    with LogStore(tmp_path / "source", StorageConfig(durability="none")) as source:
        for n in range(8):
            source.append("actions/all", make_record(n))
        source.flush()
        later, _count = source.replicated_log.read_frames("actions/all", 5, 1 << 20)
    holder.replicated_log.append_at(
        "actions/all", b"".join(later), 5
    )  # the log starts at 5 (retention took 0-4)
    holder.flush()
    positions = {"actions/all": 2}
    gaps: list[tuple[str, int, int]] = []

    batch, _ = batch_of(holder, positions, 100_000, gaps)

    assert batch is not None and gaps == [("actions/all", 2, 5)]
    assert [(part.topic, part.first, part.count) for part in batch.topics] == [("actions/all", 5, 3)]
    assert positions == {"actions/all": 8}
    assert batch_of(holder, positions, 100_000, gaps) == (None, {"actions/all": (5, 8)})  # logs exist there
    assert gaps == [("actions/all", 2, 5)]


def test_only_the_logs_kept_are_listed_and_sent(holder: LogStore) -> None:
    for topic in ("actions/all", "actions/groups/a"):
        holder.append(topic, make_record(0))
    holder.flush()
    positions: dict[str, int] = {}

    batch, bounds = batch_of(holder, positions, 100_000, [], lambda topic: topic != "actions/all")

    assert batch is not None and [part.topic for part in batch.topics] == ["actions/groups/a"]
    assert bounds == {"actions/groups/a": (0, 1)} and positions == {"actions/groups/a": 1}
