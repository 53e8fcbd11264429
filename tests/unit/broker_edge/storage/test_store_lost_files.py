"""Files of a closed store lost or cut between runs, the ways a disk or a careless operator loses them: a
segment file deleted, a sealed segment cut at an entry boundary or emptied, the catalog deleted or damaged.

Whatever is lost is reported (an ERROR naming the file and the records), every record still on disk is
served, the offsets of the lost ones answer `CorruptRecord` (missing) and are never given again, and a
catalog that lost the names of topics with records stops the open instead of starting over them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from broker_edge.storage import CorruptRecord, LogStore, RecoveryReport, StorageConfig
from broker_edge.storage.catalog import CatalogDamaged
from tests.unit.broker_edge.storage.log_helpers import (
    assert_matches,
    entry_positions,
    flip_byte,
    make_record,
    partition_segments,
)

CONFIG = StorageConfig(segment_bytes=4096, retention_ms=None, index_checkpoint_bytes=1024)
COUNT = 60
TOPICS = ("t", "u")
"""Created in this order (ids 0 and 1), their records interleaved."""


def _closed_store(directory: Path, count: int = COUNT) -> None:
    store = LogStore(directory, CONFIG)
    store.open()
    for number in range(count):
        for topic in TOPICS:
            store.append(topic, make_record(number))
    store.close()


def _reopen(directory: Path) -> tuple[LogStore, RecoveryReport]:
    store = LogStore(directory, CONFIG)
    return store, store.open()


def _served(store: LogStore, topic: str) -> set[int]:
    """The offsets of `topic` a reader gets, stepping over the ones that answer `CorruptRecord`."""
    served: set[int] = set()
    offset, end = 0, store.log_info(topic).end_offset
    while offset < end:
        try:
            records = store.read(topic, offset, max_records=1000, max_bytes=10**9)
        except CorruptRecord as error:
            assert error.reason == "missing"
            offset = error.next_offset
            continue
        for record in records:
            assert_matches(record, record.offset)
            served.add(record.offset)
        offset = records[-1].offset + 1
    return served


def _offsets_in(segment: Path, topic_id: int, before: list[Path]) -> range:
    """The offsets of a topic's records in `segment`, its records in the segments `before` it first."""
    first = sum(len(entry_positions(path, topic_id)) for path in before)
    return range(first, first + len(entry_positions(segment, topic_id)))


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


@pytest.mark.parametrize("index_too", [False, True], ids=["its data file", "its data and index files"])
def test_a_segment_deleted_from_the_middle_loses_only_its_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, index_too: bool
):
    _closed_store(tmp_path)
    segments = partition_segments(tmp_path)
    assert len(segments) >= 4
    middle = segments[1]
    lost = {topic_id: _offsets_in(middle, topic_id, segments[:1]) for topic_id in range(len(TOPICS))}
    middle.unlink()
    if index_too:
        middle.with_suffix(".index").unlink()

    caplog.set_level(logging.INFO, logger="broker_edge.storage")
    store, report = _reopen(tmp_path)

    for topic_id, topic in enumerate(TOPICS):
        assert store.log_info(topic).end_offset == COUNT
        assert _served(store, topic) == set(range(COUNT)) - set(lost[topic_id])
        with pytest.raises(CorruptRecord) as caught:
            store.read(topic, lost[topic_id][0])
        assert caught.value.next_offset == lost[topic_id].stop
        assert store.append(topic, make_record(COUNT)) == COUNT
    errors = _errors(caplog)
    if index_too:  # nothing says what it held: found by the first read that needs it
        assert report.repaired == []
        assert any(f"{middle} is missing, and the log of 't' needs it" in text for text in errors)
    else:
        records = sum(len(offsets) for offsets in lost.values())
        assert [(r.missing_segments, r.records_lost) for r in report.repaired] == [([1], records)]
        assert report.records_lost == records
        assert any(
            f"{middle} is missing (its sealed index is there): {records} records of 2 logs are lost" in text
            for text in errors
        )
        assert not middle.with_suffix(".index").exists()
    store.close()
    again, _report = _reopen(tmp_path)  # the same after a restart
    for topic_id, topic in enumerate(TOPICS):
        assert _served(again, topic) == set(range(COUNT + 1)) - set(lost[topic_id])
    again.close()


