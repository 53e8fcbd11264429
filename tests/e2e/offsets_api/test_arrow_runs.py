"""Arrow fetches are built from runs of frames: the same tables as the per-record path, the same damage."""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from broker_edge.offsets_api.arrow_format import ARROW_SCHEMA, arrow_batch
from broker_edge.offsets_api.arrow_runs import arrow_batch_of_runs
from broker_edge.offsets_api.client import CorruptRecordError, OffsetsClient
from broker_edge.storage import AppendRecord, LogStore, StorageConfig
from tests.e2e.offsets_api.api_harness import ApiHarness, sample_record, write_damaged_log
from tests.unit.broker_edge.storage.log_helpers import (
    entry_positions,
    flip_byte,
    odd_record,
    partition_segments,
)


@pytest.fixture
def mixed_api(tmp_path: Path) -> Iterator[ApiHarness]:
    """Two topics over 1 KiB segments: `a` of 150 records of every shape, `b` of 20 sample records."""
    harness = ApiHarness(tmp_path / "store", config=StorageConfig(group_commit_ms=1, segment_bytes=1024))
    harness.append("a", *(odd_record(n) if n % 3 else sample_record(n) for n in range(150)))
    harness.append("b", *(sample_record(n) for n in range(20)))
    yield harness
    harness.close()


def per_record_batch(harness: ApiHarness, topic: str, offset: int, max_records: int, max_bytes: int):
    async def read() -> pa.RecordBatch:
        return arrow_batch([(topic, harness.store.read(topic, offset, max_records, max_bytes))])

    return harness.run(read())


