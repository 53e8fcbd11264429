"""Damage found at open or at read: torn and corrupt tails cut, damaged records kept as holes and never
served, a sealed segment whose index is gone rebuilt (and, when damaged, kept whole), and another topic's
records around the damage untouched.

"Crash" here means the store is dropped without `close()`: the files are exactly what the writes left, as
after a process kill (the page cache still holds them; power loss is the power-cut test's business).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from broker_edge.storage import AppendRecord, CorruptRecord, LogStore, RecoveryReport, StorageConfig
from broker_edge.storage.entry import entries_of
from broker_edge.storage.record import encode_record
from tests.unit.broker_edge.storage.log_helpers import (
    BASE_TIME_MS,
    assert_matches,
    entry_positions,
    flip_byte,
    make_record,
    partition_segments,
)

TOPIC_ID = 0  # "t", created first; "u" (id 1) is interleaved with it


def _filled(directory: Path, config: StorageConfig, count: int = 200) -> LogStore:
    store = LogStore(directory, config)
    store.open()
    for number in range(count):
        store.append("t", make_record(number))
        store.append("u", make_record(number + 500))
    store.flush()
    return store


def _reopen(directory: Path, config: StorageConfig) -> tuple[LogStore, RecoveryReport]:
    store = LogStore(directory, config)
    return store, store.open()


def _offsets(store: LogStore, topic: str, offset: int) -> list[int]:
    return [record.offset for record in store.read(topic, offset, max_records=10_000, max_bytes=10**9)]


UNCHECKPOINTED = StorageConfig(segment_bytes=4096, retention_ms=None, index_checkpoint_bytes=1 << 30)
"""Small segments whose active one is never checkpointed: a crash rescans all of it."""


def test_a_corrupt_last_record_is_cut(tmp_path: Path):
    small_segments = UNCHECKPOINTED
    _filled(tmp_path, small_segments)
    tail = partition_segments(tmp_path)[-1]
    last = entry_positions(tail)[-1]  # "u"'s record 199
    size_before = tail.stat().st_size
    flip_byte(tail, last + 8 + 20)

    store, report = _reopen(tmp_path, small_segments)

    assert store.log_info("u").end_offset == 199
    assert store.log_info("t").end_offset == 200
    assert report.bytes_dropped == size_before - last
    assert tail.stat().st_size == last
    assert _offsets(store, "u", 0) == list(range(199))
    store.close()


@pytest.mark.parametrize(
    ("closed", "checkpoint"),
    [(False, 1 << 30), (False, 1024), (True, 1 << 30)],
    ids=["found by the scan after a crash", "past a checkpoint, at read", "after a clean close, at read"],
)
def test_a_record_damaged_between_valid_ones_is_a_hole_never_served(
    tmp_path: Path, closed: bool, checkpoint: int
):
    small_segments = StorageConfig(segment_bytes=4096, retention_ms=None, index_checkpoint_bytes=checkpoint)
    store = _filled(tmp_path, small_segments)
    if closed:
        store.close()  # the active segment is sealed: the damage is found by the CRC at read
    tail = partition_segments(tmp_path)[-1]
    positions = entry_positions(tail, TOPIC_ID)
    damaged = 200 - len(positions) + len(positions) // 2
    size_before = tail.stat().st_size
    flip_byte(tail, positions[len(positions) // 2] + 8 + 20)

    store, report = _reopen(tmp_path, small_segments)

    if not closed and checkpoint > 4096:  # the active segment was scanned: reported at open
        assert [repair.damaged_records for repair in report.repaired] == [[("t", damaged)]]
    assert report.bytes_dropped == 0
    assert tail.stat().st_size == size_before  # the valid records after it are not cut away
    assert store.log_info("t").end_offset == 200
    with pytest.raises(CorruptRecord) as caught:
        store.read("t", damaged)
    assert (caught.value.offset, caught.value.next_offset) == (damaged, damaged + 1)
    assert _offsets(store, "t", 0) == list(range(damaged))  # a read stops before it
    after = store.read("t", damaged + 1, max_records=1000)
    assert [record.offset for record in after] == list(range(damaged + 1, 200))
    assert_matches(after[-1], 199)
    assert _offsets(store, "u", 0) == list(range(200))  # the other topic's records are all served
    assert store.append("t", make_record(200)) == 200
    store.close()


def test_a_flipped_byte_in_a_sealed_segment_fails_reads_of_that_record_only(
    tmp_path: Path, small_segments: StorageConfig
):
    _filled(tmp_path, small_segments).close()
    first = partition_segments(tmp_path)[0]
    flip_byte(first, entry_positions(first, TOPIC_ID)[3] + 8 + 12)

    store, report = _reopen(tmp_path, small_segments)

    assert report.indexes_rebuilt == 0
    assert _offsets(store, "t", 0) == [0, 1, 2]
    with pytest.raises(CorruptRecord):
        store.read("t", 3)
    assert_matches(store.read("t", 4, max_records=1)[0], 4)
    store.close()


def test_a_sealed_segment_whose_index_is_gone_is_rebuilt(tmp_path: Path, small_segments: StorageConfig):
    _filled(tmp_path, small_segments).close()
    partition_segments(tmp_path, suffix=".index")[1].unlink()

    store, report = _reopen(tmp_path, small_segments)

    assert report.indexes_rebuilt >= 1
    records = store.read("t", 0, max_records=1000, max_bytes=10**9)
    assert len(records) == 200
    for number, record in enumerate(records):
        assert_matches(record, number)
    store.close()
    again, report = _reopen(tmp_path, small_segments)
    assert report.indexes_rebuilt == 0  # the rebuilt index is written by the sealer
    again.close()


def test_a_damaged_sealed_segment_without_its_index_is_kept_whole_and_served_around_the_damage(
    tmp_path: Path, small_segments: StorageConfig
):
    _filled(tmp_path, small_segments).close()
    first = partition_segments(tmp_path)[0]
    size = first.stat().st_size
    t_in_first = len(entry_positions(first, TOPIC_ID))
    flip_byte(first, entry_positions(first, TOPIC_ID)[2] + 9)  # a length prefix: that record is lost
    partition_segments(tmp_path, suffix=".index")[0].unlink()

    store, report = _reopen(tmp_path, small_segments)

    assert [repair.damaged_segments for repair in report.repaired] == [[0]]
    assert first.stat().st_size == size  # kept whole for inspection
    assert _offsets(store, "t", 0) == [0, 1]
    with pytest.raises(CorruptRecord) as caught:
        store.read("t", 2)
    assert caught.value.next_offset == 3  # the scan went on at the next valid entry
    assert _offsets(store, "t", 3)[: t_in_first - 3] == list(range(3, t_in_first))
    assert_matches(store.read("t", t_in_first, max_records=1)[0], t_in_first)
    assert store.log_info("t").end_offset == 200
    assert _offsets(store, "t", 199) == [199]
    store.close()


def test_an_unclosed_store_replays_what_its_active_segment_holds(
    tmp_path: Path, small_segments: StorageConfig
):
    _filled(tmp_path, small_segments)

    store, report = _reopen(tmp_path, small_segments)

    assert (report.indexes_rebuilt, report.bytes_dropped) == (0, 0)
    records = store.read("t", 0, max_records=1000, max_bytes=10**9)
    assert len(records) == 200
    for number, record in enumerate(records):
        assert_matches(record, number)
    store.close()


def test_appends_after_a_clean_close_are_recovered_after_a_crash(tmp_path: Path):
    config = StorageConfig(segment_bytes=1 << 20)
    _filled(tmp_path, config, count=10).close()
    store, _report = _reopen(tmp_path, config)
    for number in range(10, 15):
        store.append("t", make_record(number))
    store.flush()  # crash

    reopened, report = _reopen(tmp_path, config)

    assert not report.clean_shutdown
    assert _offsets(reopened, "t", 0) == list(range(15))
    reopened.close()


def test_a_torn_write_of_a_new_segment_leaves_the_earlier_ones_as_they_were(
    tmp_path: Path, small_segments: StorageConfig
):
    store = _filled(tmp_path, small_segments)
    segments = partition_segments(tmp_path)
    tail = segments[-1]
    os.truncate(tail, 7)  # the active segment's first entry torn
    del store

    reopened, report = _reopen(tmp_path, small_segments)

    kept = reopened.log_info("t").end_offset
    assert report.bytes_dropped == 7
    assert _offsets(reopened, "t", 0) == list(range(kept))
    assert kept < 200
    reopened.close()


ONE_SEGMENT = StorageConfig(segment_bytes=1 << 20, retention_ms=None, index_checkpoint_bytes=1 << 30)
"""One active segment never checkpointed: after a crash every entry of it is scanned."""


def _served_and_missing(store: LogStore, topic: str) -> tuple[list[int], list[int]]:
    """The offsets a reader walking the whole log gets, and those it is told are damaged or missing."""
    served: list[int] = []
    missing: list[int] = []
    offset, end = store.log_info(topic).start_offset, store.log_info(topic).end_offset
    while offset < end:
        try:
            records = store.read(topic, offset, max_records=10_000, max_bytes=10**9)
        except CorruptRecord as error:
            missing += range(error.offset, error.next_offset)
            offset = error.next_offset
            continue
        served += [record.offset for record in records]
        offset = records[-1].offset + 1
    return served, missing


def test_an_entry_whose_topic_id_is_damaged_between_valid_ones_is_skipped_and_the_rest_kept(tmp_path: Path):
    _filled(tmp_path, ONE_SEGMENT)  # crash: the active segment is scanned at open
    tail = partition_segments(tmp_path)[-1]
    size_before = tail.stat().st_size
    damaged_at = entry_positions(tail, TOPIC_ID)[100]
    flip_byte(tail, damaged_at)  # "t"'s record 100 now names another topic id, failing its check

    store, report = _reopen(tmp_path, ONE_SEGMENT)

    assert report.bytes_dropped == 0
    assert tail.stat().st_size == size_before  # the 199 entries after it are not cut away
    assert _served_and_missing(store, "t") == ([*range(100), *range(101, 200)], [100])
    assert _served_and_missing(store, "u") == (list(range(200)), [])
    assert_matches(store.read("t", 199)[0], 199)
    assert store.append("t", make_record(200)) == 200  # no offset given twice
    store.flush()
    for crash in (True, False):  # opened again after a crash, then after a clean close (sealed)
        if not crash:
            store.close()
        store, report = _reopen(tmp_path, ONE_SEGMENT)
        assert _served_and_missing(store, "t") == ([*range(100), *range(101, 201)], [100])
        assert _served_and_missing(store, "u") == (list(range(200)), [])
        partition = store.partitions()[0]
        read = store.read_partition(0, partition.start, max_entries=10_000, max_bytes=10**9)
        assert (len(read.frames), read.damaged, read.next_position) == (400, 1, partition.end)
    store.close()


@pytest.fixture(params=["numpy", "without numpy"])
def resync(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The search for the next valid entry after damage, with numpy and as a broker installed without it
    (no `arrow` extra) does it."""
    if request.param == "without numpy":
        monkeypatch.setitem(sys.modules, "numpy", None)  # `import numpy` fails as if it were not installed