@pytest.mark.parametrize("index_too", [False, True], ids=["its data file", "its data and index files"])
def test_a_segment_emptied_in_the_middle_loses_only_its_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, index_too: bool
):
    _closed_store(tmp_path)
    segments = partition_segments(tmp_path)
    assert len(segments) >= 4
    middle = segments[2]
    lost = {topic_id: _offsets_in(middle, topic_id, segments[:2]) for topic_id in range(len(TOPICS))}
    os.truncate(middle, 0)
    if index_too:
        middle.with_suffix(".index").unlink()

    caplog.set_level(logging.INFO, logger="broker_edge.storage")
    store, _report = _reopen(tmp_path)

    for topic_id, topic in enumerate(TOPICS):
        assert store.log_info(topic).end_offset == COUNT
        assert _served(store, topic) == set(range(COUNT)) - set(lost[topic_id])  # the older ones too
        assert [record.offset for record in store.read(topic, 0, max_records=3)] == [0, 1, 2]
        with pytest.raises(CorruptRecord) as caught:
            store.read(topic, lost[topic_id][0])
        assert caught.value.reason == "missing"
        assert store.append(topic, make_record(COUNT)) == COUNT
    assert any(
        f"{middle} holds none of the records its index chain names it for, and the log of 't'" in text
        for text in _errors(caplog)
    )
    store.close()
    again, _report = _reopen(tmp_path)  # the same after a restart
    for topic_id, topic in enumerate(TOPICS):
        assert _served(again, topic) == set(range(COUNT + 1)) - set(lost[topic_id])
    again.close()


def test_segments_whose_files_were_swapped_serve_every_record_they_hold_at_its_offset(tmp_path: Path):
    _closed_store(tmp_path)
    segments = partition_segments(tmp_path)
    first, second = segments[1], segments[2]
    for suffix in (".log", ".index"):
        aside = first.with_suffix(".aside")
        first.with_suffix(suffix).rename(aside)
        second.with_suffix(suffix).rename(first.with_suffix(suffix))
        aside.rename(second.with_suffix(suffix))
    swapped = {
        topic_id: set(_offsets_in(segments[1], topic_id, segments[:1]))
        | set(_offsets_in(segments[2], topic_id, segments[:2]))
        for topic_id in range(len(TOPICS))
    }

    store, _report = _reopen(tmp_path)

    for topic_id, topic in enumerate(TOPICS):
        served = _served(store, topic)  # every record served is the one of its offset (`assert_matches`)
        assert set(range(COUNT)) - swapped[topic_id] <= served
        assert [record.offset for record in store.read(topic, 0, max_records=3)] == [0, 1, 2]
    store.close()


def test_the_newest_segment_deleted_keeps_its_offsets_from_being_given_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    _closed_store(tmp_path)
    segments = partition_segments(tmp_path)
    lost = {topic_id: _offsets_in(segments[-1], topic_id, segments[:-1]) for topic_id in range(len(TOPICS))}
    segments[-1].unlink()
    (tmp_path / "log" / "topics.state").unlink()  # nothing but the orphaned index says where the logs were

    store, report = _reopen(tmp_path)

    assert report.records_lost == sum(len(offsets) for offsets in lost.values())
    assert any("records at the end of 2 logs are lost" in text for text in _errors(caplog))
    for topic_id, topic in enumerate(TOPICS):
        assert store.log_info(topic).end_offset == COUNT
        assert _served(store, topic) == set(range(lost[topic_id][0]))
        assert store.append(topic, make_record(COUNT)) == COUNT
    store.close()
    again, _report = _reopen(tmp_path)
    for topic_id, topic in enumerate(TOPICS):
        assert _served(again, topic) == set(range(lost[topic_id][0])) | {COUNT}
    again.close()


