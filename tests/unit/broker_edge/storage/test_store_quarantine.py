"""No entry on disk stops a store from opening: a log that cannot be opened is set aside, the others open.

Each kind of entry no log can hold (a marker or a record past ``bounds.MAX_OFFSET``, a sealed index's group
ending past it, a catalog entry filing a topic in a partition that does not exist, a partition whose files
cannot be read) is written into a store, which then opens after a clean close and after a crash: every
other log serves what it held and takes appends; the log set aside is neither read nor written, is listed
with why in ``quarantined()`` and in ``meta/quarantine.json``, and stays aside at the next open.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker_edge.bounds import MAX_OFFSET
from broker_edge.placement import partition_of
from broker_edge.storage import LogQuarantined, LogStore, StorageConfig, UnknownTopic
from broker_edge.storage.entry import RESTART, TRUNCATE
from tests.unit.broker_edge.storage.log_helpers import (
    add_catalog_entry,
    append_to_last_segment,
    make_record,
    marker_entry,
    partition_segments,
    record_entry,
    write_past_the_ceiling,
)

GOOD = ["plant/a", "plant/b"]
BAD = "plant/bad"
CONFIG = StorageConfig(durability="none", segment_bytes=4096)

Damage = Callable[[Path, LogStore], None]


def filled(directory: Path, config: StorageConfig = CONFIG) -> LogStore:
    """A store holding 30 records in each of GOOD and BAD (topic ids 0, 1, 2), interleaved."""
    store = LogStore(directory, config)
    store.open()
    for number in range(30):
        for topic in [*GOOD, BAD]:
            store.append(topic, make_record(number))
    store.flush()
    return store


def raw_marker(kind: int, offset: int) -> Damage:
    def damage(data: Path, _store: LogStore) -> None:
        append_to_last_segment(data, [marker_entry(2, kind, offset), record_entry(2, offset)])

    return damage


def raw_record(offset: int) -> Damage:
    def damage(data: Path, _store: LogStore) -> None:
        append_to_last_segment(data, [record_entry(2, offset)])  # to a scan: records lost before it, then it

    return damage


def written_past_the_ceiling(_data: Path, store: LogStore) -> None:
    write_past_the_ceiling(store, BAD, "carrier")


DAMAGES: dict[str, Damage] = {
    "a restart marker at 2**63-1": raw_marker(RESTART, 2**63 - 1),
    "a truncation marker at 2**64-1": raw_marker(TRUNCATE, 2**64 - 1),
    "a record at 2**63-1": raw_record(2**63 - 1),
    "a record at MAX_OFFSET": raw_record(MAX_OFFSET),
    "a mirror's frames at 2**63-1, as stores before the ceiling wrote them": written_past_the_ceiling,
}


def close_or_crash(store: LogStore, how: str) -> None:
    """A clean close, or a crash: everything written was flushed, nothing sealed nor marked clean."""
    if how == "clean close":
        with contextlib.suppress(OverflowError):  # a store before the ceiling failed its last seal here
            store.close()


@pytest.fixture
def data(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "store"


def assert_set_aside(store: LogStore, why: str, good: list[str] = GOOD, records: int = 30) -> None:
    assert [entry.topic for entry in store.quarantined()] == [BAD]
    assert why in store.quarantined()[0].reason
    for topic in good:
        assert [record.payload for record in store.read(topic, 0, 1000)][:30] == [
            make_record(number).payload for number in range(min(records, 30))
        ]
    with pytest.raises(LogQuarantined, match=f"the log of {BAD!r} is quarantined"):
        store.read(BAD, 0, 10)
    with pytest.raises(UnknownTopic):  # to a reader, a log that is not there
        store.log_info(BAD)
    with pytest.raises(LogQuarantined):
        store.append(BAD, make_record(99))
    assert BAD not in [info.topic for info in store.logs()]
    assert store.logs(BAD) == []
    whole = store.read_partition(0, store.partitions()[0].start, 100_000, 1 << 30)
    assert BAD not in whole.topics and set(good) <= set(whole.topics)  # nor by partition
    offset = store.append(GOOD[0], make_record(31))
    store.flush()
    assert store.read(GOOD[0], offset, 1)[0].payload == make_record(31).payload


@pytest.mark.parametrize("how", ["clean close", "crash"])
@pytest.mark.parametrize("kind", sorted(DAMAGES))
def test_a_log_holding_an_entry_no_log_can_hold_is_set_aside_and_every_other_log_opens(
    data: Path, kind: str, how: str
) -> None:
    store = filled(data)
    if kind.startswith("a mirror"):
        DAMAGES[kind](data, store)
        close_or_crash(store, how)
    else:
        close_or_crash(store, how)
        DAMAGES[kind](data, store)

    reopened = LogStore(data, CONFIG)
    report = reopened.open()
    assert [entry.topic for entry in report.quarantined] == [BAD]
    assert_set_aside(reopened, "past what a log holds")
    reopened.close()

    listed = json.loads((data / "meta" / "quarantine.json").read_text())
    assert [item["topic"] for item in listed["logs"]] == [BAD]
    with LogStore(data, CONFIG) as again:  # still aside, also once its entries were sealed away
        assert_set_aside(again, "past what a log holds")


def test_the_sealed_index_a_store_before_the_ceiling_wrote_at_close_sets_its_topic_aside(data: Path) -> None:
    store = filled(data)
    written_past_the_ceiling(data, store)
    close_or_crash(store, "clean close")  # the seal holding the frame wrote its index, then failed
    assert list(partition_segments(data, suffix=".index"))
    with LogStore(data, CONFIG) as reopened:
        assert_set_aside(reopened, "past what a log holds")


def test_a_catalog_entry_filing_a_topic_in_a_partition_that_does_not_exist_sets_it_aside(data: Path) -> None:
    filled(data).close()
    stray = add_catalog_entry(data, "plant/stray", 60_000)
    with LogStore(data, CONFIG) as reopened:
        assert [(entry.topic, entry.reason) for entry in reopened.quarantined()] == [
            ("plant/stray", "its catalog entry names partition 60000, of 1 configured or on disk")
        ]
        assert stray == 3 and not (data / "log" / "60000").exists()
        for topic in [*GOOD, BAD]:
            assert len(reopened.read(topic, 0, 1000)) == 30
        with pytest.raises(LogQuarantined):
            reopened.append("plant/stray", make_record(0))


def test_a_partition_whose_files_cannot_be_read_is_moved_aside_with_its_topics_and_starts_empty(
    data: Path,
) -> None:
    config = StorageConfig(durability="none", segment_bytes=4096, partitions=2)
    topics = [f"plant/{n}" for n in range(12)]
    store = LogStore(data, config)
    store.open()
    for number in range(20):
        for topic in topics:
            store.append(topic, make_record(number))
    store.close()
    broken = partition_segments(data, 1)[0]
    broken.unlink()
    broken.mkdir()  # a segment that cannot be read as a file

    with LogStore(data, config) as reopened:
        in_one = sorted(topic for topic in topics if partition_of(topic, 2) == 1)
        assert in_one and sorted(entry.topic for entry in reopened.quarantined()) == in_one
        assert all(
            "partition 1 could not be opened (IsADirectoryError" in e.reason for e in reopened.quarantined()
        )
        for topic in topics:
            if topic in in_one:
                with pytest.raises(LogQuarantined):
                    reopened.read(topic, 0, 10)
            else:
                assert len(reopened.read(topic, 0, 1000)) == 20
        moved = [path.name for path in (data / "log").iterdir() if path.name.startswith("01.quarantined-")]
        assert len(moved) == 1 and (data / "log" / moved[0] / broken.name).is_dir()
        new = next(f"fresh/{n}" for n in range(100) if partition_of(f"fresh/{n}", 2) == 1)
        assert reopened.append(new, make_record(0)) == 0  # a topic new to the emptied partition is written
        reopened.flush()
    with LogStore(data, config) as again:
        assert sorted(entry.topic for entry in again.quarantined()) == in_one
        assert len(again.read(new, 0, 10)) == 1


def test_a_snapshot_holding_offsets_no_log_holds_is_not_used_and_every_log_opens(data: Path) -> None:
    import struct

    filled(data).close()
    snapshot = data / "log" / "topics.state"
    content = bytearray(snapshot.read_bytes())
    header = struct.Struct("<4sHHIQQI")
    _magic, _version, partitions, topics, *_rest = header.unpack_from(content)
    end_column = header.size + 16 * partitions + topics * (4 + 8)  # after head_seg and head_first
    struct.pack_into("<q", content, end_column + 8 * 2, 2**63 - 1)  # BAD's end
    from broker_edge.storage import record

    checksum = record.crc32c(bytes(content[header.size :]))
    struct.pack_into("<I", content, header.size - 4, checksum)
    snapshot.write_bytes(bytes(content))
    with LogStore(data, CONFIG) as reopened:
        assert reopened.quarantined() == []
        for topic in [*GOOD, BAD]:
            assert reopened.durable_end(topic) == 30 and len(reopened.read(topic, 0, 1000)) == 30


@pytest.mark.parametrize("how", ["clean close", "crash"])
def test_the_logs_of_a_partition_whose_directory_was_renamed_are_set_aside_until_it_is_put_back(
    data: Path, how: str
) -> None:
    close_or_crash(filled(data), how)
    (data / "log" / "00").rename(data / "log" / "07")

    store = LogStore(data, CONFIG)
    report = store.open()

    assert sorted(entry.topic for entry in report.quarantined) == sorted([*GOOD, BAD])
    assert "the directory of its partition" in report.quarantined[0].reason
    for topic in [*GOOD, BAD]:
        with pytest.raises(LogQuarantined):  # never a log from offset 0 again, nor one cut at a restart
            store.append(topic, make_record(99))
        with pytest.raises(UnknownTopic):
            store.log_info(topic)
    store.close()
    again = LogStore(data, CONFIG)
    assert len(again.open().quarantined) == 3  # still aside at the next start
    again.close()
    if how == "crash":
        return  # (opened as a partition of its own, 07 was sealed there: putting it back is a clean stop's)

    (data / "log" / "00").rmdir()  # put back: the directory, then the list's entries removed
    (data / "log" / "07").rename(data / "log" / "00")
    (data / "meta" / "quarantine.json").write_text(json.dumps({"logs": []}))
    back = LogStore(data, CONFIG)
    assert back.open().quarantined == []
    for topic in [*GOOD, BAD]:
        records = back.read(topic, 0, 1000)
        assert [record.payload for record in records] == [make_record(number).payload for number in range(30)]
        assert back.append(topic, make_record(30)) == 30
    back.close()


@pytest.mark.parametrize(
    "listed",
    [
        '{"logs": [{"topic": "plant/bad", "reason": "by hand", "since_ms": 1e400}]}',
        '{"logs": [{"topic": "plant/bad", "reason": "by hand", "since_ms": -1e400}]}',
        "[" * 100_000,
    ],
    ids=["time_infinite", "time_minus_infinite", "nested_past_the_parser"],
)
def test_a_quarantine_list_no_integer_or_parser_holds_is_said_and_the_store_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, listed: str
):
    """A ``meta/quarantine.json`` written by hand with a time JSON reads as infinite, or brackets nested past
    the JSON parser's depth: before, the open failed on it (``OverflowError``, ``RecursionError``), and the
    broker with it at every start."""
    data = tmp_path / "data"
    filled(data).close()
    (data / "meta" / "quarantine.json").write_text(listed)

    store = LogStore(data, CONFIG)
    assert store.open().quarantined == []

    assert f"{data / 'meta' / 'quarantine.json'} cannot be read" in caplog.text
    assert [len(store.read(topic, 0, 1000)) for topic in [*GOOD, BAD]] == [30, 30, 30]
    store.close()
