"""The offsets API's reads by storage partition, through the client and raw HTTP: extents, every topic's
records in log order as Arrow, filters, byte budgets, times, the errors, and a cluster's member refusing."""

from __future__ import annotations

import http.client
import json
import threading
from pathlib import Path

import pytest

from broker_edge.offsets_api import partitions, server
from broker_edge.offsets_api.arrow_format import ARROW_SCHEMA
from broker_edge.offsets_api.client import OffsetsApiError, OffsetsClient, PositionOutOfRangeError
from broker_edge.offsets_api.errors import BadRequestError
from broker_edge.storage import StorageConfig
from broker_edge.storage.config import PersistRule
from tests.e2e.offsets_api.api_harness import BASE_TIME_MS, ApiHarness, sample_record


def _everything(client: OffsetsClient, position: int = 0, **options) -> tuple[list[dict], int]:
    end = client.partitions()[0].end_position
    rows: list[dict] = []
    while position < end:
        fetched = client.read_partition(0, position, **options)
        assert fetched.next_position > position
        rows += fetched.table.to_pylist()
        position = fetched.next_position
    return rows, position


def test_a_partition_is_read_in_log_order_with_every_topics_records(api: ApiHarness):
    api.append("plant/1/temp", sample_record(10))  # after plant/2/temp's records in the log
    with OffsetsClient(api.base_url) as client:
        [extent] = client.partitions()
        fetched = client.read_partition(0, 0)

    assert (extent.partition, extent.start_position, extent.end_position) == (0, 0, 14)
    assert fetched.table.schema.remove_metadata() == ARROW_SCHEMA
    rows = fetched.table.to_pylist()
    assert [(row["topic"], row["offset"]) for row in rows] == (
        [("plant/1/temp", n) for n in range(10)]
        + [("plant/2/temp", n) for n in range(3)]
        + [("plant/1/temp", 10)]
    )
    assert rows[0]["payload"] == b'{"n": 0}'
    assert rows[0]["properties"] == [("seq", "0"), ("content_type", "application/json")]
    assert (fetched.next_position, fetched.end_position, fetched.lost, fetched.damaged) == (14, 14, {}, 0)