@pytest.mark.parametrize("cut_entries", [5, None], ids=["five entries", "to nothing"])
def test_a_sealed_segment_cut_at_an_entry_boundary_loses_its_records_not_their_offsets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, cut_entries: int | None
):
    _closed_store(tmp_path)
    segments = partition_segments(tmp_path)
    last = segments[-1]
    positions = entry_positions(last)
    size = last.stat().st_size
    keep = positions[-cut_entries] if cut_entries is not None else 0
    kept_offsets = {
        topic_id: _offsets_in(last, topic_id, segments[:-1]).start
        + sum(1 for position in entry_positions(last, topic_id) if position < keep)
        for topic_id in range(len(TOPICS))
    }
    os.truncate(last, keep)

    caplog.set_level(logging.INFO, logger="broker_edge.storage")
    store, report = _reopen(tmp_path)

    missing = cut_entries if cut_entries is not None else len(positions)
    assert report.records_lost == missing
    errors = _errors(caplog)
    assert any(
        f"{last} is {size - keep} bytes shorter than its sealed index says ({keep} of {size} bytes): "
        f"{missing} of its {len(positions)} entries are lost" in text
        for text in errors
    )
    assert any(f"{missing} records at the end of" in text for text in errors)
    for topic_id, topic in enumerate(TOPICS):
        assert store.log_info(topic).end_offset == COUNT  # the offsets the log had reached stay taken
        assert _served(store, topic) == set(range(kept_offsets[topic_id]))
        if kept_offsets[topic_id] < COUNT:
            with pytest.raises(CorruptRecord) as caught:
                store.read(topic, kept_offsets[topic_id])
            assert caught.value.reason == "missing"
        assert store.append(topic, make_record(COUNT)) == COUNT  # never an offset given before
    store.close()
    for _run in range(2):  # the gap is durable: a clean restart, then a crash, keep it
        again, report = _reopen(tmp_path)
        assert report.records_lost == 0
        for topic_id, topic in enumerate(TOPICS):
            assert again.log_info(topic).end_offset == COUNT + 1
            assert _served(again, topic) == set(range(kept_offsets[topic_id])) | {COUNT}
        if _run == 0:
            again.close()
    assert again.append("t", make_record(COUNT + 1)) == COUNT + 1


def test_a_deleted_catalog_stops_the_open_when_segments_hold_records(tmp_path: Path):
    _closed_store(tmp_path)
    catalog = tmp_path / "log" / "catalog"
    catalog.unlink()

    store = LogStore(tmp_path, CONFIG)
    with pytest.raises(CatalogDamaged, match=f"{catalog} is missing, but .* hold records"):
        store.open()
    store.close()
    assert not catalog.exists()  # nothing written over the evidence


def test_a_deleted_catalog_of_a_store_without_records_is_made_again(tmp_path: Path):
    store = LogStore(tmp_path, CONFIG)
    store.open()
    store.close()
    (tmp_path / "log" / "catalog").unlink()

    store, report = _reopen(tmp_path)

    assert report.logs == 0
    assert store.append("t", make_record(0)) == 0
    store.close()


@pytest.mark.parametrize("snapshot", [True, False], ids=["with the snapshot", "without it"])
def test_a_damaged_last_catalog_entry_of_a_topic_with_records_sets_that_topic_aside(
    tmp_path: Path, snapshot: bool, caplog: pytest.LogCaptureFixture
):
    """The newest topic's entry damaged (a flipped bit): its records are in sealed segments, so it was
    durable. Until 2026-12-01 the store did not open at all (``CatalogDamaged``, every log down over one
    entry). The file is now kept aside as it was, cut after its good entries and given an entry under a
    lost name for that topic, which is set aside; every other log opens, and the next start finds a whole
    catalog."""
    _closed_store(tmp_path)
    catalog = tmp_path / "log" / "catalog"
    if not snapshot:
        (tmp_path / "log" / "topics.state").unlink()
    flip_byte(catalog, catalog.stat().st_size - 1)  # "u"'s entry
    damaged = catalog.read_bytes()

    for again in range(2):
        store, _report = _reopen(tmp_path)
        assert [info.topic for info in store.logs()] == ["t", *(["u"] * again)]
        assert [entry.topic for entry in store.quarantined()] == ["\x00lost catalog entry 1"]
        assert _served(store, "t") == set(range(COUNT + again))
        assert store.append("t", make_record(COUNT + again)) == COUNT + again
        assert store.append("u", make_record(0)) == 0 or again  # a new log: the old one's name is lost
        store.close()
    assert f"{catalog} is damaged: its entries end at byte 31 (1 topics)" in caplog.text
    (kept,) = catalog.parent.glob("catalog.damaged-*")
    assert kept.read_bytes() == damaged  # the file as it was found


