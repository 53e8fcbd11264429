"""The offsets API as the broker serves it: its own port, token and TLS from the broker config, over the
logs devices fill through MQTT; every answer status a client can meet."""

from __future__ import annotations

import json
import ssl
import threading
import urllib.error
import urllib.request

import pytest

from broker_edge.offsets_api.client import (
    AuthError,
    BadRequestError,
    BrokerUnavailable,
    OffsetOutOfRangeError,
    OffsetsClient,
    UnknownTopicError,
)
from tests.e2e.broker_clients import PahoClient
from tests.e2e.commitlog.e2e_helpers import offsets_client, publish_numbered
from tests.tls_certs import client_ssl_context, make_test_pki

TOKEN = "offsets-s3cret"


@pytest.fixture
def secured(brokers, tmp_path):
    """A broker whose offsets API wants a bearer token and a client certificate (mutual TLS)."""
    pki = make_test_pki(tmp_path / "pki")
    tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key), "cafile": str(pki.ca_cert)}
    broker = brokers(offsets_api={"token": TOKEN, "tls": {**tls, "require_client_cert": True}})
    publish_numbered(broker, "secure/meter", 3)
    return broker, pki, f"https://127.0.0.1:{broker.broker.offsets_port}"


def test_token_and_mutual_tls_configured_like_the_listeners(secured):
    broker, pki, url = secured

    with OffsetsClient(url, token=TOKEN, ssl_context=client_ssl_context(pki)) as client:
        payloads = client.fetch("secure/meter", 0).data.column("payload").to_pylist()
    wrong_token = OffsetsClient(url, token="wrong", ssl_context=client_ssl_context(pki))
    with wrong_token, pytest.raises(AuthError) as refused:
        wrong_token.list_logs()
    without_certificate = OffsetsClient(
        url, token=TOKEN, ssl_context=client_ssl_context(pki, certificate=False), retries=0
    )
    with pytest.raises(BrokerUnavailable):
        without_certificate.list_logs()
    plain = OffsetsClient(url.replace("https", "http"), token=TOKEN, retries=0)
    with pytest.raises(BadRequestError, match="speaks TLS"):  # told, not taken for a broker down
        plain.list_logs()

    assert payloads == [b"0", b"1", b"2"]
    assert refused.value.status == 401
    assert broker.broker.offsets_port not in broker.broker.ports.values()  # its own port


def test_logs_listed_with_bounds_size_and_last_append_filtered_by_pattern(brokers):
    broker = brokers()
    publish_numbered(broker, "plant/1/temp", 4)
    publish_numbered(broker, "plant/2/temp", 2)
    publish_numbered(broker, "plant/2/humidity", 1)

    with offsets_client(broker) as api:
        temps = api.list_logs("plant/+/temp")
        everything = api.list_logs()
        first = api.fetch("plant/1/temp", 0).data.to_pylist()

    assert [(i.topic, i.start_offset, i.end_offset) for i in temps] == [
        ("plant/1/temp", 0, 4),
        ("plant/2/temp", 0, 2),
    ]
    assert len(everything) == 3
    assert temps[0].bytes > 0
    assert temps[0].last_append_ms == int(first[-1]["timestamp"].timestamp() * 1000)


def test_fetch_bounds_long_poll_and_batch_fetch_over_mqtt_traffic(brokers):
    broker = brokers()
    publish_numbered(broker, "line/a", 10)
    publish_numbered(broker, "line/b", 5)

    with offsets_client(broker) as api:
        bounded = api.fetch("line/a", 2, max_records=3)
        one = api.fetch("line/a", 0, max_records=100, max_bytes=1)
        batch = api.fetch_many({"line/a": 8, "line/b": "earliest", "line/none": 0})
        later = threading.Timer(0.2, lambda: PahoClient(broker.port, "late").publish("line/b", "5", 1))
        later.start()
        waited = api.fetch("line/b", 5, wait_ms=20_000)
        later.join()

    assert bounded.data.column("offset").to_pylist() == [2, 3, 4] and bounded.next_offset == 5
    assert one.data.column("offset").to_pylist() == [0]  # over max_bytes: still one record
    topics, offsets = batch.table.column("topic").to_pylist(), batch.table.column("offset").to_pylist()
    rows = list(zip(topics, offsets, strict=True))
    assert rows == [("line/a", 8), ("line/a", 9)] + [("line/b", n) for n in range(5)]
    assert isinstance(batch.results["line/none"].error, UnknownTopicError)
    assert waited.data.column("payload").to_pylist() == [b"5"]


def test_json_lines_for_people_and_scripts(brokers):
    broker = brokers()
    publish_numbered(broker, "people/read", 2)

    url = f"http://127.0.0.1:{broker.broker.offsets_port}/v1/logs/people%2Fread/records?offset=0&format=jsonl"
    with urllib.request.urlopen(url) as answer:
        lines = [json.loads(line) for line in answer.read().splitlines()]

    assert [(line["offset"], line["payload_text"]) for line in lines] == [(0, "0"), (1, "1")]


@pytest.mark.parametrize(
    ("target", "status", "code"),
    [
        ("/v1/logs/known/records?offset=abc", 400, "bad_offset"),
        ("/v1/logs/known/records?offset=0&max_records=0", 400, "bad_request"),
        ("/v1/logs/unknown/records?offset=0", 404, "unknown_topic"),
        ("/v1/logs/known/records?offset=9", 416, "offset_out_of_range"),
        ("/v1/nothing", 404, "not_found"),
    ],
)
def test_errors_are_json_with_the_right_status(brokers, target, status, code):
    broker = brokers()
    publish_numbered(broker, "known", 2)

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(f"http://127.0.0.1:{broker.broker.offsets_port}{target}")

    body = json.loads(caught.value.read())
    assert (caught.value.code, body["error"]) == (status, code)
    assert body["message"]
    if status == 416:
        assert (body["start_offset"], body["end_offset"]) == (0, 2)


def test_the_client_raises_typed_errors(brokers):
    broker = brokers()
    publish_numbered(broker, "typed", 2)

    with offsets_client(broker) as api:
        with pytest.raises(BadRequestError):
            api.fetch("typed", 0, max_records=0)
        with pytest.raises(UnknownTopicError):
            api.fetch("untyped", 0)
        with pytest.raises(OffsetOutOfRangeError) as caught:
            api.fetch("typed", 3)

    assert (caught.value.start, caught.value.end) == (0, 2)


def test_tls_certificate_is_checked_by_the_client(secured):
    _broker, pki, url = secured
    context = client_ssl_context(pki, trust=pki.other_ca_cert)
    doubting = OffsetsClient(url, token=TOKEN, ssl_context=context, retries=0)

    with pytest.raises(BrokerUnavailable) as caught:
        doubting.list_logs()

    assert isinstance(caught.value.__cause__, ssl.SSLCertVerificationError)
