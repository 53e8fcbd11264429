"""Reads of a whole partition by position: every topic's records in log order, the same frames as the
per-topic reads, filtered by MQTT filters, across sealed and active segments and restarts; records that
retention or damage took are passed over and counted, never served."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.storage import LogStore, PositionOutOfRange, StorageConfig, StorageError
from tests.unit.broker_edge.storage.log_helpers import (
    BASE_TIME_MS,
    entry_positions,
    flip_byte,
    make_record,
    partition_segments,
)

TOPICS = [f"plant/{line}/device-{n}" for line in range(3) for n in range(40)]


def _store(directory: Path, **settings) -> LogStore:
    settings.setdefault("retention_ms", None)
    settings.setdefault("segment_bytes", 8192)
    store = LogStore(directory, StorageConfig(**settings))
    store.open()
    return store


def _fill(store: LogStore, records: int, topics: list[str] = TOPICS, time_of=lambda n: None) -> None:
    for number in range(records):
        store.append(topics[number * 7 % len(topics)], make_record(number, timestamp_ms=time_of(number)))
        if number % 50 == 49:
            store.flush()
    store.flush()
    store.wait_sealed()


def _read_all(store: LogStore, position: int = 0, max_bytes: int = 3000, patterns=None):
    """(topic, offset, frame) of every record served from `position` to the end, in pieces."""
    end = store.partitions()[0].end
    found: list[tuple[str, int, bytes]] = []
    lost: dict[str, int] = {}
    damaged = 0
    while position < end:
        read = store.read_partition(0, position, 10_000, max_bytes, patterns)
        assert read.next_position > position
        for topic, frame in zip(read.topics, read.frames, strict=True):
            found.append((topic, int.from_bytes(frame[9:17], "little"), bytes(frame)))
        for topic, count in read.lost.items():
            lost[topic] = lost.get(topic, 0) + count
        damaged += read.damaged
        position = read.next_position
    return found, lost, damaged


def _per_topic(store: LogStore, topics) -> dict[str, list[bytes]]:
    return {topic: [record.frame for record in store.read(topic, store.start_offset(topic), 10_000, 1 << 30)]
            for topic in topics}  # fmt: skip


def test_every_record_comes_once_in_log_order_with_the_frames_of_the_per_topic_reads(tmp_path: Path):
    store = _store(tmp_path)
    _fill(store, 1200)
    assert len(partition_segments(tmp_path)) > 3  # sealed segments and the active one

    found, lost, damaged = _read_all(store)

    assert (lost, damaged) == ({}, 0)
    assert len(found) == 1200
    by_topic: dict[str, list[bytes]] = {}
    for topic, offset, frame in found:
        assert offset == len(by_topic.setdefault(topic, []))  # each topic's offsets in order, none twice
        by_topic[topic].append(frame)
    assert by_topic == _per_topic(store, TOPICS)
    store.close()


def test_filters_serve_only_matching_topics_and_positions_still_pass_the_others(tmp_path: Path):
    store = _store(tmp_path)
    _fill(store, 600)

    found, _, _ = _read_all(store, patterns=["plant/1/+", "plant/2/device-3"])

    assert {topic for topic, _, _ in found} == {t for t in TOPICS if t.startswith("plant/1/")} | {
        "plant/2/device-3"
    }
    assert len(found) == sum(store.log_info(t).end_offset for t in {topic for topic, _, _ in found})
    read = store.read_partition(0, 0, 600, 1 << 30, ["nothing/here"])
    assert (read.frames, read.next_position) == ([], 600)
    store.close()


def test_a_byte_budget_returns_at_least_one_record_and_goes_on_where_it_stopped(tmp_path: Path):
    store = _store(tmp_path)
    _fill(store, 100)

    first = store.read_partition(0, 0, 100, 1)
    second = store.read_partition(0, first.next_position, 100, 1)

    assert (len(first.frames), first.next_position) == (1, 1)
    assert (len(second.frames), second.next_position) == (1, 2)
    assert store.read_partition(0, 100, 100, 1).frames == []
    store.close()


@pytest.mark.parametrize("restart", ["close", "crash"])
def test_positions_name_the_same_records_after_a_restart(tmp_path: Path, restart: str):
    store = _store(tmp_path)
    _fill(store, 700)
    before, _, _ = _read_all(store, position=123)
    if restart == "close":
        store.close()
    else:
        store.file_pool.close()

    reopened = _store(tmp_path)
    after, _, _ = _read_all(reopened, position=123)

    assert after == before
    reopened.close()


def test_records_below_their_topics_start_are_counted_lost_and_not_served(tmp_path: Path):
    """Retention moved one topic's start past its records while a younger topic keeps their segment."""
    store = _store(tmp_path, segment_bytes=1 << 20, retention_ms=60_000)
    for number in range(10):
        store.append("old", make_record(number, timestamp_ms=BASE_TIME_MS))
        store.append("young", make_record(number, timestamp_ms=BASE_TIME_MS + 120_000))
    store.flush()
    for number in range(2000):  # roll: the first segment gets sealed
        store.append("young", make_record(number, payload_size=600, timestamp_ms=BASE_TIME_MS + 120_000))
    store.flush()
    store.wait_sealed()

    store.apply_retention(now_ms=BASE_TIME_MS + 120_000)

    assert store.start_offset("old") == 10 and partition_segments(tmp_path)[0].name.startswith("0000")
    found, lost, _ = _read_all(store, max_bytes=1 << 20)
    assert lost == {"old": 10}
    assert {topic for topic, _, _ in found} == {"young"}
    store.close()


