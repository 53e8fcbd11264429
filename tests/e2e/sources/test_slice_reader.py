"""The executor side of the timestone source against a real broker, without Spark."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest

from sinks.spark_arrow import to_arrow
from sources.offsets_planner import DataLossError, Slice
from sources.slice_reader import (
    SOURCE_ARROW_SCHEMA,
    BrokerAuthError,
    BrokerUnreachableError,
    FetchSettings,
    read_slices,
)
from sources.timestone_source import SCHEMA
from tests.e2e.sources.conftest import BASE_TIME_MS, EdgeBroker

FAR_FUTURE_MS = BASE_TIME_MS + 10 * 365 * 24 * 3_600_000


def settings(
    broker: EdgeBroker,
    *,
    fail: bool = True,
    max_bytes: int = 1 << 20,
    retries: int = 2,
    token: str | None = None,
) -> FetchSettings:
    return FetchSettings("edge1", broker.url, token, 2_000, retries, 50, max_bytes, fail)


def read(fetch: FetchSettings, *slices: Slice) -> pa.Table:
    return pa.Table.from_batches(list(read_slices(fetch, slices)), schema=SOURCE_ARROW_SCHEMA)


def keys(table: pa.Table) -> list[tuple[str, int]]:
    return sorted(zip(table.column("topic").to_pylist(), table.column("offset").to_pylist(), strict=True))


def test_the_arrow_schema_is_exactly_what_spark_expects_for_the_source_schema() -> None:
    assert SOURCE_ARROW_SCHEMA.equals(to_arrow(SCHEMA))


def test_reads_exactly_the_ranges_even_when_each_fetch_returns_only_part_of_them(edge: EdgeBroker) -> None:
    edge.fill("plant/a", 300)
    edge.fill("plant/b", 40)
    edge.fill("plant/c", 5)
    slices = (Slice("plant/a", 17, 263), Slice("plant/b", 0, 31), Slice("plant/c", 4, 5))
    table = read(settings(edge, max_bytes=2048), *slices)  # ~30 records per round trip
    expected = [(s.topic, offset) for s in slices for offset in range(s.start, s.end)]
    assert keys(table) == sorted(expected)
    row = table.filter(pa.compute.equal(table.column("offset"), 20)).to_pylist()[0]
    assert row["broker"] == "edge1"
    assert row["payload"] == b'{"n":20}'
    assert row["properties"] == [("seq", "20")]
    assert row["client_id"] == "device-2"
    assert row["qos"] == 1 and row["retain"] is True
    assert row["timestamp"].timestamp() * 1000 == BASE_TIME_MS + 20


def test_a_broker_that_comes_back_within_the_retries_completes_the_read(edge: EdgeBroker) -> None:
    edge.fill("plant/a", 50)
    edge.stop_server()
    port = edge.port
    restarter = threading.Timer(0.4, edge.start_server, args=(port,))
    restarter.start()
    try:
        table = read(settings(edge, retries=5), Slice("plant/a", 0, 50))  # backoff 50, 100, 200, 400 ms
    finally:
        restarter.join()
    assert keys(table) == [("plant/a", offset) for offset in range(50)]


def test_a_broker_that_stays_down_fails_naming_the_broker(edge: EdgeBroker) -> None:
    edge.fill("plant/a", 5)
    edge.stop_server()
    began = time.monotonic()
    with pytest.raises(BrokerUnreachableError) as caught:
        read(settings(edge, retries=2), Slice("plant/a", 0, 5))
    assert time.monotonic() - began < 5
    assert "'edge1'" in str(caught.value) and edge.url in str(caught.value)
    assert "fetchRetries" in str(caught.value)


def test_records_removed_while_reading_fail_naming_broker_topic_and_offsets(
    small_segments_edge: EdgeBroker,
) -> None:
    small_segments_edge.fill("plant/a", 200)
    assert small_segments_edge.apply_retention(FAR_FUTURE_MS) > 0
    log_start = small_segments_edge.store.log_info("plant/a").start_offset
    assert 0 < log_start < 200
    with pytest.raises(DataLossError) as caught:
        read(settings(small_segments_edge), Slice("plant/a", 0, 200))
    message = str(caught.value)
    assert "'edge1'" in message and "'plant/a'" in message
    assert "next offset to read 0" in message and f"[{log_start}, 200)" in message


def test_without_fail_on_data_loss_removed_records_are_skipped(small_segments_edge: EdgeBroker) -> None:
    small_segments_edge.fill("plant/a", 200)
    small_segments_edge.fill("plant/b", 3)
    small_segments_edge.apply_retention(FAR_FUTURE_MS)
    a_start = small_segments_edge.store.log_info("plant/a").start_offset
    b_start = small_segments_edge.store.log_info("plant/b").start_offset  # (its first may share a segment)
    table = read(settings(small_segments_edge, fail=False), Slice("plant/a", 0, 200), Slice("plant/b", 0, 3))
    expected = [("plant/a", o) for o in range(a_start, 200)] + [("plant/b", o) for o in range(b_start, 3)]
    assert a_start > 0
    assert keys(table) == sorted(expected)


def test_a_new_topic_planned_from_an_unknown_log_start_is_not_data_loss(
    small_segments_edge: EdgeBroker,
) -> None:
    small_segments_edge.fill("plant/a", 200)
    small_segments_edge.apply_retention(FAR_FUTURE_MS)
    log_start = small_segments_edge.store.log_info("plant/a").start_offset
    table = read(settings(small_segments_edge), Slice("plant/a", 0, 200, from_log_start=True))
    assert keys(table) == [("plant/a", offset) for offset in range(log_start, 200)]


def test_a_refused_token_names_the_broker_and_the_option(tmp_path) -> None:
    broker = EdgeBroker(tmp_path / "secured", token="right")
    try:
        broker.fill("plant/a", 3)
        assert read(settings(broker, token="right"), Slice("plant/a", 0, 3)).num_rows == 3
        with pytest.raises(BrokerAuthError, match=r"'edge1'.*authToken\.edge1"):
            read(settings(broker, token="wrong"), Slice("plant/a", 0, 3))
    finally:
        broker.close()
