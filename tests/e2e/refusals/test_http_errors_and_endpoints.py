"""HTTP requests the parser refuses, and bodies the broker cannot read, are answered in JSON with one
WARNING, no traceback (a client gone before its body arrived leaves one DEBUG line); a port taken by
another process names the endpoint that wanted it; the start-up log lists every endpoint and the security
files in force."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import subprocess
import sys
import time

import pytest
import yaml

from broker_edge.http import json_errors
from broker_edge.observe.refusal_log import RefusalLog
from broker_edge.runtime.launcher import BrokerProcess, free_port
from tests.e2e.broker_clients import wait_for

MALFORMED = [
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",  # a header without a colon
    b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40,  # a TLS ClientHello on plain HTTP
]


def answer_to(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in header_lines)
    return int(status_line.split()[1]), headers, body


def test_parser_errors_are_json_and_leave_no_traceback(start_broker, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    broker = start_broker(storage={}, offsets_api={"enabled": True, "port": 0})
    for port in (broker.broker.admin_port, broker.broker.offsets_port):
        for request in MALFORMED:
            status, headers, body = answer_to(port, request)
            assert status == 400, body
            assert headers["Content-Type"].startswith("application/json")
            document = json.loads(body)
            assert document["error"] == "bad_request" and document["message"]
    assert not [r for r in caplog.records if r.exc_info and r.name.startswith(("aiohttp", "broker_edge"))]
    refused = [r for r in caplog.records if getattr(r, "reason", None) == "http_bad_request"]
    assert refused and all(r.levelno == logging.WARNING and r.peer == "127.0.0.1" for r in refused)


OVERSIZED = [
    pytest.param(
        b"GET /metrics?x=" + b"a" * 100_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long", id="url"
    ),
    pytest.param(
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n",
        431,
        "request_header_fields_too_large",
        id="header",
    ),
    pytest.param(  # most of it still unsent or unread when the answer leaves: the close must not reset it
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4_000_000 + b"\r\n\r\n",
        431,
        "request_header_fields_too_large",
        id="header-of-4-MB",
    ),
    pytest.param(
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: a\r\n" % n for n in range(5000)) + b"\r\n",
        431,
        "request_header_fields_too_large",
        id="header-count",
    ),
]


@pytest.mark.parametrize(("request_bytes", "status", "error"), OVERSIZED)
def test_a_target_or_headers_over_the_bounds_answer_414_or_431_in_json(
    start_broker, caplog, request_bytes, status, error
):
    """A URL of 100 KB is 'URI Too Long' and too large or too many headers 'Request Header Fields Too
    Large' (RFC 9110 15.5.15, RFC 6585 5), not a 400 echoing the stranger's bytes."""
    caplog.set_level(logging.DEBUG)
    broker = start_broker(storage={}, offsets_api={"enabled": True, "port": 0})
    for port in (broker.broker.admin_port, broker.broker.offsets_port):
        answered, headers, body = answer_to(port, request_bytes)
        assert answered == status, body
        assert headers["Content-Type"].startswith("application/json")
        document = json.loads(body)
        assert document["error"] == error and "aaaa" not in document["message"]
    assert not tracebacks(caplog)


def encoded(method: str, path: str, body: bytes, encoding: str = "gzip") -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Encoding: {encoding}\r\n"
    return head.encode() + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body


FETCH = json.dumps({"fetches": [{"topic": "t", "offset": 0}], "format": "jsonl"}).encode()


def tracebacks(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and r.name.startswith(("aiohttp", "broker_edge"))]


@pytest.fixture
def fresh_refusal_log(monkeypatch):
    """The refusal lines start within their allowance (other tests of the process may have used it)."""
    monkeypatch.setattr(json_errors, "_refusals", RefusalLog())


@pytest.mark.parametrize(
    ("endpoint", "request_bytes"),
    [
        pytest.param("offsets", encoded("POST", "/v1/fetch", b"abcd"), id="fetch-not-gzip"),
        pytest.param("offsets", encoded("POST", "/v1/fetch", gzip.compress(FETCH)), id="fetch-gzip"),
        pytest.param("offsets", encoded("POST", "/v1/fetch", FETCH, "br"), id="fetch-br"),
        # GETs whose handlers never read a body
        pytest.param("admin", encoded("GET", "/metrics", b"abcd"), id="metrics-not-gzip"),
        pytest.param("admin", encoded("GET", "/health", b"abcd", "deflate"), id="health-not-deflate"),
    ],
)
def test_an_encoded_body_is_refused_with_415_one_warning_and_no_traceback(
    start_broker, caplog, fresh_refusal_log, endpoint, request_bytes
):
    caplog.set_level(logging.DEBUG)
    broker = start_broker(storage={}, offsets_api={"enabled": True, "port": 0})
    port = broker.broker.offsets_port if endpoint == "offsets" else broker.broker.admin_port
    status, headers, body = answer_to(port, request_bytes)
    assert status == 415, body
    assert headers["Content-Type"].startswith("application/json") and headers["Accept-Encoding"] == "identity"
    document = json.loads(body)
    assert document["error"] == "unsupported_encoding" and "Content-Encoding" in document["message"]
    time.sleep(0.2)  # what the broker would log once the answer is sent
    assert not tracebacks(caplog)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    [refused] = [r for r in caplog.records if getattr(r, "reason", None) == "http_bad_request"]
    assert refused.levelno == logging.WARNING and "Content-Encoding" in refused.getMessage()


def test_a_body_said_to_be_identity_encoded_is_read(start_broker):
    broker = start_broker(storage={}, offsets_api={"enabled": True, "port": 0})
    status, _, body = answer_to(broker.broker.offsets_port, encoded("POST", "/v1/fetch", FETCH, "identity"))
    assert status == 200, body
    assert json.loads(body.splitlines()[0])["results"]["t"]["error"] == "unknown_topic"


def test_a_client_gone_before_its_body_arrived_leaves_one_quiet_line(start_broker, caplog):
    caplog.set_level(logging.DEBUG)
    broker = start_broker(storage={}, offsets_api={"enabled": True, "port": 0})
    with socket.create_connection(("127.0.0.1", broker.broker.offsets_port), timeout=5) as sock:
        sock.sendall(b'POST /v1/fetch HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"fe')
        time.sleep(0.3)  # the handler waits for the rest of the body
    gone = "closed its connection before its request body arrived"
    assert wait_for(lambda: any(gone in r.getMessage() for r in caplog.records))
    time.sleep(0.2)
    [line] = [r for r in caplog.records if gone in r.getMessage()]
    assert line.levelno == logging.DEBUG
    assert not tracebacks(caplog)
    assert not [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING
        and r.name.startswith(("aiohttp", "broker_edge.http", "broker_edge.offsets_api"))
    ]


def test_a_taken_admin_port_is_named_with_its_endpoint(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = {
            "listeners": [{"name": "mqtt", "port": free_port()}],
            "admin_http": {"port": port},
            "offsets_api": {"port": free_port()},
            "storage": {"directory": str(tmp_path / "data")},
        }
        (tmp_path / "broker.yaml").write_text(yaml.safe_dump(config))
        command = [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(tmp_path / "broker.yaml")]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"admin_http cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_start_up_log_lists_every_endpoint_and_the_security_in_force(tmp_path):
    acl = tmp_path / "acl.yaml"
    acl.write_text(yaml.safe_dump({"rules": [{"permission": "allow", "action": "all", "topic": "#"}]}))
    broker = BrokerProcess(tmp_path, acl={"file": str(acl)}).start()
    try:
        assert wait_for(lambda: "broker started" in broker.log_path.read_text())
        text = broker.log_path.read_text()
    finally:
        broker.stop()
    assert f"listening: mqtt tcp on 127.0.0.1:{broker.port}" in text
    assert f"offsets API on http://127.0.0.1:{broker.offsets_port} (no token (loopback only))" in text
    assert f"admin HTTP (/metrics, /health) on http://127.0.0.1:{broker.admin_port}" in text
    assert f"security: password file none; ACL 1 rules, default deny, file {acl}" in text
    assert f"data directory {tmp_path / 'data'} (locked by this broker)" in text


def answer_before_the_body(port: int, head: bytes, body: bytes) -> tuple[bytes, bytes]:
    """The head and body of the first answer to a request's ``head``, which is read before its ``body`` is
    sent (then sent all the same, as RFC 9110 lets a client do, and the connection closed)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
        answer, _, answer_body = data.partition(b"\r\n\r\n")
        said = [line for line in answer.split(b"\r\n") if line.lower().startswith(b"content-length:")]
        while len(answer_body) < (int(said[0].split(b":")[1]) if said else 0) and (chunk := sock.recv(65536)):
            answer_body += chunk
        sock.sendall(body)
    return answer, answer_body


def test_a_request_no_route_takes_is_not_invited_to_send_its_body(start_broker):
    """``Expect: 100-continue`` to a path no route serves, or with a method its path does not take, was
    answered '100 Continue' before its 404 or 405 (before a stranger's 401 on an offsets API with a token,
    which docs/offsets-api.md says never invites one): a body nobody reads was asked for (RFC 9110
    10.1.1). The refusal comes at once."""
    broker = start_broker(
        storage={}, offsets_api={"enabled": True, "port": 0, "token": "t0ken-of-the-tests-12345"}
    )
    for port, request_line, status in (
        (broker.broker.admin_port, b"POST /metrics", 405),
        (broker.broker.admin_port, b"PUT /nowhere", 404),
        (broker.broker.offsets_port, b"POST /v1/nowhere", 401),
        (broker.broker.offsets_port, b"PUT /v1/logs", 401),
    ):
        head = request_line + b" HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n"
        answer, body = answer_before_the_body(port, head, b"x" * 100)
        assert answer.startswith(b"HTTP/1.1 %d " % status), (request_line, answer)
        assert json.loads(body)["error"]
