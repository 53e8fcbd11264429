"""Readers that go away in the middle of an answer, or stop reading it: the broker frees what the answer
held and says so quietly, and other readers are served."""

from __future__ import annotations

import contextlib
import http.client
import logging
import socket
import ssl
import struct
import time
from pathlib import Path

import pytest

from broker_edge.offsets_api.requests import ApiLimits
from broker_edge.security.http_budget import MemoryBudget
from broker_edge.storage import AppendRecord, LogStore
from tests.e2e.offsets_api.api_harness import ApiHarness, logged_errors, sample_record, status_of
from tests.tls_certs import client_ssl_context, make_test_pki

MIB = 1 << 20
BIG_READ = f"/v1/logs/big/records?offset=0&max_bytes={25 * MIB}&format=frames"
"""The whole 24 MiB of the ``big`` log: 24 of a 25 MiB budget."""
ANOTHER_READ = f"/v1/logs/big/records?offset=0&max_bytes={2 * MIB}&format=frames"


def reader_that_stops(port: int, target: str) -> socket.socket:
    """A connection that sends ``target``'s request and then reads nothing (a small receive buffer)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


def reset(sock: socket.socket) -> None:
    """Close ``sock`` with a TCP reset, as a reader killed in the middle of an answer does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.fixture
def fleet(tmp_path: Path):
    """An API over 20,000 device logs (a listing of 20 chunks, 2 MB)."""
    harness = ApiHarness(tmp_path / "store")

    async def fill(store: LogStore) -> None:
        record = sample_record(1)
        for number in range(20_000):
            store.append(f"fleet/{number:05d}/status", record)
        await store.wait_durable()

    harness.run(fill(harness.store))
    yield harness
    harness.close()


def test_a_reader_gone_in_the_middle_of_a_listing_leaves_no_error(fleet: ApiHarness, caplog):
    caplog.set_level(logging.DEBUG)
    sock = reader_that_stops(fleet.port, "/v1/logs")
    assert sock.recv(1024).startswith(b"HTTP/1.1 200")

    reset(sock)
    time.sleep(0.3)

    assert status_of(fleet.port, "/v1/logs?pattern=fleet/00001/%2B", timeout_s=10) == 200
    errors = logged_errors(caplog.records)
    assert not errors, [r.getMessage() for r in errors]
    assert any("closed its connection" in r.getMessage() for r in caplog.records)


@pytest.fixture
def big_log(tmp_path: Path):
    """An API within a 25 MiB budget whose answers nobody takes for 1 s are dropped, over a 24 MiB log."""
    limits = ApiLimits(send_timeout_s=1.0)
    harness = ApiHarness(tmp_path / "store", limits=limits, budget=MemoryBudget(25 * MIB))
    payload = bytes(range(256)) * (MIB // 256)
    harness.append("big", *(AppendRecord(payload=payload, qos=1) for _ in range(24)))
    yield harness
    harness.close()


def test_an_answer_nobody_reads_is_dropped_and_frees_the_budget(big_log: ApiHarness, caplog):
    caplog.set_level(logging.DEBUG)
    stalled = reader_that_stops(big_log.port, BIG_READ)
    another = ANOTHER_READ
    time.sleep(0.2)
    assert status_of(big_log.port, another, timeout_s=10) == 503  # the stalled answer holds 24 of the 25 MiB

    deadline = time.monotonic() + 5
    while status_of(big_log.port, another, timeout_s=10) != 200:
        assert time.monotonic() < deadline, "the budget is still held by an answer nobody reads"
        time.sleep(0.2)

    stalled.settimeout(5)
    answer = b""
    with contextlib.suppress(ConnectionResetError):
        while more := stalled.recv(1 << 16):
            answer += more
    stalled.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(body) < 24 * MIB  # cut short: never taken whole
    assert any("took none of its answer" in r.getMessage() for r in caplog.records)
    assert not logged_errors(caplog.records)


def test_a_slow_reader_that_keeps_reading_gets_its_whole_answer(big_log: ApiHarness):
    sock = reader_that_stops(big_log.port, BIG_READ)
    sock.settimeout(5)
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    length = int(next(line for line in head.split(b"\r\n") if line.startswith(b"Content-Length")).split()[1])
    received = len(head.partition(b"\r\n\r\n")[2])
    pause_until = time.monotonic() + 0.6  # under the 1 s a stalled answer is given, between reads
    while received < length:
        if time.monotonic() > pause_until:
            time.sleep(0.6)
            pause_until = time.monotonic() + 0.6
        received += len(sock.recv(1 << 20))
    sock.close()

    assert received == length  # (24 MiB, taken in pieces with pauses shorter than the 1 s)


def test_a_tls_answer_nobody_reads_holds_the_budget_until_it_is_dropped(tmp_path: Path, caplog):
    """Over TLS, an answer written whole was encrypted whole into the socket's buffer: the budget let go of
    it at once, and the 24 MiB stayed there for as long as the connection (for ever: nobody reads it)."""
    caplog.set_level(logging.DEBUG)
    pki = make_test_pki(tmp_path / "pki")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(pki.server_cert, pki.server_key)
    limits = ApiLimits(send_timeout_s=1.0)
    harness = ApiHarness(tmp_path / "store", ssl_context=server, limits=limits, budget=MemoryBudget(25 * MIB))
    try:
        payload = bytes(range(256)) * (MIB // 256)
        harness.append("big", *(AppendRecord(payload=payload, qos=1) for _ in range(24)))
        context = client_ssl_context(pki)
        stalled = context.wrap_socket(socket.socket(), server_hostname="127.0.0.1")
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.connect(("127.0.0.1", harness.port))
        stalled.sendall(f"GET {BIG_READ} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(0.3)

        def status() -> int:
            connection = http.client.HTTPSConnection("127.0.0.1", harness.port, context=context, timeout=10)
            try:
                connection.request("GET", ANOTHER_READ)
                response = connection.getresponse()
                response.read()
                return response.status
            finally:
                connection.close()

        assert status() == 503  # the answer is held, not yet sent
        deadline = time.monotonic() + 5
        while status() != 200:
            assert time.monotonic() < deadline, "the budget is still held by an answer nobody reads"
            time.sleep(0.2)
        stalled.close()
    finally:
        harness.close()
    assert any("took none of its answer" in r.getMessage() for r in caplog.records)