def test_a_position_below_the_start_or_past_the_end_raises_with_the_bounds(tmp_path: Path):
    store = _store(tmp_path, retention_bytes=20_000)
    _fill(store, 1500, topics=["one"])
    store.apply_retention(now_ms=BASE_TIME_MS)
    info = store.partitions()[0]
    assert info.start > 0

    for position in (info.start - 1, info.end + 1):
        with pytest.raises(PositionOutOfRange) as caught:
            store.read_partition(0, position)
        assert (caught.value.start, caught.value.end) == (info.start, info.end)
    with pytest.raises(PositionOutOfRange):
        store.read_partition(5, 0)
    assert store.read_partition(0, info.start, 1, 1 << 20).frames
    store.close()


def test_a_damaged_frame_is_passed_over_and_counted_the_rest_is_served(tmp_path: Path):
    store = _store(tmp_path)
    _fill(store, 400)
    store.close()
    segment = partition_segments(tmp_path)[0]
    victim = entry_positions(segment)[5]
    flip_byte(segment, victim + 8 + 40)  # inside the frame's body: its CRC fails

    reopened = _store(tmp_path)
    found, _, damaged = _read_all(reopened)

    assert damaged == 1
    assert len(found) == 399
    reopened.close()


def test_a_record_larger_than_a_read_chunk_is_read_whole(tmp_path: Path):
    store = _store(tmp_path, segment_bytes=8 << 20)
    store.append("small", make_record(0))
    store.append("big", make_record(1, payload_size=3 << 20))
    store.append("small", make_record(2))
    store.flush()

    found, _, _ = _read_all(store, max_bytes=1)

    assert [(topic, len(frame) > 3 << 20) for topic, _, frame in found] == [
        ("small", False),
        ("big", True),
        ("small", False),
    ]
    store.close()


def test_position_for_timestamp_finds_the_first_record_at_or_after_the_time(tmp_path: Path):
    store = _store(tmp_path)
    _fill(store, 900, time_of=lambda n: BASE_TIME_MS + n * 10)

    assert store.position_for_timestamp(0, 0) == 0
    assert store.position_for_timestamp(0, BASE_TIME_MS + 5000) == 500
    assert store.position_for_timestamp(0, BASE_TIME_MS + 5001) == 501
    assert store.position_for_timestamp(0, BASE_TIME_MS + 10**9) == 900
    store.close()


