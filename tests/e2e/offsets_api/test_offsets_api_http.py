"""The offsets API over raw HTTP (stdlib http.client): every endpoint, format and status code."""

from __future__ import annotations

import base64
import http.client
import json
import logging
import threading
from typing import Any

import pyarrow as pa
import pytest

from broker_edge.offsets_api.arrow_format import ARROW_SCHEMA
from broker_edge.storage import StorageConfig
from tests.e2e.offsets_api.api_harness import (
    BASE_TIME_MS,
    TOKEN,
    ApiHarness,
    sample_record,
    write_damaged_log,
)

TEMP = "/v1/logs/plant%2F1%2Ftemp"


def request(
    harness: ApiHarness, method: str, target: str, body: object = None, headers: dict | None = None
) -> tuple[int, http.client.HTTPMessage, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", harness.port, timeout=30)
    try:
        payload = json.dumps(body).encode() if body is not None and not isinstance(body, bytes) else body
        connection.request(method, target, payload, headers or {})
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def json_of(answer: tuple[int, http.client.HTTPMessage, bytes]) -> tuple[int, dict]:
    status, headers, data = answer
    assert headers["Content-Type"].startswith("application/json")
    return status, json.loads(data)


def test_logs_are_listed_and_filtered(api: ApiHarness):
    status, everything = json_of(request(api, "GET", "/v1/logs"))
    _, filtered = json_of(request(api, "GET", "/v1/logs?pattern=plant/%2B/temp"))
    _, only_one = json_of(request(api, "GET", "/v1/logs?pattern=plant/2/%23"))

    assert status == 200
    assert [log["topic"] for log in everything["logs"]] == ["plant/1/temp", "plant/2/temp"]
    first = everything["logs"][0]
    assert (first["start_offset"], first["end_offset"]) == (0, 10)
    assert first["bytes"] > 0 and first["last_append_ms"] == BASE_TIME_MS + 9000
    assert len(filtered["logs"]) == 2
    assert [log["topic"] for log in only_one["logs"]] == ["plant/2/temp"]


def test_one_log_is_described(api: ApiHarness):
    status, info = json_of(request(api, "GET", TEMP))

    assert status == 200
    assert (info["topic"], info["start_offset"], info["end_offset"]) == ("plant/1/temp", 0, 10)


def test_records_as_arrow_with_positions_in_headers(api: ApiHarness):
    status, headers, data = request(api, "GET", f"{TEMP}/records?offset=2&max_records=3")

    table = pa.ipc.open_stream(data).read_all()
    assert status == 200
    assert headers["Content-Type"] == "application/vnd.apache.arrow.stream"
    assert (headers["Timestone-Next-Offset"], headers["Timestone-Record-Count"]) == ("5", "3")
    assert (headers["Timestone-Start-Offset"], headers["Timestone-End-Offset"]) == ("0", "10")
    assert table.schema.remove_metadata() == ARROW_SCHEMA
    rows = table.to_pylist()
    assert [row["offset"] for row in rows] == [2, 3, 4]
    assert rows[0]["topic"] == "plant/1/temp"
    assert rows[0]["payload"] == b"\xff\xfe\x02"
    assert rows[1]["payload"] == b'{"n": 3}'
    assert rows[0]["properties"] == [("seq", "2"), ("content_type", "application/json")]
    assert rows[1]["properties"] == [("seq", "3")]
    assert int(rows[0]["timestamp"].timestamp() * 1000) == BASE_TIME_MS + 2000
    assert (rows[0]["client_id"], rows[0]["qos"], rows[0]["retain"]) == ("device-2", 1, False)


def test_records_as_json_lines(api: ApiHarness):
    status, headers, data = request(api, "GET", f"{TEMP}/records?offset=1&max_records=2&format=jsonl")

    lines = [json.loads(line) for line in data.splitlines()]
    assert status == 200
    assert headers["Content-Type"].startswith("application/x-ndjson")
    assert [line["offset"] for line in lines] == [1, 2]
    assert lines[0]["payload_text"] == '{"n": 1}'
    assert base64.b64decode(lines[1]["payload"]) == b"\xff\xfe\x02"
    assert "payload_text" not in lines[1]  # not UTF-8
    assert lines[1]["content_type"] == "application/json"
    assert lines[0]["user_properties"] == [["seq", "1"]]


def test_earliest_and_latest_offsets(api: ApiHarness):
    _, earliest, _ = request(api, "GET", f"{TEMP}/records?offset=earliest&max_records=1")
    status, latest, data = request(api, "GET", f"{TEMP}/records?offset=latest")

    assert earliest["Timestone-Next-Offset"] == "1"
    assert status == 200
    assert (latest["Timestone-Next-Offset"], latest["Timestone-Record-Count"]) == ("10", "0")
    assert pa.ipc.open_stream(data).read_all().num_rows == 0


def test_offset_for_a_timestamp(api: ApiHarness):
    status, body = json_of(request(api, "GET", f"{TEMP}/offset?timestamp_ms={BASE_TIME_MS + 4500}"))
    _, latest = json_of(request(api, "GET", f"{TEMP}/offset?timestamp_ms=latest"))

    assert (status, body["offset"], body["timestamp_ms"]) == (200, 5, BASE_TIME_MS + 4500)
    assert (latest["offset"], latest["timestamp_ms"]) == (10, "latest")


def test_a_long_poll_returns_when_a_record_arrives(api: ApiHarness):
    api.append_later("plant/2/temp", sample_record(3), delay_s=0.1)

    status, headers, data = request(api, "GET", "/v1/logs/plant%2F2%2Ftemp/records?offset=3&wait_ms=20000")

    assert status == 200
    assert headers["Timestone-Record-Count"] == "1"
    assert pa.ipc.open_stream(data).read_all().column("offset").to_pylist() == [3]


def test_a_long_poll_times_out_empty(api: ApiHarness):
    status, headers, _ = request(api, "GET", "/v1/logs/plant%2F2%2Ftemp/records?offset=3&wait_ms=50")

    assert (status, headers["Timestone-Record-Count"], headers["Timestone-Next-Offset"]) == (200, "0", "3")


def test_batch_fetch_as_arrow(api: ApiHarness):
    body = {
        "fetches": [
            {"topic": "plant/1/temp", "offset": 8},
            {"topic": "plant/2/temp", "offset": "earliest", "max_records": 2},
            {"topic": "missing", "offset": 0},
        ],
        "format": "arrow",
    }

    status, _, data = request(api, "POST", "/v1/fetch", body)

    table = pa.ipc.open_stream(data).read_all()
    results = json.loads(table.schema.metadata[b"timestone.results"])
    assert status == 200
    assert list(zip(table.column("topic").to_pylist(), table.column("offset").to_pylist(), strict=True)) == [
        ("plant/1/temp", 8),
        ("plant/1/temp", 9),
        ("plant/2/temp", 0),
        ("plant/2/temp", 1),
    ]
    assert results["plant/1/temp"] == {"next_offset": 10, "start_offset": 0, "end_offset": 10, "records": 2}
    assert results["plant/2/temp"]["next_offset"] == 2
    assert (results["missing"]["error"], results["missing"]["status"]) == ("unknown_topic", 404)


def test_batch_fetch_as_json_lines_starts_with_the_results(api: ApiHarness):
    body = {"fetches": [{"topic": "plant/2/temp", "offset": 1}], "format": "jsonl"}

    status, _, data = request(api, "POST", "/v1/fetch", body)

    first, *records = [json.loads(line) for line in data.splitlines()]
    assert status == 200
    assert first["results"]["plant/2/temp"]["next_offset"] == 3
    assert [(line["topic"], line["offset"]) for line in records] == [("plant/2/temp", 1), ("plant/2/temp", 2)]


def test_batch_fetch_shares_one_byte_budget(api: ApiHarness):
    body: dict[str, Any] = {
        "fetches": [{"topic": "plant/1/temp", "offset": 0}, {"topic": "plant/2/temp", "offset": 0}]
    }
    body["max_bytes"] = 1

    _, _, data = request(api, "POST", "/v1/fetch", body)

    table = pa.ipc.open_stream(data).read_all()
    results = json.loads(table.schema.metadata[b"timestone.results"])
    assert table.column("offset").to_pylist() == [0]  # the first topic always makes progress
    assert results["plant/2/temp"]["records"] == 0
    assert results["plant/2/temp"]["next_offset"] == 0


def test_batch_fetch_long_poll_wakes_on_a_new_matching_topic(api: ApiHarness):
    api.append_later("plant/3/temp", sample_record(0), delay_s=0.1)
    body = {"fetches": [{"topic": "plant/2/temp", "offset": 3}], "wait_ms": 20000, "pattern": "plant/+/temp"}

    status, _, data = request(api, "POST", "/v1/fetch", body)

    assert status == 200
    assert pa.ipc.open_stream(data).read_all().num_rows == 0  # woke up: the caller re-lists the logs
    _, logs = json_of(request(api, "GET", "/v1/logs?pattern=plant/3/temp"))
    assert [log["topic"] for log in logs["logs"]] == ["plant/3/temp"]


@pytest.mark.parametrize(
    "target",
    [
        f"{TEMP}/records?offset=abc",
        f"{TEMP}/records?offset=-1",
        f"{TEMP}/records?offset=9223372036854775807",
        f"{TEMP}/records?offset=18446744073709551621",
        f"{TEMP}/records?offset=1e400",
        f"{TEMP}/records?offset=1.5",
        f"{TEMP}/records?offset=0&max_records=1e400",
        f"{TEMP}/records",
        f"{TEMP}/records?offset=0&max_records=0",
        f"{TEMP}/records?offset=0&max_bytes=x",
        f"{TEMP}/records?offset=0&wait_ms=999999999",
        f"{TEMP}/records?offset=0&format=csv",
        f"{TEMP}/offset",
        f"{TEMP}/offset?timestamp_ms=soon",
        "/v1/logs?pattern=a/%23/b",
    ],
)
def test_bad_parameters_answer_400(api: ApiHarness, target: str):
    status, body = json_of(request(api, "GET", target))

    assert status == 400
    assert body["error"] in ("bad_request", "bad_offset")
    assert body["message"]


@pytest.mark.parametrize(
    ("target", "name", "count"),
    [
        (f"{TEMP}/records?offset=0&offset=5", "offset", 2),
        (f"{TEMP}/records?offset=0&max_records=1&max_records=9&max_records=3", "max_records", 3),
        ("/v1/logs?pattern=a&pattern=b", "pattern", 2),  # the listing takes one filter
        ("/v1/partitions/0/records?position=0&pattern=a&pattern=b", None, 0),  # one more filter each
    ],
)
def test_a_parameter_given_twice_is_refused_not_read_once(api: ApiHarness, target: str, name, count):
    """One of two values was read and the other dropped, whichever the reader meant."""
    if name is None:
        assert request(api, "GET", target)[0] == 200
        return
    status, body = json_of(request(api, "GET", target))
    assert (status, body) == (
        400,
        {"error": "bad_request", "message": f"{name} is given {count} times; give it once"},
    )


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        [],
        {"fetches": []},
        {"fetches": [{"offset": 0}]},
        {"fetches": [{"topic": "a", "offset": "first"}]},
        {"fetches": [{"topic": "a", "offset": 2**63 - 1}]},
        {"fetches": [{"topic": "a", "offset": 2.0}]},
        {"fetches": [{"topic": "a", "offset": True}]},
        {"fetches": [{"topic": "a", "offset": 0}], "max_bytes": 1e300},
        b'{"fetches": [{"topic": "a", "offset": 1e400}]}',
        b'{"fetches": [{"topic": "a", "offset": NaN}]}',
        {"fetches": [{"topic": "a", "offset": 0}, {"topic": "a", "offset": 1}]},
        {"fetches": [{"topic": "a", "offset": 0}], "format": "frames"},
    ],
)
def test_bad_batch_bodies_answer_400(api: ApiHarness, body: object):
    status, answer = json_of(request(api, "POST", "/v1/fetch", body))

    assert status == 400
    assert answer["error"] in ("bad_request", "bad_offset")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("format", ["jsonl"], "format must be one of ['arrow', 'jsonl'], got a list"),
        ("format", {}, "format must be one of ['arrow', 'jsonl'], got an object"),
        ("format", 1, "format must be one of ['arrow', 'jsonl'], got 1"),
        ("pattern", "a/#/b", "bad pattern: misplaced wildcard in topic filter 'a/#/b'"),
        ("pattern", "plant/te+mp", "bad pattern: misplaced wildcard in topic filter 'plant/te+mp'"),
        ("pattern", "", "bad pattern: empty topic filter"),
        ("pattern", ["plant/#"], "pattern must be a string, got a list"),
    ],
)
def test_a_bad_fetch_format_or_pattern_answers_400_naming_it_and_logs_nothing(
    api: ApiHarness, caplog, field: str, value: object, message: str
):
    caplog.set_level(logging.DEBUG)
    body = {"fetches": [{"topic": "plant/1/temp", "offset": 0}], field: value}

    status, answer = json_of(request(api, "POST", "/v1/fetch", body))

    assert (status, answer["error"], answer["parameter"], answer["message"]) == (
        400,
        "bad_request",
        field,
        message,
    )
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


