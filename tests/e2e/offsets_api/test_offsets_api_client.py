"""OffsetsClient against a real served store: results, typed errors, retries and TLS."""

from __future__ import annotations

import ssl
from pathlib import Path

import pyarrow as pa
import pytest

from broker_edge.offsets_api.arrow_format import ARROW_SCHEMA
from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.errors import (
    AuthError,
    BadRequestError,
    BrokerUnavailable,
    CorruptRecordError,
    OffsetOutOfRangeError,
    UnknownTopicError,
)
from tests.e2e.offsets_api.api_harness import (
    BASE_TIME_MS,
    TOKEN,
    ApiHarness,
    sample_record,
    write_damaged_log,
)
from tests.tls_certs import client_ssl_context, make_test_pki


def test_list_and_describe_logs(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        logs = client.list_logs()
        temps = client.list_logs("plant/+/temp")
        one = client.log_info("plant/2/temp")

    assert [info.topic for info in logs] == ["plant/1/temp", "plant/2/temp"]
    assert (logs[0].start_offset, logs[0].end_offset) == (0, 10)
    assert logs[0] == api.store.log_info("plant/1/temp")
    assert len(temps) == 2
    assert (one.topic, one.end_offset) == ("plant/2/temp", 3)


def test_fetch_returns_a_table_and_where_to_continue(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        first = client.fetch("plant/1/temp", 0, max_records=4)
        rest = client.fetch("plant/1/temp", first.next_offset)
        table = client.fetch_arrow("plant/1/temp", "earliest", max_records=1)

    assert first.data.schema.remove_metadata() == ARROW_SCHEMA
    assert first.data.column("offset").to_pylist() == [0, 1, 2, 3]
    assert (first.next_offset, first.start_offset, first.end_offset) == (4, 0, 10)
    assert rest.data.column("offset").to_pylist() == list(range(4, 10))
    assert rest.next_offset == 10
    assert table.schema.metadata[b"timestone.next_offset"] == b"1"
    assert table.column("retain").to_pylist() == [True]


def test_fetch_records_is_lossless(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        fetched = client.fetch_records("plant/1/temp", 2, max_records=3)

    expected = api.store.read("plant/1/temp", 2, max_records=3)
    assert fetched.next_offset == 5
    assert [record.offset for record in fetched.data] == [2, 3, 4]
    for got, want in zip(fetched.data, expected, strict=True):
        assert bytes(got.frame) == bytes(want.frame)
        assert (got.payload, got.content_type, got.user_properties) == (
            want.payload,
            want.content_type,
            want.user_properties,
        )


def test_fetch_many_reports_each_topic(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        batch = client.fetch_many({"plant/1/temp": 9, "plant/2/temp": "earliest", "ghost": 0, "plant/1/x": 5})

    rows = list(
        zip(batch.table.column("topic").to_pylist(), batch.table.column("offset").to_pylist(), strict=True)
    )
    assert rows == [("plant/1/temp", 9), ("plant/2/temp", 0), ("plant/2/temp", 1), ("plant/2/temp", 2)]
    assert batch.results["plant/1/temp"].next_offset == 10
    assert batch.results["plant/2/temp"].records == 3
    assert isinstance(batch.results["ghost"].error, UnknownTopicError)
    assert batch.results["ghost"].error.topic == "ghost"
    assert batch.results["plant/1/temp"].error is None


def test_fetch_many_bounds_each_topic_by_its_own_max_records(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        batch = client.fetch_many(
            {"plant/1/temp": 2, "plant/2/temp": 0}, max_records=5, topic_max_records={"plant/2/temp": 1}
        )

    assert batch.table.column("offset").to_pylist() == [2, 3, 4, 5, 6, 0]
    assert (batch.results["plant/1/temp"].records, batch.results["plant/1/temp"].next_offset) == (5, 7)
    assert (batch.results["plant/2/temp"].records, batch.results["plant/2/temp"].next_offset) == (1, 1)


def test_fetch_many_reports_an_out_of_range_topic_without_failing_the_others(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        batch = client.fetch_many({"plant/1/temp": 50, "plant/2/temp": 2})

    error = batch.results["plant/1/temp"].error
    assert isinstance(error, OffsetOutOfRangeError)
    assert (error.offset, error.start, error.end) == (50, 0, 10)
    assert batch.table.column("offset").to_pylist() == [2]


def test_fetch_many_long_polls(api: ApiHarness):
    api.append_later("plant/2/temp", sample_record(3), delay_s=0.1)

    with OffsetsClient(api.base_url) as client:
        batch = client.fetch_many({"plant/1/temp": 10, "plant/2/temp": 3}, wait_ms=20_000)

    assert batch.table.column("topic").to_pylist() == ["plant/2/temp"]
    assert batch.results["plant/2/temp"].next_offset == 4


def test_offset_for_timestamp(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        assert client.offset_for_timestamp("plant/1/temp", BASE_TIME_MS + 3000) == 3
        assert client.offset_for_timestamp("plant/1/temp", 0) == 0
        assert client.offset_for_timestamp("plant/1/temp", "latest") == 10


def test_errors_are_typed(api: ApiHarness):
    with OffsetsClient(api.base_url) as client:
        with pytest.raises(OffsetOutOfRangeError) as out_of_range:
            client.fetch("plant/1/temp", 11)
        with pytest.raises(UnknownTopicError) as unknown:
            client.fetch("nope", 0)
        with pytest.raises(BadRequestError):
            client.fetch("plant/1/temp", 0, max_records=0)
        with pytest.raises(BadRequestError):
            client.list_logs("a/#/b")

    assert (out_of_range.value.start, out_of_range.value.end, out_of_range.value.offset) == (0, 10, 11)
    assert (out_of_range.value.status, unknown.value.status, unknown.value.topic) == (416, 404, "nope")


def test_a_corrupt_record_is_a_typed_error_with_where_to_resume(tmp_path: Path):
    harness = ApiHarness(tmp_path, config=write_damaged_log(tmp_path))
    try:
        with OffsetsClient(harness.base_url) as client:
            with pytest.raises(CorruptRecordError) as caught:
                client.fetch("t", 1)
            resumed = client.fetch("t", caught.value.next_offset)
    finally:
        harness.close()

    assert (caught.value.status, caught.value.offset, caught.value.next_offset) == (500, 1, 2)
    assert resumed.data.column("offset").to_pylist() == [2]


def test_a_token_is_sent_and_checked(secured_api: ApiHarness):
    with OffsetsClient(secured_api.base_url, token=TOKEN) as client:
        assert [info.topic for info in client.list_logs()] == ["plant/1/temp"]
    with OffsetsClient(secured_api.base_url, token="wrong") as client, pytest.raises(AuthError) as caught:
        client.list_logs()
    with OffsetsClient(secured_api.base_url) as client, pytest.raises(AuthError):
        client.fetch("plant/1/temp", 0)

    assert caught.value.status == 401


def test_odd_topic_names_travel_in_the_path(tmp_path: Path):
    harness = ApiHarness(tmp_path)
    topics = [".", "..", "/", "a//b", "ü %?#+&=", "x/records", "x/offset"]
    try:
        for number, topic in enumerate(topics):
            harness.append(topic, sample_record(number))
        with OffsetsClient(harness.base_url) as client:
            payloads = {topic: client.fetch(topic, 0).data.column("payload").to_pylist() for topic in topics}
            infos = {topic: client.log_info(topic).end_offset for topic in topics}
    finally:
        harness.close()

    assert payloads == {topic: [sample_record(number).payload] for number, topic in enumerate(topics)}
    assert set(infos.values()) == {1}


def test_the_client_reconnects_after_a_broker_restart(api: ApiHarness):
    with OffsetsClient(api.base_url, retry_backoff_s=0.05) as client:
        before = client.log_info("plant/1/temp")
        api.restart_server()
        after = client.log_info("plant/1/temp")

    assert before == after


def test_an_unreachable_broker_raises_after_retries(api: ApiHarness):
    api.stop_server()
    client = OffsetsClient(api.base_url, timeout_s=2, retries=2, retry_backoff_s=0.01)

    with pytest.raises(BrokerUnavailable) as caught:
        client.list_logs()

    assert "3 attempts" in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)


def test_tls_with_a_self_signed_ca(tmp_path: Path):
    pki = make_test_pki(tmp_path / "pki")
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(str(pki.server_cert), str(pki.server_key))
    harness = ApiHarness(tmp_path / "store", token=TOKEN, ssl_context=server_context)
    try:
        harness.append("secure/topic", sample_record(1))
        trusted = client_ssl_context(pki, certificate=False)
        with OffsetsClient(harness.base_url, token=TOKEN, ssl_context=trusted) as client:
            table = client.fetch_arrow("secure/topic", 0)
        untrusted = client_ssl_context(pki, certificate=False, trust=pki.other_ca_cert)
        doubting = OffsetsClient(harness.base_url, token=TOKEN, ssl_context=untrusted, retries=0)
        with pytest.raises(BrokerUnavailable) as refused:
            doubting.list_logs()
        plain = OffsetsClient(harness.base_url.replace("https", "http"), token=TOKEN, retries=0)
        with pytest.raises(BadRequestError, match="speaks TLS"):  # told, not taken for a broker down
            plain.list_logs()
    finally:
        harness.close()

    assert harness.base_url.startswith("https://127.0.0.1:")
    assert isinstance(table, pa.Table)
    assert table.column("payload").to_pylist() == [sample_record(1).payload]
    assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)
