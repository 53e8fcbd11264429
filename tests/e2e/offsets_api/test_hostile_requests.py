"""Requests a stranger or a careless tool sends the offsets API over a raw socket (bytes HTTP clients would
never send), answered with a clear status and a JSON error, and no traceback in the broker's log."""

from __future__ import annotations

import json
import logging
import socket

import pytest

from tests.e2e.offsets_api.api_harness import TOKEN, ApiHarness


def answer_to(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """The status, headers and body the API answers to ``request`` (sent as is, read until closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), headers, body


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
