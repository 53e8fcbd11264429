"""Readers that go away in the middle of an answer, or stop reading it: the broker frees what the answer
held and says so quietly, and other readers are served."""

from __future__ import annotations

import http.client
import logging
import socket
import struct
import time
from pathlib import Path

import pytest

from broker_edge.storage import LogStore
from tests.e2e.offsets_api.api_harness import ApiHarness, sample_record


def status_of(harness: ApiHarness, target: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", harness.port, timeout=10)
    try:
        connection.request("GET", target)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


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

    assert status_of(fleet, "/v1/logs?pattern=fleet/00001/%2B") == 200
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert not errors, [r.getMessage() for r in errors]
    assert any("closed its connection" in r.getMessage() for r in caplog.records)
