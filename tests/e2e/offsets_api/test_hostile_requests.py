"""Requests a stranger or a careless tool sends the offsets API over a raw socket (bytes HTTP clients would
never send), answered with a clear status and a JSON error, and no traceback in the broker's log."""

from __future__ import annotations

import json
import logging
import socket
import time

import pytest

from tests.e2e.offsets_api.api_harness import TOKEN, ApiHarness, sample_record
from tests.e2e.refusals.test_http_errors_and_endpoints import answer_to


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and r.name.startswith(("aiohttp", "broker_edge"))]


@pytest.mark.parametrize(
    "secret",
    [b"s3cr\xe9t", b"\xff\xfe", TOKEN.encode() + b"\x80"],
    ids=["latin-1", "bytes", "token-and-a-byte"],
)
def test_a_token_that_is_not_utf8_answers_401_not_500(
    secured_api: ApiHarness, caplog: pytest.LogCaptureFixture, secret: bytes
):
    caplog.set_level(logging.DEBUG)
    request = b"GET /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + secret + b"\r\n\r\n"

    status, headers, body = answer_to(secured_api.port, request)

    assert (status, json.loads(body)["error"]) == (401, "unauthorized")
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert not tracebacks(caplog)


@pytest.mark.parametrize("version", [b"HTTP/2.0", b"HTTP/0.9"])
@pytest.mark.parametrize("target", [b"/v1/logs", b"/v1/logs/plant%2F1%2Ftemp/records?offset=0"])
def test_a_request_line_of_another_http_version_answers_505(
    api: ApiHarness, caplog: pytest.LogCaptureFixture, version: bytes, target: bytes
):
    caplog.set_level(logging.DEBUG)

    status, headers, body = answer_to(api.port, b"GET " + target + b" " + version + b"\r\nHost: x\r\n\r\n")

    assert status == 505
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(body)["error"] == "http_version_not_supported"
    assert not tracebacks(caplog)


@pytest.mark.parametrize("coding", [b"gzip, chunked", b"deflate,chunked", b"identity, chunked"])
def test_a_body_in_a_transfer_coding_other_than_chunked_answers_501(
    api: ApiHarness, caplog: pytest.LogCaptureFixture, coding: bytes
):
    """RFC 9112, 6.1: a transfer coding the server does not know is refused, not read as if absent."""
    caplog.set_level(logging.DEBUG)
    body = b'{"fetches": [{"topic": "plant/1/temp", "offset": 0}], "format": "jsonl"}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    request = b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + coding + b"\r\n\r\n" + chunked

    status, headers, answer = answer_to(api.port, request)

    assert status == 501
    assert headers["Content-Type"].startswith("application/json")
    assert json.loads(answer)["error"] == "not_implemented"
    assert not tracebacks(caplog)


def test_a_chunked_body_is_read(api: ApiHarness):
    body = b'{"fetches": [{"topic": "plant/1/temp", "offset": 0}], "format": "jsonl", "max_records": 1}'
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (9, body[:9], len(body) - 9, body[9:])
    request = b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"

    status, _, answer = answer_to(api.port, request + chunked)

    assert status == 200
    assert json.loads(answer.splitlines()[0])["results"]["plant/1/temp"]["records"] == 1


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/logs/a%b/records?offset=0&format=jsonl",  # a log named a%b exists: it is not what was sent
        b"/v1/logs/%ZZ",
        b"/v1/logs/plant%2F1%2",
        b"/v1/logs/%FF%FE/records?offset=0",  # bytes that are not UTF-8
        b"/v1/logs/plant%2F1%2Ftemp/records?offset=0&format=jsonl&x=%C3",
        b"/v1/logs?pattern=%FF",
        b"/v1/logs?pattern=a%",
        b"/v1/partitions/0/records?position=0&pattern=%E2%82",
    ],
)
def test_a_target_whose_escapes_are_malformed_or_not_utf8_answers_400(
    api: ApiHarness, caplog: pytest.LogCaptureFixture, target: bytes
):
    """A '%' not followed by two hex digits, or escapes of bytes that are not UTF-8, are refused: taken as
    they come they named another topic or filter than the one meant (a%b was read as the log 'a%b')."""
    caplog.set_level(logging.DEBUG)
    api.append("a%b", sample_record(0))
    api.append("%FF%FE", sample_record(0))

    status, headers, body = answer_to(
        api.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )

    assert status == 400, body
    assert headers["Content-Type"].startswith("application/json")
    answer = json.loads(body)
    assert answer["error"] == "bad_request" and "%" in answer["message"]
    assert not tracebacks(caplog)


def test_a_topic_with_percent_signs_is_read_with_them_escaped(api: ApiHarness):
    api.append("a%b", sample_record(0))
    target = b"/v1/logs/a%25b/records?offset=0&format=jsonl"

    status, _, body = answer_to(
        api.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )

    assert status == 200
    assert json.loads(body)["topic"] == "a%b"


