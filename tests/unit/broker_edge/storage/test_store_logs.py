"""LogStore: any topic name, listings, persistence rules, limits, pooled descriptors, shared reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.storage import (
    AppendRecord,
    InvalidRecord,
    LogStore,
    OffsetOutOfRange,
    PersistRule,
    StorageConfig,
    StorageError,
    TooManyTopics,
    UnknownTopic,
)
from broker_edge.storage.file_pool import FileHandlePool
from tests.unit.broker_edge.storage.log_helpers import assert_matches, make_record, open_fd_count

ODD_TOPICS = [
    "a/b",
    "/",
    "a//b",
    ".",
    "..",
    ".hidden",
    "ü/ñ/温度",
    "sp ace",
    "%2F",
    "x~y",
    "$SYS/broker",
    "t" * 600,
]


def _store(directory: Path, **settings) -> LogStore:
    store = LogStore(directory, StorageConfig(**settings))
    store.open()
    return store


def test_any_topic_name_gets_its_own_log_and_survives_a_restart(tmp_path: Path):
    store = _store(tmp_path)
    for number, topic in enumerate(ODD_TOPICS):
        store.append(topic, make_record(number))
    store.close()

    reopened = _store(tmp_path)

    assert sorted(info.topic for info in reopened.logs()) == sorted(ODD_TOPICS)
    for number, topic in enumerate(ODD_TOPICS):
        assert_matches(reopened.read(topic, 0)[0], number, offset=0)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["log", "meta"]  # no name reached a path
    reopened.close()


def test_logs_are_listed_with_their_state_and_filtered_by_pattern(tmp_path: Path):
    store = _store(tmp_path)
    for number in range(3):
        store.append("plant/1/temp", make_record(number))
    store.append("plant/2/temp", make_record(9))
    store.append("plant/2/humidity", make_record(9))
    store.flush()

    temps = store.logs("plant/+/temp")
    everything = store.logs()

    assert [info.topic for info in temps] == ["plant/1/temp", "plant/2/temp"]
    assert (temps[0].start_offset, temps[0].end_offset) == (0, 3)
    assert temps[0].bytes == sum(record.size for record in store.read("plant/1/temp", 0))
    assert temps[0].last_append_ms == make_record(2).timestamp_ms
    assert len(everything) == 3
    store.close()


def test_every_filter_lists_exactly_the_logs_it_matches(tmp_path: Path):
    """Exact filters are looked up and wildcard ones pre-checked by their literal start and end: the listing
    is still exactly the topics the filter matches level by level (`#` takes its parent level, a filter
    starting with a wildcard skips `$` topics, empty levels count)."""
    from itertools import product

    from broker_edge.protocol.topics import topic_matches

    store = _store(tmp_path)
    levels = ["a", "b", "", "$SYS"]
    topics = [
        topic for size in (1, 2, 3) for parts in product(levels, repeat=size) if (topic := "/".join(parts))
    ]
    for topic in topics:
        store.append(topic, make_record(0))
    store.flush()
    filters = {
        "/".join(parts)
        for size in (1, 2, 3)
        for parts in product([*levels, "+", "#", "c"], repeat=size)
        if "#" not in parts[:-1] and parts != ("",)
    }

    for topic_filter in sorted(filters):
        expected = sorted(topic for topic in topics if topic_matches(topic_filter, topic))
        assert [info.topic for info in store.logs(topic_filter)] == expected, topic_filter
    store.close()


def test_unknown_topics_raise(tmp_path: Path):
    store = _store(tmp_path)

    with pytest.raises(UnknownTopic):
        store.read("nope", 0)
    with pytest.raises(UnknownTopic):
        store.offset_for_timestamp("nope", 0)
    store.close()


def test_persistence_rules_decide_per_topic_and_qos(tmp_path: Path):
    rules = [
        PersistRule("debug/#", qos=()),
        PersistRule("metrics/+/raw", qos=(0, 1, 2)),
        PersistRule("#"),
    ]
    store = LogStore(tmp_path, StorageConfig(persist=rules))

    assert store.should_persist("a/b", 1) and store.should_persist("a/b", 2)
    assert not store.should_persist("a/b", 0)
    assert store.should_persist("metrics/m1/raw", 0)
    assert not store.should_persist("debug/x", 1)
    assert not store.should_persist("$SYS/broker/load", 1)  # '#' does not match $-topics


def test_a_topic_no_rule_matches_is_not_persisted(tmp_path: Path):
    store = LogStore(tmp_path, StorageConfig(persist=[PersistRule("plant/#")]))

    assert store.should_persist("plant/a", 1)
    assert not store.should_persist("office/a", 1)


def test_retention_follows_the_matching_rule_in_segments_both_topics_share(tmp_path: Path):
    rules = [PersistRule("short/#", retention_bytes=5000), PersistRule("#")]
    store = _store(tmp_path, persist=rules, segment_bytes=2048, retention_ms=None)
    for number in range(100):
        store.append("short/a", make_record(number))
        store.append("long/a", make_record(number))
        store.flush()

    report = store.apply_retention()

    short, long_ = store.log_info("short/a"), store.log_info("long/a")
    assert report.topics_moved > 0
    assert report.segments_deleted == 0  # every segment still holds records of long/a
    assert short.start_offset > 0 and short.bytes <= 5000 + 2048  # its newest groups are kept whole
    assert long_.start_offset == 0 and long_.bytes == sum(r.size for r in store.read("long/a", 0, 1000))
    assert [r.offset for r in store.read("short/a", short.start_offset, 1000)] == list(
        range(short.start_offset, 100)
    )
    with pytest.raises(OffsetOutOfRange):
        store.read("short/a", short.start_offset - 1)
    store.close()


def test_a_segment_goes_once_every_topic_in_it_is_past_its_retention(tmp_path: Path):
    store = _store(tmp_path, segment_bytes=2048, retention_ms=1000)
    for number in range(60):
        store.append("a", make_record(number, timestamp_ms=1_000 + number))
        store.append("b", make_record(number, timestamp_ms=1_000 + number))
        store.flush()
    segments = len(store.partition_logs[0].segments)

    report = store.apply_retention(now_ms=1_000 + 60 + 1000 + 1)

    assert report.segments_deleted == segments - 1  # all but the active one
    assert store.log_info("a").start_offset == store.log_info("b").start_offset > 0
    assert len(list((tmp_path / "log" / "00").glob("*.log"))) == 1
    store.close()


def test_the_topic_limit_refuses_new_logs_but_not_existing_ones(tmp_path: Path):
    store = _store(tmp_path, max_topics=3)
    for topic in ("a", "b", "c"):
        store.append(topic, make_record(0))

    with pytest.raises(TooManyTopics) as caught:
        store.append("d", make_record(0))

    assert caught.value.limit == 3
    assert store.append("a", make_record(1)) == 1
    assert "d" not in store
    store.close()


def test_hundreds_of_topics_stay_within_a_small_descriptor_pool(tmp_path: Path):
    fds_before = open_fd_count()
    store = _store(tmp_path, max_open_files=16, segment_bytes=600, tail_cache_total_bytes=0)
    topics = [f"device/{number}/telemetry" for number in range(600)]
    for round_number in range(3):
        for topic in topics:
            store.append(topic, make_record(round_number))
    store.flush()

    for topic in topics:
        records = store.read(topic, 0)
        assert [record.offset for record in records] == [0, 1, 2]
        assert_matches(records[1], 1, offset=1)

    assert store.file_pool.open_count <= 16
    assert store.file_pool.opened_total > 16
    assert open_fd_count() - fds_before <= 16 + 4  # the pool plus the writer thread's internals
    store.close()
    assert store.file_pool.open_count == 0


def test_caught_up_readers_share_cached_records(tmp_path: Path):
    store = _store(tmp_path)
    for number in range(5):
        store.append("a", make_record(number))
    store.flush()

    first, second = store.read("a", 2), store.read("a", 2)

    assert all(a is b for a, b in zip(first, second, strict=True))
    assert [record.offset for record in first] == [2, 3, 4]
    store.close()


def test_the_windows_written_last_are_read_from_memory_and_older_ones_from_disk(tmp_path: Path, monkeypatch):
    store = _store(tmp_path, tail_cache_total_bytes=8000, read_cache_bytes=0)  # one window of 6.6 kB
    for topic in ("old", "new"):
        for number in range(40):
            store.append(topic, make_record(number, payload_size=100))
        store.flush()
    preads: list[str] = []
    real = FileHandlePool.pread

    def counted(pool: FileHandlePool, path: str, *args: int) -> bytes:
        if path.endswith(".log"):
            preads.append(path)
        return real(pool, path, *args)

    monkeypatch.setattr(FileHandlePool, "pread", counted)

    new = store.read("new", 35)
    from_memory = len(preads)
    old = store.read("old", 35)

    assert from_memory == 0
    assert len(preads) == 1  # the old window was dropped (the budget), one pread for its 5 neighbours
    assert store.tail_cache_budget.bytes <= 8000
    for reads in (old, new):
        for offset, record in enumerate(reads, start=35):
            assert_matches(record, offset, payload_size=100)
    store.close()


def test_the_store_refuses_appends_before_open(tmp_path: Path):
    store = LogStore(tmp_path)

    with pytest.raises(StorageError, match="not open"):
        store.append("a", AppendRecord(b"x"))


def test_records_that_do_not_fit_the_format_are_storage_errors(tmp_path: Path):
    store = _store(tmp_path)
    properties = [("k", "v")] * 70_000

    with pytest.raises(InvalidRecord):
        store.append("a", AppendRecord(b"x", user_properties=properties))
    with pytest.raises(InvalidRecord):
        store.append("a", AppendRecord(b"x", client_id="c" * 70_000))

    assert store.append("a", make_record(0)) == 0  # the offset was not consumed
    store.close()


def test_an_empty_topic_name_is_refused_and_creates_no_log(tmp_path: Path):
    store = _store(tmp_path)

    with pytest.raises(InvalidRecord):
        store.append("", make_record(0))

    assert "" not in store and len(store) == 0
    store.close()


def test_append_message_stores_the_same_record_as_append(tmp_path: Path):
    store = _store(tmp_path)
    record = make_record(5)

    first = store.append("a", record)
    second = store.append_message("a", *record.fields())
    store.flush()

    one, two = store.read("a", 0)
    assert (first, second) == (0, 1)
    assert bytes(one.frame)[8 + 9 :] == bytes(two.frame)[8 + 9 :]  # all but the CRC and the offset
    assert_matches(two, 5, offset=1)
    store.close()