def test_fetch_and_listing_refuse_the_same_patterns_alike(api: ApiHarness):
    body = {"fetches": [{"topic": "plant/1/temp", "offset": 0}], "pattern": "a/#/b"}

    fetched = json_of(request(api, "POST", "/v1/fetch", body))
    listed = json_of(request(api, "GET", "/v1/logs?pattern=a/%23/b"))

    assert fetched == listed
    assert fetched[0] == 400 and fetched[1]["parameter"] == "pattern"


def test_a_non_numeric_offset_is_a_bad_offset(api: ApiHarness):
    status, body = json_of(request(api, "GET", f"{TEMP}/records?offset=12abc"))

    assert (status, body["error"]) == (400, "bad_offset")


def test_an_offset_past_what_a_log_holds_is_a_bad_offset_naming_the_bound(api: ApiHarness):
    status, body = json_of(request(api, "GET", f"{TEMP}/records?offset=9007199254740993"))

    assert (status, body["error"], body["parameter"]) == (400, "bad_offset", "offset")
    assert (
        body["message"]
        == "offset must be within [0, 9007199254740992] (what a log holds), got 9007199254740993"
    )


def test_unknown_topics_and_routes_answer_404(api: ApiHarness):
    for target in ("/v1/logs/nope/records?offset=0", "/v1/logs/nope", "/v1/logs/nope/offset?timestamp_ms=1"):
        status, body = json_of(request(api, "GET", target))
        assert (status, body["error"], body["topic"]) == (404, "unknown_topic", "nope")
    status, body = json_of(request(api, "GET", "/v2/nothing"))
    assert (status, body["error"]) == (404, "not_found")


