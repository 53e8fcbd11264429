"""LogStore: topics as directories, persistence rules, limits, pooled descriptors, shared tail caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.storage import (
    AppendRecord,
    InvalidRecord,
    LogStore,
    PersistRule,
    StorageConfig,
    StorageError,
    TooManyTopics,
    UnknownTopic,
)
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
    assert all(len(path.name) <= 200 for path in (tmp_path / "topics").iterdir())
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


def test_retention_follows_the_matching_rule(tmp_path: Path):
    rules = [PersistRule("short/#", retention_bytes=5000), PersistRule("#")]
    store = _store(tmp_path, persist=rules, segment_bytes=2048, retention_ms=None)
    for number in range(100):
        store.append("short/a", make_record(number))
        store.append("long/a", make_record(number))
    store.flush()

    report = store.apply_retention()

    assert report.segments_deleted > 0
    assert store.log_info("short/a").start_offset > 0
    assert store.log_info("long/a").start_offset == 0
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
    store = _store(tmp_path, max_open_files=16, segment_bytes=600, tail_cache_records=1)
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


def test_the_tail_cache_budget_drops_the_least_recently_appended_logs(tmp_path: Path):
    store = _store(tmp_path, tail_cache_bytes=4000, tail_cache_total_bytes=6000, read_cache_bytes=0)
    for topic in ("old", "new"):
        for number in range(40):
            store.append(topic, make_record(number, payload_size=100))
    store.flush()

    old_reads = store.read("old", 35), store.read("old", 35)
    new_reads = store.read("new", 35), store.read("new", 35)

    assert not any(a is b for a, b in zip(*old_reads, strict=True))  # served from disk
    assert all(a is b for a, b in zip(*new_reads, strict=True))  # served from memory
    for reads in (old_reads, new_reads):
        for offset, record in enumerate(reads[0], start=35):
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


def test_a_log_directory_that_cannot_be_created_is_a_storage_error(tmp_path: Path):
    store = _store(tmp_path)
    (tmp_path / "topics" / "blocked").write_text("a file where the topic's directory would go")

    with pytest.raises(StorageError, match="cannot create"):
        store.append("blocked", make_record(0))

    assert "blocked" not in store
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
