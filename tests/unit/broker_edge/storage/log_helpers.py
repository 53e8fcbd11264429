"""Helpers for the storage tests: records with every field, and a few on-disk manipulations."""

from __future__ import annotations

import os
from pathlib import Path

from broker_edge.storage import AppendRecord, LogStore

BASE_TIME_MS = 1_700_000_000_000


def make_record(number: int, payload_size: int = 40, timestamp_ms: int | None = None) -> AppendRecord:
    """A record whose fields all depend on `number`, so a wrong record is never mistaken for the right one."""
    return AppendRecord(
        payload=(f"payload-{number}-".encode() * payload_size)[:payload_size],
        qos=1 + number % 2,
        retain=number % 3 == 0,
        client_id=f"device-{number % 7}",
        user_properties=[("seq", str(number)), ("kind", "test")] if number % 2 else [],
        content_type="application/json" if number % 5 == 0 else None,
        payload_format_indicator=number % 2 if number % 4 == 0 else None,
        timestamp_ms=BASE_TIME_MS + number if timestamp_ms is None else timestamp_ms,
        message_expiry_interval=number * 3 if number % 3 == 1 else None,
        response_topic=f"replies/{number}" if number % 4 == 1 else None,
        correlation_data=bytes((number % 256,)) * (number % 3) if number % 4 in (1, 2) else None,
    )


def odd_record(number: int) -> AppendRecord:
    """Records the common path makes special: empty payload or client id, non-ASCII id, retain, fields."""
    kind = number % 6
    return AppendRecord(
        payload=b"" if kind == 0 else bytes([number % 256]) * (number % 30),
        qos=number % 3,
        retain=kind == 1,
        client_id=["", "capteur-é", "a" * 13, "device-1", "d", "设备-7"][kind],
        user_properties=[("k", "v"), ("k", "w")] if kind == 2 else [],
        content_type="" if kind == 3 else ("text/plain" if kind == 2 else None),
        payload_format_indicator=1 if kind == 4 else None,
        timestamp_ms=1_700_000_000_000 + number,
    )


def assert_matches(record, number: int, offset: int | None = None, payload_size: int = 40) -> None:
    """The stored record `record` carries exactly the fields of `make_record(number, payload_size)`."""
    expected = make_record(number, payload_size)
    assert record.offset == (number if offset is None else offset)
    assert record.payload == expected.payload
    assert record.qos == expected.qos
    assert record.retain == expected.retain
    assert record.client_id == expected.client_id
    assert list(record.user_properties) == expected.user_properties
    assert record.content_type == expected.content_type
    assert record.payload_format_indicator == expected.payload_format_indicator
    assert record.timestamp_ms == expected.timestamp_ms
    assert record.message_expiry_interval == expected.message_expiry_interval
    assert record.response_topic == expected.response_topic
    assert record.correlation_data == expected.correlation_data


def segment_files(directory: Path, suffix: str = ".log") -> list[Path]:
    return sorted(path for path in directory.iterdir() if path.name.endswith(suffix))


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as file:
        file.seek(position)
        value = file.read(1)[0]
        file.seek(position)
        file.write(bytes([value ^ 0xFF]))


def entry_positions(path: Path, topic_id: int | None = None) -> list[int]:
    """Start position of each entry in a segment file (walking the length prefixes); with `topic_id`, only
    that topic's records (no marker). A frame starts 8 bytes after its entry."""
    data = path.read_bytes()
    positions, position = [], 0
    while position + 16 <= len(data):
        if topic_id is None or int.from_bytes(data[position : position + 4], "little") == topic_id:
            positions.append(position)
        position += 16 + int.from_bytes(data[position + 8 : position + 12], "little")
    return positions


def partition_segments(data: Path, partition: int = 0, suffix: str = ".log") -> list[Path]:
    """The segment files (or indexes) of one partition of a store in `data`."""
    return segment_files(data / "log" / f"{partition:02d}", suffix)


def open_fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- entries no log can hold: what older versions (or damage a checksum misses) leave on disk ---------------


def record_entry(topic_id: int, offset: int, payload: bytes = b"absurd") -> bytes:
    """A checked entry of ``topic_id`` holding a record at ``offset`` (any u64)."""
    from broker_edge.storage.entry import entries_of
    from broker_edge.storage.record import encode_record

    frame = encode_record(offset, BASE_TIME_MS, AppendRecord(payload))
    return entries_of(topic_id, [memoryview(frame)], [int.from_bytes(frame[4:8], "little")])[0]


def marker_entry(topic_id: int, kind: int, offset: int) -> bytes:
    """A checked marker entry of ``topic_id`` (``entry.TRUNCATE`` or ``RESTART``) at ``offset`` (any u64)."""
    from broker_edge.storage.entry import encode_marker

    return encode_marker(topic_id, kind, offset)


def append_to_last_segment(data: Path, entries: list[bytes], partition: int = 0) -> None:
    """``entries`` written after the last entry of a partition's newest segment (its sealed index, if it
    had one, then no longer matches: the next open scans it)."""
    with open(partition_segments(data, partition)[-1], "ab") as file:
        file.write(b"".join(entries))


def add_catalog_entry(data: Path, name: str, partition: int) -> int:
    """A checked catalog entry for a new topic ``name`` filed in ``partition``; returns its id."""
    from broker_edge.storage import record
    from broker_edge.storage.catalog import BODY_HEAD, HEADER, PREFIX

    path = data / "log" / "catalog"
    content = path.read_bytes()
    topic_id, position = 0, HEADER.size
    while position + PREFIX.size <= len(content):
        position += PREFIX.size + int.from_bytes(content[position : position + 4], "little")
        topic_id += 1
    body = BODY_HEAD.pack(topic_id, partition) + name.encode()
    with open(path, "ab") as file:
        file.write(PREFIX.pack(len(body), record.crc32c(body)) + body)
    return topic_id


def write_past_the_ceiling(store: LogStore, topic: str, carrier: str) -> None:
    """What a store before ``bounds.MAX_OFFSET`` did with a mirror's frames at 2**63-1: a restart marker
    there, then a record whose end overflowed the topic table (the append failed half way, its frame left
    in the partition's buffer), written by the next append (to ``carrier``); a seal of the segment then
    wrote its index and failed to apply it."""
    import contextlib

    import broker_edge.storage.replicated_log as log_module
    from broker_edge.storage.record import encode_record

    ceiling = log_module.MAX_OFFSET
    log_module.MAX_OFFSET = 2**64
    try:
        frame = encode_record(2**63 - 1, BASE_TIME_MS, AppendRecord(b"absurd"))
        with contextlib.suppress(OverflowError):
            store.replicated_log.append_at(topic, frame, at=2**63 - 1)
    finally:
        log_module.MAX_OFFSET = ceiling
    store.append(carrier, AppendRecord(b"carries the frame left unwritten"))
    with contextlib.suppress(OverflowError):  # a seal run by the flush
        store.flush()
