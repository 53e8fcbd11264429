"""Columnar reads (`LogStore.read_runs`): the same records as `read`, field by field, and the same damage."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from crc32c import crc32c

from broker_edge.storage import AppendRecord, CorruptRecord, LogStore, StorageConfig
from broker_edge.storage.frame_runs import FrameRun, frame_columns
from broker_edge.storage.record import qos_with_packet_id
from tests.unit.broker_edge.storage.log_helpers import (
    entry_positions,
    flip_byte,
    make_record,
    odd_record,
    partition_segments,
)

TOPIC = "plant/mixed"

Row = tuple[int, int, str, int, bool, bytes, list[tuple[str, str]], str | None]


def rows_of_runs(runs: list[FrameRun]) -> list[Row]:
    """Every field of the records of `runs`, taken from their columns."""
    if not runs:
        return []
    columns = frame_columns(runs)
    data = columns.data
    fields = {row: (content_type, user_properties) for row, content_type, user_properties in columns.fields}
    rows = []
    for row in range(len(columns)):
        cid_start, cid_length = int(columns.client_id_starts[row]), int(columns.client_id_lengths[row])
        payload_start, payload_length = int(columns.payload_starts[row]), int(columns.payload_lengths[row])
        content_type, user_properties = fields.get(row, (None, []))
        rows.append(
            (
                int(columns.offsets[row]),
                int(columns.timestamps_ms[row]),
                data[cid_start : cid_start + cid_length].decode(),
                int(columns.qos[row]),
                bool(columns.retain[row]),
                data[payload_start : payload_start + payload_length],
                list(user_properties),
                content_type,
            )
        )
    return rows


def rows_of_records(records) -> list[Row]:
    return [
        (
            record.offset,
            record.timestamp_ms,
            record.client_id,
            record.qos,
            record.retain,
            bytes(record.payload),
            list(record.user_properties),
            record.content_type,
        )
        for record in records
    ]


def assert_same_read(store: LogStore, offset: int, max_records: int, max_bytes: int) -> list[FrameRun]:
    records = store.read(TOPIC, offset, max_records, max_bytes)
    runs = store.read_runs(TOPIC, offset, max_records, max_bytes)
    assert rows_of_runs(runs) == rows_of_records(records)
    assert b"".join(run.data for run in runs) == b"".join(bytes(record.frame) for record in records)
    assert [run.first for run in runs] == sorted(run.first for run in runs)
    return runs


@pytest.fixture
def mixed_log(tmp_path: Path, small_segments: StorageConfig) -> Iterator[LogStore]:
    """A flushed store whose topic holds 120 records of every shape over several segments, another topic's
    records between them."""
    store = LogStore(tmp_path / "mixed", small_segments)
    store.open()
    for number in range(120):
        store.append(TOPIC, odd_record(number) if number % 2 else make_record(number))
        store.append("other", make_record(number))
    store.flush()
    yield store
    store.close()


@pytest.mark.parametrize(
    ("offset", "max_records", "max_bytes"),
    [(0, 1000, 1 << 20), (3, 40, 1 << 20), (50, 7, 1 << 20), (110, 100, 1 << 20), (0, 1000, 700), (17, 5, 1)],
)
def test_runs_hold_the_records_read_returns(
    mixed_log: LogStore, offset: int, max_records: int, max_bytes: int
):
    runs = assert_same_read(mixed_log, offset, max_records, max_bytes)
    assert runs and runs[0].first == offset


def test_qos2_records_keeping_packet_ids_give_their_payloads_in_columns(
    tmp_path: Path, small_segments: StorageConfig
):
    """A record of version 2 (a packet id after the client id) between version 1 ones: the columns give
    every payload without the packet id's bytes."""
    store = LogStore(tmp_path / "qos2", small_segments)
    store.open()
    try:
        for number in range(6):
            qos = qos_with_packet_id(2, 300 + number) if number % 2 else 2
            store.append_batch(
                TOPIC, [(b"p%d" % number, qos, False, "dev", (), None, None, None, None, None)]
            )
        store.flush()
        assert_same_read(store, 0, 1000, 1 << 20)
        assert [r.packet_id for r in store.read(TOPIC, 0)] == [None, 301, None, 303, None, 305]
    finally:
        store.close()


def test_a_read_across_segments_is_one_run_of_the_topics_frames(mixed_log: LogStore):
    runs = assert_same_read(mixed_log, 0, 1000, 1 << 20)
    assert len(mixed_log.partition_logs[0].segments) > 1
    assert [(run.first, run.end) for run in runs] == [(0, 120)]


