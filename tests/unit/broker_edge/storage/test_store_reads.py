"""Reads of one topic among others in a partition log: dense offsets, limits, segments, times, restarts."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.storage import LogStore, OffsetOutOfRange, RecordTooLarge, StorageConfig
from tests.unit.broker_edge.storage.conftest import FILLED_TOPIC
from tests.unit.broker_edge.storage.log_helpers import (
    BASE_TIME_MS,
    assert_matches,
    make_record,
    partition_segments,
)


def _store(directory: Path, **settings) -> LogStore:
    store = LogStore(directory, StorageConfig(**settings))
    store.open()
    return store


def test_offsets_are_dense_from_zero_per_topic(tmp_path: Path):
    store = _store(tmp_path)

    offsets = [(store.append("a", make_record(n)), store.append("b", make_record(n))) for n in range(5)]

    assert offsets == [(n, n) for n in range(5)]
    store.close()


def test_records_are_readable_only_after_they_are_written(tmp_path: Path):
    store = _store(tmp_path)
    store.append("a", make_record(0))

    assert store.log_info("a").end_offset == 0
    assert store.read("a", 0) == []

    store.flush()

    assert store.log_info("a").end_offset == 1
    assert_matches(store.read("a", 0)[0], 0)
    store.close()


def test_every_record_reads_back_across_segments_it_shares(filled_store: LogStore):
    records = filled_store.read(FILLED_TOPIC, 0, max_records=1000, max_bytes=10**9)

    assert len(filled_store.partition_logs[0].segments) >= 4
    assert len(records) == 200
    for number, record in enumerate(records):
        assert_matches(record, number)
    for number, record in enumerate(filled_store.read("plant/line-2/temp", 0, 1000, 10**9)):
        assert_matches(record, number + 1000, offset=number)


def test_segments_are_numbered_and_sealed_ones_have_an_index(filled_store: LogStore, tmp_path: Path):
    logs = partition_segments(tmp_path / "data")
    indexes = partition_segments(tmp_path / "data", suffix=".index")

    assert [int(path.stem) for path in logs] == list(range(len(logs)))
    assert all(len(path.stem) == 20 for path in logs)
    assert [path.stem for path in indexes] == [path.stem for path in logs[:-1]]  # the active one: at close


def test_a_read_stops_at_max_records(filled_store: LogStore):
    records = filled_store.read(FILLED_TOPIC, 10, max_records=7)

    assert [record.offset for record in records] == list(range(10, 17))


def test_a_read_stops_at_max_bytes_but_returns_at_least_one_record(filled_store: LogStore):
    sizes = [record.size for record in filled_store.read(FILLED_TOPIC, 5, max_records=4)]

    one = filled_store.read(FILLED_TOPIC, 5, max_records=100, max_bytes=1)
    three = filled_store.read(FILLED_TOPIC, 5, max_records=100, max_bytes=sum(sizes[:3]) + sizes[3] - 1)

    assert [record.offset for record in one] == [5]
    assert [record.offset for record in three] == [5, 6, 7]


def test_caught_up_readers_share_record_objects(filled_store: LogStore):
    first = filled_store.read(FILLED_TOPIC, 198)
    second = filled_store.read(FILLED_TOPIC, 198)

    assert [record.offset for record in first] == [198, 199]
    assert all(a is b for a, b in zip(first, second, strict=True))


def test_reading_at_the_end_returns_nothing_and_past_it_raises(filled_store: LogStore):
    assert filled_store.read(FILLED_TOPIC, 200) == []

    with pytest.raises(OffsetOutOfRange) as caught:
        filled_store.read(FILLED_TOPIC, 201)

    assert (caught.value.start, caught.value.end, caught.value.offset) == (0, 200, 201)


def test_offset_for_timestamp_finds_the_first_record_at_or_after(filled_store: LogStore):
    assert filled_store.offset_for_timestamp(FILLED_TOPIC, BASE_TIME_MS + 123) == 123
    assert filled_store.offset_for_timestamp(FILLED_TOPIC, 0) == 0
    assert filled_store.offset_for_timestamp(FILLED_TOPIC, BASE_TIME_MS + 10_000) == 200


def test_offset_for_timestamp_survives_a_clock_stepping_back(tmp_path: Path):
    store = _store(tmp_path)
    for timestamp in (100, 200, 150, 300):
        store.append("a", make_record(0, timestamp_ms=timestamp))
    store.flush()

    assert store.offset_for_timestamp("a", 150) == 1
    assert store.offset_for_timestamp("a", 250) == 3
    assert [record.timestamp_ms for record in store.read("a", 0)] == [100, 200, 150, 300]
    store.close()


def test_restart_keeps_every_record_and_continues_offsets(tmp_path: Path, small_segments: StorageConfig):
    store = LogStore(tmp_path, small_segments)
    store.open()
    for number in range(150):
        store.append("a", make_record(number))
        store.append("b", make_record(number))
    store.close()

    reopened = LogStore(tmp_path, small_segments)
    report = reopened.open()
    offset = reopened.append("a", make_record(150))
    reopened.flush()

    assert (report.records, report.indexes_rebuilt, report.records_scanned) == (300, 0, 0)
    assert offset == 150
    records = reopened.read("a", 0, max_records=1000, max_bytes=10**9)
    assert len(records) == 151
    for number, record in enumerate(records):
        assert_matches(record, number)
    assert reopened.offset_for_timestamp("a", BASE_TIME_MS + 77) == 77
    reopened.close()


def test_a_segment_rolls_when_it_gets_too_old(tmp_path: Path):
    store = _store(tmp_path, segment_ms=1000)
    for number, timestamp in enumerate((0, 500, 999, 1000, 1500, 2100)):
        store.append("a" if number % 2 else "b", make_record(0, timestamp_ms=timestamp))
    store.flush()

    segments = partition_segments(tmp_path)
    assert len(segments) == 3  # [0, 500, 999], [1000, 1500], [2100]
    store.close()


def test_an_oversized_record_is_refused_and_takes_no_offset(tmp_path: Path):
    store = _store(tmp_path, max_record_bytes=100)
    store.append("a", make_record(0, payload_size=10))

    with pytest.raises(RecordTooLarge):
        store.append("a", make_record(1, payload_size=200))
    assert store.append("a", make_record(1, payload_size=10)) == 1
    store.close()


def test_a_logs_span_is_its_start_and_its_committed_end_and_nothing_for_a_topic_without_one(tmp_path: Path):
    store = _store(tmp_path)
    store.replicated_log.enable()
    store.append_batch("t", [(b"reading", 1, False, "device", (), None, None, None, None, None)] * 5)
    store.flush()
    store.replicated_log.commit_to("t", 3)  # two records durable, not yet committed: readers do not see them

    assert store.span("t") == (store.start_offset("t"), store.committed_end("t")) == (0, 3)
    assert store.span("unknown") == (0, 0)
    store.close()
