"""Helpers for the storage tests: records with every field, and a few on-disk manipulations."""

from __future__ import annotations

import os
from pathlib import Path

from broker_edge.storage import AppendRecord

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
