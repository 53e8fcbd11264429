"""`append_batch`: several records of one topic appended at once read back exactly as single appends do."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker_edge.storage import InvalidRecord, LogStore, RecordTooLarge, StorageConfig
from tests.unit.broker_edge.storage.log_helpers import make_record, partition_segments

TOPIC = "plant/line-2/pressure"


def _fields(number: int, payload_size: int = 40) -> tuple:
    return make_record(number, payload_size).batch_fields()


def _store(directory: Path, **settings) -> LogStore:
    store = LogStore(directory, StorageConfig(**settings))
    store.open()
    return store


def test_a_batch_reads_back_with_every_field_at_dense_offsets(tmp_path: Path):
    store = _store(tmp_path)
    store.append(TOPIC, make_record(0))
    first = store.append_batch(TOPIC, [_fields(number) for number in range(1, 40)], timestamp_ms=1_234)
    store.flush()

    from_cache = store.read(TOPIC, 30, 100)  # the newest records come from the window written last
    store.close()
    reopened = _store(tmp_path)
    from_disk = reopened.read(TOPIC, 0, 100)
    reopened.close()

    assert first == 1
    assert [record.offset for record in from_disk] == list(range(40))
    for record in [*from_disk[1:], *from_cache]:
        expected = make_record(record.offset)
        assert (record.payload, record.qos, record.retain, record.client_id) == (
            expected.payload, expected.qos, expected.retain, expected.client_id
        )  # fmt: skip
        assert list(record.user_properties) == expected.user_properties
        assert (record.content_type, record.payload_format_indicator) == (
            expected.content_type, expected.payload_format_indicator
        )  # fmt: skip
        assert record.timestamp_ms == 1_234
    assert [record.offset for record in from_cache] == list(range(30, 40))
    assert [bytes(record.frame) for record in from_cache] == [
        bytes(record.frame) for record in from_disk[30:]
    ]


def test_a_batch_larger_than_a_segment_fills_a_segment_of_its_own(tmp_path: Path):
    store = _store(tmp_path, segment_bytes=1_000)
    store.append(TOPIC, make_record(0))
    store.append_batch(TOPIC, [_fields(number) for number in range(1, 31)])
    store.append(TOPIC, make_record(31))
    store.flush()

    segments = partition_segments(tmp_path)
    records = store.read(TOPIC, 0, 100, 10**6)
    store.close()

    assert len(segments) == 3  # a batch is never split: it rolls whole into a new segment, which rolls next
    assert [record.payload for record in records] == [make_record(n).payload for n in range(32)]


def test_a_batch_with_one_bad_record_appends_nothing(tmp_path: Path):
    store = _store(tmp_path, max_record_bytes=500)
    store.append_batch(TOPIC, [_fields(0)])
    too_large = [_fields(1), _fields(2, payload_size=600), _fields(3)]
    unencodable = [_fields(1), (b"x", 1, False, "c" * 70_000, (), None, None, None, None, None)]

    with pytest.raises(RecordTooLarge):
        store.append_batch(TOPIC, too_large)
    with pytest.raises(InvalidRecord):
        store.append_batch(TOPIC, unencodable)
    store.append_batch(TOPIC, [_fields(1)])
    store.flush()
    records = store.read(TOPIC, 0, 100)
    store.close()

    assert [record.payload for record in records] == [make_record(n).payload for n in range(2)]


def test_the_store_makes_a_batch_durable_as_one_append_and_counts_it_for_the_topic_quota(tmp_path: Path):
    async def scenario() -> tuple[int, int, list[int], int]:
        store = LogStore(tmp_path, StorageConfig())
        store.open()
        first = store.append_batch(TOPIC, [_fields(number) for number in range(10)])
        fired: list[int] = []
        store.when_durable(lambda: fired.append(store.log_info(TOPIC).end_offset))
        await store.wait_durable()
        created = store.logs_created_by("device-0")
        jobs = store.committer.jobs_completed
        store.close()
        return first, created, fired, jobs

    first, created, fired, jobs = asyncio.run(scenario())

    assert first == 0
    assert fired == [10]  # the callback registered after the batch fired once all of it was readable
    assert created == 1  # the batch's first record was device-0's: the new log counts for it
    assert jobs == 1


@pytest.mark.parametrize("durability", ["group", "fsync"])
def test_batches_of_many_topics_append_each_and_refuse_only_the_batch_that_fails(
    tmp_path: Path, durability: str
):
    store = _store(tmp_path, durability=durability, max_record_bytes=200)
    store.append("fleet/device-0", make_record(0))
    batches = [
        ("fleet/device-0", [_fields(1), _fields(2)]),
        ("fleet/device-1", [_fields(0)]),
        ("fleet/device-2", [_fields(0, payload_size=1_000)]),  # over max_record_bytes
        ("fleet/device-3", [_fields(0)]),
    ]
    results = store.append_batches(batches)
    store.flush()
    store.close()
    reopened = _store(tmp_path, durability=durability, max_record_bytes=200)
    held = {topic: [record.offset for record in reopened.read(topic, 0, 10)] for topic in reopened.topics()}
    reopened.close()

    assert results[:2] == [1, 0] and results[3] == 0
    assert isinstance(results[2], RecordTooLarge)
    assert held == {  # the refused batch's topic was created (as `append_batch` leaves it), empty
        "fleet/device-0": [0, 1, 2], "fleet/device-1": [0], "fleet/device-2": [], "fleet/device-3": [0]
    }  # fmt: skip