def test_an_offset_past_the_end_answers_416_with_the_bounds(api: ApiHarness):
    status, body = json_of(request(api, "GET", f"{TEMP}/records?offset=11"))

    assert status == 416
    assert body["error"] == "offset_out_of_range"
    assert (body["offset"], body["start_offset"], body["end_offset"]) == (11, 0, 10)


def test_an_offset_deleted_by_retention_answers_416_with_the_new_start(tmp_path):
    config = StorageConfig(group_commit_ms=1, segment_bytes=300, retention_bytes=600, retention_ms=None)
    harness = ApiHarness(tmp_path, config=config)
    try:
        harness.append("t", *(sample_record(n) for n in range(30)))

        async def retention() -> None:
            harness.store.wait_sealed()  # retention considers sealed segments only
            harness.store.apply_retention()

        harness.run(retention())
        start = harness.store.log_info("t").start_offset
        status, body = json_of(request(harness, "GET", "/v1/logs/t/records?offset=0"))
        _, headers, _ = request(harness, "GET", f"/v1/logs/t/records?offset={start}")
    finally:
        harness.close()

    assert start > 0
    assert (status, body["start_offset"], body["end_offset"]) == (416, start, 30)
    assert headers["Timestone-Start-Offset"] == str(start)


def test_a_corrupt_record_answers_500_with_the_next_offset(tmp_path):
    config = write_damaged_log(tmp_path)
    harness = ApiHarness(tmp_path, config=config)
    try:
        status, body = json_of(request(harness, "GET", "/v1/logs/t/records?offset=1"))
        _, _, before = request(harness, "GET", "/v1/logs/t/records?offset=0")
        _, _, after = request(harness, "GET", "/v1/logs/t/records?offset=2")
    finally:
        harness.close()

    assert (status, body["error"], body["offset"], body["next_offset"]) == (500, "corrupt_record", 1, 2)
    assert pa.ipc.open_stream(before).read_all().column("offset").to_pylist() == [0]
    assert pa.ipc.open_stream(after).read_all().column("offset").to_pylist() == [2]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN])