def test_rows_are_the_per_topic_fetchs_rows(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        by_partition = client.read_partition(0, 0).table
        one = client.fetch_arrow("plant/1/temp", 0, max_records=100)
        two = client.fetch_arrow("plant/2/temp", 0, max_records=100)

    assert by_partition.to_pylist() == one.to_pylist() + two.to_pylist()


def test_many_topics_answers_are_built_off_the_event_loop(api: ApiHarness, monkeypatch: pytest.MonkeyPatch):
    """A partition read's or a many-topic fetch's Arrow answer (tens of milliseconds of CPU for a page of
    50,000 device topics) is built in the loop's executor, never on the thread serving MQTT."""
    builders: list[str] = []

    def watched(build):
        def build_and_note(*args):
            builders.append(threading.current_thread().name)
            return build(*args)

        return build_and_note

    monkeypatch.setattr(partitions, "_arrow_body", watched(partitions._arrow_body))
    monkeypatch.setattr(server, "_arrow_body", watched(server._arrow_body))
    api.append("devices/3/status", sample_record(0))
    with OffsetsClient(api.base_url) as client:
        by_partition = client.read_partition(0, 0)
        many = client.fetch_many({"plant/1/temp": 0, "plant/2/temp": 0, "devices/3/status": 0})

    assert by_partition.table.num_rows == 14 and many.table.num_rows == 14
    assert len(builders) == 2 and "offsets-api-test" not in builders  # the harness's loop thread


def test_filters_budgets_and_entry_limits(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        filtered = client.read_partition(0, 0, patterns=["plant/2/#"])
        two_filters = client.read_partition(0, 0, patterns=["plant/2/#", "plant/1/temp"])
        one_byte = client.read_partition(0, 3, max_bytes=1)
        few_entries = client.read_partition(0, 0, max_entries=4, patterns=["plant/2/#"])
        rows, end = _everything(client, max_bytes=100)

    assert {row["topic"] for row in filtered.table.to_pylist()} == {"plant/2/temp"}
    assert (filtered.table.num_rows, filtered.next_position) == (3, 13)
    assert two_filters.table.num_rows == 13
    assert (one_byte.table.num_rows, one_byte.next_position) == (1, 4)
    assert (few_entries.table.num_rows, few_entries.next_position) == (0, 4)
    assert (len(rows), end) == (13, 13)


def test_positions_for_times(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        assert client.position_for_timestamp(0, 0) == 0
        assert client.position_for_timestamp(0, BASE_TIME_MS + 9000) == 9
        assert client.position_for_timestamp(0, BASE_TIME_MS + 10**6) == 13


def test_errors(api: ApiHarness):
    with OffsetsClient(api.base_url, retries=0) as client:
        with pytest.raises(PositionOutOfRangeError) as past_the_end:
            client.read_partition(0, 14)
        with pytest.raises(BadRequestError, match="partition"):
            client.read_partition(1, 0)
        with pytest.raises(BadRequestError, match="pattern"):
            client.read_partition(0, 0, patterns=["a/#/b"])
    assert (past_the_end.value.start, past_the_end.value.end, past_the_end.value.partition) == (0, 13, 0)

    connection = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    connection.request("GET", "/v1/partitions/0/records")
    answer = connection.getresponse()
    assert answer.status == 400 and json.loads(answer.read())["parameter"] == "position"
    connection.close()


def test_what_retention_deleted_is_told_per_topic_from_a_position_on(tmp_path: Path):
    """`GET /v1/partitions/{p}/removed`: the topics matching the filters whose records went with deleted
    segments at or past `since`, each with the position past its newest one, and where the account begins."""
    rules = [PersistRule("debug/#", retention_ms=1000), PersistRule("#")]
    harness = ApiHarness(tmp_path / "store", config=StorageConfig(group_commit_ms=1, segment_bytes=1024,
                                                                  persist=rules))  # fmt: skip
    try:
        harness.append("debug/x", *(sample_record(0) for _ in range(40)))
        harness.append("plant/1/temp", *(sample_record(10**6) for _ in range(10)))
        harness.run(_retention(harness, BASE_TIME_MS + 10**6))
        start = harness.store.partitions()[0].start
        assert start > 0
        with OffsetsClient(harness.base_url, retries=0) as client:
            everything = client.removed_since(0, 0)
            below = everything.removed_below["debug/x"]
            assert everything.accounted_from == 0 and everything.accounts_for(0)
            assert list(everything.removed_below) == ["debug/x"] and 0 < below <= start
            assert client.removed_since(0, 0, ["plant/#"]).removed_below == {}
            assert client.removed_since(0, below, ["debug/#", "plant/#"]).removed_below == {}
            assert client.removed_since(0, below - 1, ["debug/#"]).removed_below == {"debug/x": below}
            with pytest.raises(BadRequestError, match="pattern"):
                client.removed_since(0, 0, ["a/#/b"])
            with pytest.raises(BadRequestError, match="since"):
                client.removed_since(0, -1)
    finally:
        harness.close()


async def _retention(harness: ApiHarness, now_ms: int) -> None:
    harness.store.wait_sealed()
    assert harness.store.apply_retention(now_ms).segments_deleted


def test_a_clusters_member_answers_404(tmp_path: Path):
    harness = ApiHarness(tmp_path / "store")
    harness.append("t", sample_record(0))
    harness.run(_enable_replication(harness))
    try:
        with OffsetsClient(harness.base_url, retries=0) as client:
            with pytest.raises(OffsetsApiError) as caught:
                client.partitions()
            assert caught.value.status == 404
            with pytest.raises(OffsetsApiError) as caught:
                client.read_partition(0, 0)
            assert caught.value.status == 404
            with pytest.raises(OffsetsApiError) as caught:
                client.removed_since(0, 0)
            assert caught.value.status == 404
    finally:
        harness.close()


async def _enable_replication(harness: ApiHarness) -> None:
    harness.store.replicated_log.enable()