@pytest.mark.parametrize(
    ("body", "name"),
    [
        (
            b'{"fetches": [{"topic": "plant/1/temp", "offset": 0}], "max_records": 1, "max_records": 9}',
            "max_records",
        ),
        (b'{"fetches": [{"topic": "plant/1/temp", "offset": 0, "offset": 5}], "format": "jsonl"}', "offset"),
        (b'{"fetches": [{"topic": "plant/1/temp", "topic": "plant/2/temp", "offset": 0}]}', "topic"),
        (b'{"fetches": [], "fetches": [{"topic": "plant/1/temp", "offset": 0}]}', "fetches"),
    ],
)
def test_a_fetch_body_naming_a_field_twice_answers_400_naming_it(
    api: ApiHarness, caplog: pytest.LogCaptureFixture, body: bytes, name: str
):
    """As a query parameter given twice: one of the two would be read and the other silently dropped."""
    caplog.set_level(logging.DEBUG)
    head = b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(
        body
    )

    status, _, answer = answer_to(api.port, head + body)

    assert status == 400
    error = json.loads(answer)
    assert (error["error"], error["parameter"]) == ("bad_request", "body")
    assert error["message"] == f"{name} is given 2 times in one object; give it once"
    assert not tracebacks(caplog)


FETCH_BODY = b'{"fetches": [{"topic": "plant/1/temp", "offset": 0}], "format": "jsonl", "max_records": 1}'


def expect_continue(
    port: int, authorization: bytes, expectation: bytes = b"100-continue"
) -> tuple[bytes, bytes]:
    """What the API answers to a fetch's headers asking ``Expect``, then (when it invites the body) to the
    body: the first answer and the rest."""
    head = (
        b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\n" + authorization + b"Expect: " + expectation + b"\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(FETCH_BODY)
    )
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        first = sock.recv(65536)
        rest = b""
        if first.startswith(b"HTTP/1.1 100"):
            sock.sendall(FETCH_BODY)
            while more := sock.recv(65536):
                rest += more
    return first, rest


def test_expect_100_continue_invites_the_body_of_an_admitted_reader_only(secured_api: ApiHarness):
    """A stranger is answered 401 at once and never invited to send its body (RFC 9110, 10.1.1)."""
    admitted = expect_continue(secured_api.port, b"Authorization: Bearer " + TOKEN.encode() + b"\r\n")
    stranger = expect_continue(secured_api.port, b"")

    assert admitted[0].startswith(b"HTTP/1.1 100 Continue") and admitted[1].startswith(b"HTTP/1.1 200")
    assert stranger[0].startswith(b"HTTP/1.1 401") and stranger[1] == b""
    assert json.loads(stranger[0].partition(b"\r\n\r\n")[2])["error"] == "unauthorized"


def test_an_expectation_other_than_100_continue_answers_417_in_json(api: ApiHarness):
    first, _ = expect_continue(api.port, b"", b"200-ok")

    head, _, body = first.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 417") and b"application/json" in head
    assert json.loads(body)["error"] == "expectation_failed"


@pytest.mark.parametrize("second", [b"Bearer wrong", TOKEN.encode()], ids=["then-wrong", "twice"])
def test_a_request_with_two_authorization_headers_answers_400(secured_api: ApiHarness, second: bytes):
    """Authorization is one field (RFC 9110, 5.3): of two, one would be read and the other ignored, and
    which one a proxy on the way read is anyone's guess."""
    request = (
        b"GET /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + TOKEN.encode() + b"\r\n"
        b"Authorization: "
        + (b"Bearer " + second if not second.startswith(b"Bearer") else second)
        + b"\r\n\r\n"
    )

    status, _, body = answer_to(secured_api.port, request)

    assert status == 400
    assert json.loads(body) == {
        "error": "bad_request",
        "message": "Authorization is given 2 times; give it once",
    }


def test_a_fetch_body_said_to_be_over_the_bound_answers_413_before_it_is_sent(api: ApiHarness):
    """Its Content-Length says it all: the client is not kept waiting for a body that will be refused
    (it waited request_timeout_s, then got 408)."""
    request = b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n"
    started = time.monotonic()

    with socket.create_connection(("127.0.0.1", api.port), timeout=5) as sock:
        sock.sendall(request)
        answer = sock.makefile("rb")
        status = int(answer.readline().split()[1])
        headers = dict(line.decode().strip().split(": ", 1) for line in iter(answer.readline, b"\r\n"))
        body = answer.read(int(headers["Content-Length"]))

    assert time.monotonic() - started < 2
    assert status == 413 and headers["Connection"] == "close"
    assert json.loads(body) == {
        "error": "request_entity_too_large",
        "message": "the body is 2000000 bytes; a fetch's is at most 1048576",
        "parameter": "body",
    }


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/logs/plant/1/temp/records?offset=0",
        b"/v1/logs/plant/1/temp",
        b"/v1/logs/plant/1/temp/offset?timestamp_ms=0",
    ],
)
def test_a_topic_sent_with_its_slashes_answers_404_saying_how_to_send_it(api: ApiHarness, target: bytes):
    """The first thing a curl user gets wrong: the answer says what to do, not just 'Not Found'."""
    status, _, body = answer_to(
        api.port, b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )

    assert status == 404
    error = json.loads(body)
    assert error["error"] == "not_found"
    assert "%2F" in error["message"] and "plant%2F1%2Ftemp" in error["message"]


def test_a_body_said_to_be_over_the_bound_is_not_invited_by_100_continue(api: ApiHarness):
    head = b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2000000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", api.port), timeout=5) as sock:
        sock.sendall(head)
        first = sock.recv(65536)

    assert first.startswith(b"HTTP/1.1 413")
    assert json.loads(first.partition(b"\r\n\r\n")[2])["error"] == "request_entity_too_large"