def test_a_missing_or_wrong_token_answers_401(secured_api: ApiHarness, authorization: str | None):
    headers = {"Authorization": authorization} if authorization else {}

    status, response_headers, data = request(secured_api, "GET", "/v1/logs", headers=headers)

    assert status == 401
    assert response_headers["WWW-Authenticate"].startswith("Bearer")
    assert json.loads(data)["error"] == "unauthorized"


def test_the_right_token_is_let_in(secured_api: ApiHarness):
    status, body = json_of(
        request(secured_api, "GET", "/v1/logs", headers={"Authorization": f"Bearer {TOKEN}"})
    )

    assert status == 200
    assert [log["topic"] for log in body["logs"]] == ["plant/1/temp"]


def test_concurrent_long_polls_are_all_woken(api: ApiHarness):
    answers: list[tuple[int, str]] = []

    def poll() -> None:
        status, headers, _ = request(api, "GET", "/v1/logs/plant%2F2%2Ftemp/records?offset=3&wait_ms=20000")
        answers.append((status, headers["Timestone-Record-Count"]))

    threads = [threading.Thread(target=poll) for _ in range(5)]
    for thread in threads:
        thread.start()
    api.append_later("plant/2/temp", sample_record(3), delay_s=0.2)
    for thread in threads:
        thread.join(timeout=30)

    assert answers == [(200, "1")] * 5