@pytest.mark.usefixtures("resync")
def test_a_zeroed_page_in_the_middle_of_the_active_segment_loses_only_the_records_in_it(tmp_path: Path):
    _filled(tmp_path, ONE_SEGMENT)
    tail = partition_segments(tmp_path)[-1]
    size_before = tail.stat().st_size
    page = 4 * 4096
    entries = entry_positions(tail)
    in_page = [n for n, at in enumerate(entries) if page - 200 < at < page + 4096]  # touched by the zeros
    with open(tail, "r+b") as file:
        file.seek(page)
        file.write(bytes(4096))

    store, report = _reopen(tmp_path, ONE_SEGMENT)

    assert report.bytes_dropped == 0
    assert tail.stat().st_size == size_before
    lost_t = [n // 2 for n in in_page if n % 2 == 0]  # entries alternate "t", "u"
    served, missing = _served_and_missing(store, "t")
    assert store.log_info("t").end_offset == 200
    assert set(missing) <= set(lost_t) and len(missing) >= len(lost_t) - 1
    assert served == [offset for offset in range(200) if offset not in missing]
    assert len(_served_and_missing(store, "u")[0]) >= 200 - len(in_page)
    assert_matches(store.read("t", 199)[0], 199)
    assert store.append("t", make_record(200)) == 200
    store.close()


@pytest.mark.usefixtures("resync")
def test_an_entry_inside_a_payload_is_never_taken_for_the_log_after_damage(tmp_path: Path):
    """A device may publish bytes that are a whole valid entry (a copy of a log); the scan going on after
    damage must not take one inside a record's payload for a record of the log (here 't' at offset 5000)."""
    forged_frame = encode_record(5000, BASE_TIME_MS, make_record(7))
    (forged,) = entries_of(
        TOPIC_ID, [memoryview(forged_frame)], [int.from_bytes(forged_frame[4:8], "little")]
    )
    store = LogStore(tmp_path, ONE_SEGMENT)
    store.open()
    for number in range(50):
        store.append("t", make_record(number))
        store.append("u", AppendRecord(payload=forged + forged, qos=1, retain=False, client_id="copier"))
    store.flush()
    tail = partition_segments(tmp_path)[-1]
    damaged_at = entry_positions(tail, 1)[20]  # a 'u' record whose payload holds two forged entries
    flip_byte(tail, damaged_at + 8 + 1)  # its length prefix: the scan cannot step over it

    store, _report = _reopen(tmp_path, ONE_SEGMENT)

    assert store.log_info("t").end_offset == 50  # not 5001
    assert _served_and_missing(store, "t") == (list(range(50)), [])
    assert _served_and_missing(store, "u") == ([*range(20), *range(21, 50)], [20])
    store.close()


def test_a_partition_s_active_segment_copied_over_another_s_is_not_taken_for_that_partition_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """After a crash, partition 1's active segment copied over partition 0's (by hand, a restore of the wrong
    file): before, the scan of partition 0 took partition 1's records for its own, filing them where reads
    never look, and then skipped the genuine ones in partition 1's file as repeats (ERROR lines blaming that
    file): every record of partition 1's topics was reported missing, though its own file held them all. The
    entries of topics filed in another partition are not this partition's: partition 1's topics are served
    whole from their own file, and the copy is cut as a torn end, said naming the file it is in."""
    config = StorageConfig(partitions=2, segment_bytes=1 << 20, index_checkpoint_bytes=1 << 30)
    topics = [f"dev/{number}/t" for number in range(8)]
    store = LogStore(tmp_path, config)
    store.open()
    for number in range(10):
        for topic in topics:
            store.append(topic, make_record(number))
    store.flush()
    theirs = {topic for topic in topics if store.partition_of(topic) == 1}
    assert theirs and len(theirs) < len(topics)
    store.file_pool.close()  # a crash: the active segments are scanned at open
    [ours_file] = partition_segments(tmp_path, 0)
    [their_file] = partition_segments(tmp_path, 1)
    ours_file.write_bytes(their_file.read_bytes())

    reopened, _report = _reopen(tmp_path, config)

    for topic in sorted(theirs):
        assert _served_and_missing(reopened, topic) == (list(range(10)), [])
    assert f"{their_file}: entry at" not in caplog.text  # the genuine file is not blamed
    assert str(ours_file) in caplog.text
    reopened.close()


def test_records_of_a_topic_whose_catalog_entry_is_lost_are_not_taken_for_another_partition_s(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A topic of partition 1 whose catalog entry is damaged (its partition field with it: the lost topic is
    filed in partition 0), after a crash: its records in partition 1's active segment are not another
    partition's to the scan (a lost entry's partition is not known): they stay in place, set aside with their
    topic, not stepped over as damage, and partition 1's other topics are served whole."""
    config = StorageConfig(partitions=2, segment_bytes=1 << 20, index_checkpoint_bytes=1 << 30)
    topics = [f"dev/{number}/t" for number in range(8)]
    store = LogStore(tmp_path, config)
    store.open()
    for number in range(10):
        for topic in topics:
            store.append(topic, make_record(number))
    store.flush()
    theirs = [topic for topic in topics if store.partition_of(topic) == 1]
    lost = theirs[0]
    store.file_pool.close()  # a crash
    catalog = tmp_path / "log" / "catalog"
    data = bytearray(catalog.read_bytes())
    position = 16  # after the header: u32 length | u32 crc | u32 topic id | u16 partition | name
    while data[position + 14 : position + 14 + len(lost)] != lost.encode():
        position += 8 + int.from_bytes(data[position : position + 4], "little")
    data[position + 12] ^= 1  # its partition 1 reads 0, its check fails
    catalog.write_bytes(bytes(data))

    reopened, _report = _reopen(tmp_path, config)

    lost_name = f"\x00lost catalog entry {topics.index(lost)}"
    assert [entry.topic for entry in reopened.quarantined()] == [lost_name]
    for topic in theirs[1:]:
        assert _served_and_missing(reopened, topic) == (list(range(10)), [])
    assert "another partition's topic" not in caplog.text
    reopened.close()