def test_records_of_the_window_written_last_are_read_from_memory(mixed_log: LogStore, tmp_path: Path):
    for segment in partition_segments(tmp_path / "mixed"):
        os.truncate(segment, 0)  # so nothing can come from the disk
    runs = assert_same_read(mixed_log, 100, 1000, 1 << 20)
    assert [(run.first, run.end) for run in runs] == [(100, 120)]


def test_a_byte_bound_smaller_than_a_record_still_returns_one(mixed_log: LogStore):
    runs = assert_same_read(mixed_log, 10, 100, 1)
    assert sum(len(run) for run in runs) == 1


def test_a_read_at_the_end_returns_nothing(mixed_log: LogStore):
    assert mixed_log.read_runs(TOPIC, 120) == []


def _reopened(store: LogStore, config: StorageConfig) -> LogStore:
    store.close()
    reopened = LogStore(store.directory, StorageConfig(**{**_settings(config), "tail_cache_total_bytes": 0}))
    reopened.open()
    return reopened


def _settings(config: StorageConfig) -> dict:
    return {
        name: getattr(config, name) for name in ("segment_bytes", "retention_ms", "index_checkpoint_bytes")
    }


def test_a_flipped_byte_mid_range_stops_the_run_before_it_like_read(
    mixed_log: LogStore, small_segments: StorageConfig, tmp_path: Path
):
    log = _reopened(mixed_log, small_segments)
    segments = partition_segments(tmp_path / "mixed")
    base = len(entry_positions(segments[0], 0))  # the topic's first offset in the second segment
    positions = entry_positions(segments[1], 0)
    damaged = base + 3
    flip_byte(segments[1], positions[3] + 8 + 40)
    try:
        runs = assert_same_read(log, base, 1000, 1 << 20)
        assert runs[-1].end == damaged
        with pytest.raises(CorruptRecord) as by_runs:
            log.read_runs(TOPIC, damaged)
        with pytest.raises(CorruptRecord) as by_records:
            log.read(TOPIC, damaged)
        assert (
            (by_runs.value.offset, by_runs.value.next_offset, by_runs.value.reason)
            == (
                by_records.value.offset,
                by_records.value.next_offset,
                by_records.value.reason,
            )
            == (damaged, damaged + 1, "checksum")
        )
        assert_same_read(log, damaged + 1, 1000, 1 << 20)
    finally:
        log.close()


def test_a_torn_frame_stops_the_run_before_it_like_read(
    mixed_log: LogStore, small_segments: StorageConfig, tmp_path: Path
):
    log = _reopened(mixed_log, small_segments)
    segment = partition_segments(tmp_path / "mixed")[0]
    positions = entry_positions(segment, 0)
    os.truncate(segment, positions[-1] + 8 + 10)  # the file shrinks under the open store: a frame is torn
    last = len(positions) - 1
    try:
        runs = assert_same_read(log, 0, 1000, 1 << 20)
        assert runs[-1].end == last
        with pytest.raises(CorruptRecord) as caught:
            log.read_runs(TOPIC, last)
        assert caught.value.offset == last
    finally:
        log.close()


def test_a_frame_with_a_valid_checksum_but_a_broken_client_id_is_not_served(tmp_path: Path):
    config = StorageConfig(retention_ms=None, tail_cache_total_bytes=0)
    log = LogStore(tmp_path / "t", config)
    log.open()
    for number in range(5):
        log.append(TOPIC, AppendRecord(b"x" * number, client_id="device-1", timestamp_ms=number))
    log.close()
    segment = partition_segments(tmp_path / "t")[0]
    data = bytearray(segment.read_bytes())
    position = entry_positions(segment)[2] + 8  # the frame of record 2
    data[position + 29] = 0xFF  # the client id's first byte: not UTF-8
    end = position + 8 + int.from_bytes(data[position : position + 4], "little")
    crc = crc32c(bytes(data[position + 8 : end]))
    data[position + 4 : position + 8] = crc.to_bytes(4, "little")
    data[position - 4 : position] = crc32c(bytes(data[position - 8 : position - 4]), crc).to_bytes(
        4, "little"
    )
    segment.write_bytes(bytes(data))
    log = LogStore(tmp_path / "t", config)
    log.open()
    try:
        runs = assert_same_read(log, 0, 100, 1 << 20)
        assert runs[-1].end == 2
        with pytest.raises(CorruptRecord) as caught:
            log.read_runs(TOPIC, 2)
        assert (caught.value.offset, caught.value.reason) == (2, "fields")
        assert_same_read(log, 3, 100, 1 << 20)
    finally:
        log.close()