def test_a_clusters_store_refuses_partition_reads(tmp_path: Path):
    store = _store(tmp_path)
    _fill(store, 10)
    store.replicated_log.enable()

    with pytest.raises(StorageError, match="topic offsets"):
        store.read_partition(0, 0)
    store.close()


def test_the_positions_of_a_segment_retention_deleted_between_others_are_counted_removed(tmp_path: Path):
    store = _store(tmp_path, retention_ms=60_000)
    young, old = BASE_TIME_MS + 120_000, BASE_TIME_MS
    store.append("young", make_record(0, timestamp_ms=young))
    store.flush()
    per_segment = 8192 // store.partition_logs[0].active.size  # (records of one size)
    for topic, time, count in (
        ("young", young, per_segment - 1),
        ("old", old, per_segment),
        ("young", young, 1),
    ):
        for _ in range(count):
            store.append(topic, make_record(0, timestamp_ms=time))
        store.flush()
    store.wait_sealed()

    store.apply_retention(now_ms=young)

    assert [s.number for s in store.partition_logs[0].segments] == [0, 2]
    read = store.read_partition(0, 0, 100_000, 1 << 30)
    assert (read.removed, read.damaged, read.lost) == (per_segment, 0, {})
    assert read.topics == ["young"] * (per_segment + 1)
    store.close()


def test_entries_of_a_segment_rolled_before_they_are_written_are_not_read_before_they_are_durable(
    tmp_path: Path,
):
    store = _store(tmp_path, segment_bytes=1024)
    for number in range(30):  # several segments rolled, nothing written yet
        store.append(f"t/{number % 3}", make_record(number, payload_size=100))
    assert len(store.partition_logs[0].segments) > 2

    assert store.partitions()[0].end == 0
    assert store.read_partition(0, 0, 100, 1 << 20).topics == []
    store.flush()
    assert store.partitions()[0].end == 30
    assert len(store.read_partition(0, 0, 100, 1 << 20).topics) == 30
    store.close()


@pytest.mark.parametrize("sealed", [False, True])
def test_a_read_of_a_few_entries_reads_about_their_bytes_not_its_byte_budget(tmp_path: Path, sealed: bool):
    # the offsets API reads 256 entries at a time with the request's whole budget (64 MiB): each slice read
    # the rest of the segment, megabytes copied on the event loop for a few kilobytes served
    store = _store(tmp_path, segment_bytes=64 << 20)
    _fill(store, 20_000)
    if sealed:
        store.close()
        store = _store(tmp_path, segment_bytes=64 << 20)
    segment_bytes = partition_segments(tmp_path)[0].stat().st_size

    read = store.read_partition(0, 10_000, 256, 64 << 20)

    buffers = {id(frame.obj): memoryview(frame.obj).nbytes for frame in read.frames}  # the preads they view
    served = sum(map(len, read.frames))
    assert len(read.frames) == 256
    assert sum(buffers.values()) < max(2 * served, 32 << 10) < segment_bytes // 10
    store.close()


def test_a_read_from_any_position_of_sealed_segments_starts_at_that_record(tmp_path: Path):
    # segments of more than 256 rows (a sparse row every 256) holding entries of very different sizes, some
    # larger than the chunk a short skip reads: every position is found by stepping over the entries
    # between its sparse row and it
    store = _store(tmp_path, segment_bytes=600 * 1024)
    for number in range(900):
        size = 70_000 if number % 64 == 0 else number * 37 % 500 + 20
        store.append(TOPICS[number % len(TOPICS)], make_record(number, payload_size=size))
    store.flush()
    store.wait_sealed()
    whole, _, _ = _read_all(store, max_bytes=1 << 30)
    sealed = [segment for segment in store.partition_logs[0].segments if segment.sealed is not None]
    assert sealed and all(segment.row_count > 256 for segment in sealed)

    for position in [*range(0, 900, 37), 255, 256, 257, 258, 511, 513, 899]:
        read = store.read_partition(0, position, 1, 1 << 30)
        assert (read.topics[0], bytes(read.frames[0])) == (whole[position][0], whole[position][2])
    store.close()