def test_a_torn_last_catalog_entry_without_records_is_still_cut(tmp_path: Path):
    store = LogStore(tmp_path, CONFIG)
    store.open()
    for number in range(5):
        store.append("t", make_record(number))
    store.flush()
    store.append("u", make_record(0))
    store.flush()
    del store  # a crash, and a power cut: the new topic's catalog entry torn, its record written
    catalog = tmp_path / "log" / "catalog"
    os.truncate(catalog, catalog.stat().st_size - 3)

    store, report = _reopen(tmp_path)

    assert report.bytes_dropped > 3  # the entry and the record naming it
    assert [info.topic for info in store.logs()] == ["t"]
    assert store.read("t", 0, max_records=100)[-1].offset == 4
    assert store.append("u", make_record(0)) == 0
    store.close()


@pytest.mark.parametrize("damage", ["a byte of a name", "a zeroed span"])
@pytest.mark.parametrize("restart", ["close", "crash"])
def test_catalog_entries_damaged_between_valid_ones_set_aside_their_logs_and_every_other_log_opens(
    tmp_path: Path, damage: str, restart: str, caplog: pytest.LogCaptureFixture
):
    """A bit flipped by the disk in one topic's catalog entry: until 2026-12-01 the entries were read up to
    it and, the records of the topics after it being in sealed segments, the store did not open at all
    (``CatalogDamaged``: a broker with a topic per device had every device down over one entry). The damaged
    entries are now stepped over to the valid ones after them: their topics (names lost) are set aside,
    named by the ERROR line, and every other log opens, is served and written, through restarts."""
    store = LogStore(tmp_path, CONFIG)
    store.open()
    topics = [f"fleet/dev-{number}/t" for number in range(8)]
    for number in range(30):
        for topic in topics:
            store.append(topic, make_record(number))
    store.flush()
    if restart == "close":
        store.close()
    else:
        store.wait_sealed()
        del store
    catalog = tmp_path / "log" / "catalog"
    data = bytearray(catalog.read_bytes())
    entry = 16 + 8 + 6 + len(topics[0])  # the second entry ("fleet/dev-1/t", id 1)
    if damage == "a byte of a name":
        data[entry + 14 + 3] ^= 0x40
        lost = [1]
    else:  # from the middle of id 1's entry to the middle of id 3's
        data[entry + 10 : entry + 2 * (14 + len(topics[0])) + 5] = bytes(2 * (14 + len(topics[0])) - 5)
        lost = [1, 2, 3]
    catalog.write_bytes(bytes(data))

    kept = [topic for number, topic in enumerate(topics) if number not in lost]
    for again in range(2):
        store, _report = _reopen(tmp_path)
        assert f"{catalog}: bytes {entry} to " in caplog.text and "their names are lost" in caplog.text
        assert len(store.quarantined()) == len(lost)
        assert [info.topic for info in store.logs()] == sorted(kept + ["fleet/dev-new/t"] * again)
        for topic in kept:
            records = store.read(topic, 0, max_records=100)
            assert [record.offset for record in records] == list(range(30 + again * (topic == kept[-1])))
        assert store.append(kept[-1], make_record(30 + again)) == 30 + again
        assert store.append("fleet/dev-new/t", make_record(0)) == again
        store.close()
        caplog.clear()