def post_fetch(harness: ApiHarness, body: dict) -> bytes:
    connection = http.client.HTTPConnection("127.0.0.1", harness.port, timeout=10)
    try:
        connection.request("POST", "/v1/fetch", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        return response.read()
    finally:
        connection.close()


def rows_of_jsonl(lines: list[dict]) -> list[dict]:
    """The JSON-lines records as the Arrow rows they should be."""
    return [
        {
            "topic": line["topic"],
            "offset": line["offset"],
            "timestamp_ms": line["timestamp_ms"],
            "client_id": line["client_id"],
            "qos": line["qos"],
            "retain": line["retain"],
            "properties": [tuple(pair) for pair in line["user_properties"]]
            + ([("content_type", line["content_type"])] if line["content_type"] is not None else []),
            "payload": base64.b64decode(line["payload"]),
        }
        for line in lines
    ]


def rows_of_table(table: pa.Table) -> list[dict]:
    """The Arrow rows with the time in milliseconds, as `rows_of_jsonl` gives them."""
    rows = table.to_pylist()
    for row in rows:
        row["timestamp_ms"] = round(row.pop("timestamp").timestamp() * 1000)
    return rows


@pytest.mark.parametrize(
    ("offset", "max_records", "max_bytes"),
    [(0, 1000, 1 << 20), (0, 150, 900), (37, 60, 1 << 20), (149, 10, 1 << 20), (12, 100, 1), (140, 5, 200)],
)
def test_a_single_topic_arrow_fetch_equals_the_per_record_batch(
    mixed_api: ApiHarness, offset: int, max_records: int, max_bytes: int
):
    with OffsetsClient(mixed_api.base_url) as client:
        fetched = client.fetch("a", offset, max_records, max_bytes)
    expected = per_record_batch(mixed_api, "a", offset, max_records, max_bytes)

    assert expected.num_rows > 0
    assert fetched.data.schema.remove_metadata() == ARROW_SCHEMA
    assert fetched.data.combine_chunks().to_batches()[0].equals(expected)
    assert fetched.next_offset == offset + expected.num_rows


@pytest.mark.parametrize("max_bytes", [1 << 20, 2000, 1])
def test_a_batch_arrow_fetch_equals_the_json_lines_one(mixed_api: ApiHarness, max_bytes: int):
    body: dict[str, Any] = {
        "fetches": [{"topic": "b", "offset": 5}, {"topic": "a", "offset": 10, "max_records": 90}]
    }
    body["max_bytes"] = max_bytes
    arrow = pa.ipc.open_stream(post_fetch(mixed_api, {**body, "format": "arrow"})).read_all()
    lines = [json.loads(line) for line in post_fetch(mixed_api, {**body, "format": "jsonl"}).splitlines()]

    assert json.loads(arrow.schema.metadata[b"timestone.results"]) == lines[0]["results"]
    assert arrow.num_rows == len(lines) - 1 > 0
    assert set(arrow.column("topic").to_pylist()) <= {"a", "b"}
    assert rows_of_table(arrow) == rows_of_jsonl(lines[1:])


def test_many_topics_in_one_batch_keep_their_order_and_topic_column(mixed_api: ApiHarness):
    async def runs() -> pa.RecordBatch:
        store = mixed_api.store
        return arrow_batch_of_runs([("b", store.read_runs("b", 0, 4)), ("a", store.read_runs("a", 3, 2))])

    batch = mixed_api.run(runs())

    assert batch.column("topic").to_pylist() == ["b"] * 4 + ["a"] * 2
    assert batch.column("offset").to_pylist() == [0, 1, 2, 3, 3, 4]
    assert batch.column("properties").to_pylist()[0] == record_properties_of(sample_record(0))
    assert arrow_batch_of_runs([]).num_rows == 0


def record_properties_of(record: AppendRecord) -> list[tuple[str, str]]:
    return [
        *record.user_properties,
        *([("content_type", record.content_type)] if record.content_type else []),
    ]


def test_a_damaged_record_ends_an_arrow_fetch_and_is_reported_in_a_batch(tmp_path: Path):
    harness = ApiHarness(tmp_path, config=write_damaged_log(tmp_path))
    try:
        with OffsetsClient(harness.base_url) as client:
            before = client.fetch("t", 0, max_records=10)
            with pytest.raises(CorruptRecordError) as caught:
                client.fetch("t", 1)
            batch_at_damage = client.fetch_many({"t": 1})
            batch_before = client.fetch_many({"t": 0})
    finally:
        harness.close()

    assert before.data.column("offset").to_pylist() == [0]
    assert before.next_offset == 1
    assert (caught.value.offset, caught.value.next_offset) == (1, 2)
    assert isinstance(batch_at_damage.results["t"].error, CorruptRecordError)
    assert batch_at_damage.results["t"].error.next_offset == 2
    assert batch_at_damage.table.num_rows == 0
    assert (batch_before.results["t"].records, batch_before.results["t"].next_offset) == (1, 1)


def test_a_byte_flipped_mid_segment_cuts_the_fetch_before_it_as_json_lines_does(tmp_path: Path):
    config = StorageConfig(group_commit_ms=1, segment_bytes=64 * 1024)
    store = LogStore(tmp_path, config)
    store.open()
    for number in range(200):
        store.append("t", odd_record(number))
    store.close()
    segment = partition_segments(tmp_path)[0]
    flip_byte(segment, entry_positions(segment)[120] + 8 + 20)  # inside the body of record 120
    harness = ApiHarness(tmp_path, config=config)
    try:
        with OffsetsClient(harness.base_url) as client:
            fetched = client.fetch("t", 100, max_records=1000)
            records = client.fetch_records("t", 100, max_records=1000)
            with pytest.raises(CorruptRecordError) as caught:
                client.fetch("t", 120)
            after = client.fetch("t", 121, max_records=1000)
        body = {"fetches": [{"topic": "t", "offset": 100}], "format": "jsonl"}
        lines = [json.loads(line) for line in post_fetch(harness, body).splitlines()]
    finally:
        harness.close()

    assert fetched.data.column("offset").to_pylist() == list(range(100, 120))
    assert [record.offset for record in records.data] == list(range(100, 120))
    assert fetched.next_offset == records.next_offset == 120
    assert (caught.value.offset, caught.value.next_offset) == (120, 121)
    assert after.data.column("offset").to_pylist() == list(range(121, 200))
    assert rows_of_table(fetched.data) == rows_of_jsonl(lines[1:])


@pytest.mark.parametrize("value_bytes", [0, 5, 300, 5000])
def test_long_and_short_values_give_the_per_record_columns(tmp_path: Path, value_bytes: int):
    """Short values are gathered byte by byte, long ones through binary views: both equal `arrow_batch`."""
    store = LogStore(tmp_path, StorageConfig(segment_bytes=64 * 1024))
    store.open()
    try:
        for number in range(60):
            size = value_bytes + number % 3  # some values fit a view inline, some do not
            store.append(
                "t",
                AppendRecord(
                    bytes([number]) * size,
                    client_id="é" * (size // 2) + "x" * (number % 2),
                    timestamp_ms=number,
                ),
            )
        store.flush()
        runs = store.read_runs("t", 0, 1000, 1 << 20)
        expected = arrow_batch([("t", store.read("t", 0, 1000, 1 << 20))])
    finally:
        store.close()

    assert expected.num_rows == 60
    assert arrow_batch_of_runs([("t", runs)]).equals(expected)
