"""Sealed indexes damaged on disk (no checksum covers their groups): a store still opens, after a crash and
after a clean close, and a read never hangs, never fails with an `OSError`, and never serves a wrong record.

After a crash, the indexes sealed since the last topic table snapshot are applied at open: one whose groups
are impossible (a topic id the catalog does not have, out of order, a chain to a segment that is not
older, more bytes than could have been cut) is made again from its segment's data, every record served. A
summary that names a topic past the catalog's is the index's damage, not the catalog's. After a clean close
the groups are not read at open; what they say wrong is found at read: a walk that would go round a loop
stops, an entry pointing past its segment is a damaged record (`CorruptRecord`), never a pread.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import pytest

from broker_edge.storage import CorruptRecord, LogStore, StorageConfig
from broker_edge.storage.sealed_index import GROUP, HEADER, SUMMARY_EVERY
from tests.unit.broker_edge.storage.log_helpers import assert_matches, make_record, partition_segments

CONFIG = StorageConfig(segment_bytes=4096, retention_ms=None, index_checkpoint_bytes=1024)
COUNT = 150
TOPICS = ("t", "u", "v")
FIELDS = {name: number for number, name in enumerate(
    ("topic_id", "count", "first_offset", "first_entry", "flags", "previous_segment", "bytes", "dropped",
     "newest_time")
)}  # fmt: skip


def _filled(directory: Path) -> LogStore:
    store = LogStore(directory, CONFIG)
    store.open()
    for number in range(COUNT):
        for topic in TOPICS:
            store.append(topic, make_record(number))
    store.flush()
    return store


def _crashed(directory: Path) -> None:
    """A store dropped without its close after its segments were sealed (no snapshot counts them yet)."""
    store = _filled(directory)
    store.wait_sealed()
    store.file_pool.close()
    assert not (directory / "log" / "topics.state").exists()


def _groups_at(index: Path) -> tuple[int, int]:
    """Where an index's groups start, and how many there are."""
    fields = HEADER.unpack_from(index.read_bytes())
    groups = fields[7]
    return HEADER.size + 4 * -(-groups // SUMMARY_EVERY), groups


def _set_group_field(index: Path, group: int, field: str, value: int) -> None:
    data = bytearray(index.read_bytes())
    at = _groups_at(index)[0] + group * GROUP.size
    values = list(GROUP.unpack_from(data, at))
    values[FIELDS[field]] = value
    GROUP.pack_into(data, at, *values)
    index.write_bytes(bytes(data))


def _served(store: LogStore, topic: str) -> list[int]:
    """The offsets a reader gets from 0, stepping over the ones that answer `CorruptRecord`; every record
    served is the one of its offset."""
    served: list[int] = []
    offset, end = 0, store.log_info(topic).end_offset
    while offset < end:
        try:
            records = store.read(topic, offset, max_records=1000, max_bytes=10**9)
        except CorruptRecord as error:
            assert error.next_offset > offset
            offset = error.next_offset
            continue
        for record in records:
            assert_matches(record, record.offset)
            served.append(record.offset)
        offset = records[-1].offset + 1
    return served


@pytest.mark.parametrize(
    ("field", "value"),
    [("topic_id", 7777), ("dropped", 2**64 - 1), ("previous_segment", 2), ("first_entry", 3)],
    ids=["a topic the catalog lacks", "bytes no truncation cut", "a chain to itself", "entries out of place"],
)
def test_impossible_groups_of_an_index_applied_after_a_crash_are_made_again_from_the_data(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, field: str, value: int
):
    _crashed(tmp_path)
    index = partition_segments(tmp_path, suffix=".index")[2]
    _set_group_field(index, 0, field, value)

    store = LogStore(tmp_path, CONFIG)
    report = store.open()

    assert report.indexes_rebuilt >= 1
    assert any(
        f"{index}: its sealed index is damaged" in record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.ERROR
    )
    for topic in TOPICS:
        assert store.log_info(topic).end_offset == COUNT
        assert _served(store, topic) == list(range(COUNT))
        assert store.append(topic, make_record(COUNT)) == COUNT
    store.close()
    again = LogStore(tmp_path, CONFIG)
    again.open()
    assert _served(again, "t") == list(range(COUNT + 1))
    again.close()


@pytest.mark.parametrize("crash", [False, True], ids=["after a clean close", "after a crash"])
def test_a_summary_naming_a_topic_past_the_catalog_is_the_index_damage_not_the_catalog(
    tmp_path: Path, crash: bool
):
    if crash:
        _crashed(tmp_path)
    else:
        _filled(tmp_path).close()
    index = partition_segments(tmp_path, suffix=".index")[2]
    data = bytearray(index.read_bytes())
    struct.pack_into("<I", data, HEADER.size, 4000)  # the first (only) summary entry
    index.write_bytes(bytes(data))

    store = LogStore(tmp_path, CONFIG)
    store.open()  # no CatalogDamaged: the catalog is whole

    for topic in TOPICS:
        assert _served(store, topic) == list(range(COUNT))
    store.close()


def test_groups_damaged_after_a_clean_close_are_found_at_read_without_a_hang_or_an_os_error(tmp_path: Path):
    _filled(tmp_path).close()
    indexes = partition_segments(tmp_path, suffix=".index")
    _set_group_field(indexes[4], 0, "previous_segment", 4)  # "t": a chain to its own segment
    groups_at, groups = _groups_at(indexes[3])
    entries_at = groups_at + groups * GROUP.size
    data = bytearray(indexes[3].read_bytes())
    data[entries_at : entries_at + 8] = b"\xff" * 8  # the first entry of "t": at -1, of -1 bytes
    indexes[3].write_bytes(bytes(data))

    store = LogStore(tmp_path, CONFIG)
    store.open()

    served = _served(store, "t")  # stops at the loop, steps over the entry
    assert served and served[-1] == COUNT - 1
    assert set(served) < set(range(COUNT))
    for topic in ("u", "v"):
        assert _served(store, topic) == list(range(COUNT))
    store.close()


def test_a_read_over_groups_zeroed_after_a_clean_close_says_the_index_is_damaged_not_the_records_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The records are in the segment, only its index is wrong: the ERROR line named the segment as holding
    none of them and the records as lost, and every start after it trusted the index again (a clean open
    does not read groups). The read now says which index is damaged and marks it, and the next start makes
    it again from the data, which serves them all."""
    _filled(tmp_path).close()
    index = partition_segments(tmp_path, suffix=".index")[0]
    groups_at = _groups_at(index)[0]
    data = index.read_bytes()
    index.write_bytes(data[:groups_at] + bytes(len(data) - groups_at))
    store = LogStore(tmp_path, CONFIG)
    store.open()

    with caplog.at_level(logging.ERROR):
        served = _served(store, "u")

    assert set(served) < set(range(COUNT))
    assert f"its sealed index {index} is damaged" in caplog.text
    assert "its records are lost" not in caplog.text
    store.close()

    for _ in range(2):  # the next start makes it again from the data (no one deletes it by hand); then kept
        store = LogStore(tmp_path, CONFIG)
        store.open()
        for topic in TOPICS:
            assert _served(store, topic) == list(range(COUNT))
        store.close()
    assert not list(index.parent.glob("*.rebuild"))
