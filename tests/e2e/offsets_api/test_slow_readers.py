"""Readers that take their answer slowly enough never to stall their connection (a few KiB now and then)
on a real broker: such an answer must not keep its share of the HTTP memory budget for hours."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time

from broker_edge.offsets_api.requests import ApiLimits
from broker_edge.storage import LogStore
from tests.e2e.broker_clients import PahoClient
from tests.e2e.offsets_api.api_harness import TOKEN, ApiHarness, logged_errors, sample_record, status_of

READERS = [
    {"name": "slow-notebook", "token": "slow-secret", "topics": ["#"]},
    {"name": "spark", "token": "spark-secret", "topics": ["#"]},
]
BUDGET = {
    "messages_per_second_per_client": 0,
    "http_buffer_bytes": 12 << 20,
    "http_buffer_members_bytes": 2 << 20,
}
"""Readers share 10 MiB: one 8 MiB fetch at a time."""
BIG_READ = "/v1/logs/big/records?offset=0&max_bytes=8388608&format=frames"


def trickle_reader(port: int, target: str, token: str, got: list[int]) -> threading.Thread:
    """A reader that sends ``target`` and takes its answer 48 KiB every 0.25 s (never stalled for long),
    counting what it got in ``got``, until the answer ends or its connection is closed."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    head = f"GET {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n"
    sock.sendall(head.encode() + b"\r\n")
    sock.settimeout(10)

    def trickle() -> None:
        with sock, contextlib.suppress(OSError):
            while True:
                taken = 0
                while taken < 48 * 1024:
                    piece = sock.recv(48 * 1024 - taken)
                    if not piece:
                        return
                    taken += len(piece)
                    got[0] += len(piece)
                time.sleep(0.25)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    return thread


def test_an_answer_taken_slower_than_the_minimum_rate_is_dropped_and_frees_the_budget(brokers, caplog):
    """A reader taking 48 KiB every 0.25 s (192 KiB/s: its connection never stalls) held its 6.4 MB answer,
    and the budget with it, for 33 s; with ``min_read_bytes_per_s`` 4 MiB/s it has 1 s (the request
    timeout) plus 1.5 s for it, then its connection is closed, the budget freed, and one line names it."""
    caplog.set_level(logging.INFO)
    api = {"tokens": READERS, "request_timeout_s": 1.0, "min_read_bytes_per_s": 4 << 20}
    running = brokers(limits=BUDGET, offsets_api=api)
    publisher = PahoClient(running.port, "pub")
    for number in range(32):
        publisher.publish("big", bytes([65 + number % 26]) * 200_000, 1)
    port = running.broker.offsets_port
    got = [0]
    started = time.monotonic()
    reader = trickle_reader(port, BIG_READ, "slow-secret", got)
    while running.broker.http_budget.held < 6_000_000:
        assert time.monotonic() - started < 5
        time.sleep(0.05)
    assert status_of(port, BIG_READ) == 503  # the slow answer holds the budget

    while status_of(port, BIG_READ) != 200:
        assert time.monotonic() - started < 6, "a reader taking its answer slowly still holds the budget"
        time.sleep(0.2)
    reader.join(10)
    assert not reader.is_alive() and 0 < got[0] < 6_400_000  # cut short, its connection closed
    lines = [r for r in caplog.records if getattr(r, "reason", None) == "http_slow_reader"]
    assert lines and "slow-notebook" in lines[0].getMessage() and lines[0].peer == "127.0.0.1"
    assert not logged_errors(caplog.records)


def test_a_reader_that_takes_its_answer_at_the_minimum_rate_gets_it_whole(brokers):
    api = {"tokens": READERS, "request_timeout_s": 1.0, "min_read_bytes_per_s": 64 << 10}
    running = brokers(limits=BUDGET, offsets_api=api)
    publisher = PahoClient(running.port, "pub")
    for number in range(2):
        publisher.publish("big", bytes([65 + number]) * 200_000, 1)
    got = [0]
    reader = trickle_reader(running.broker.offsets_port, BIG_READ, "slow-secret", got)
    reader.join(15)
    assert not reader.is_alive() and got[0] > 400_000  # 192 KiB/s, over the 64 KiB/s asked: served whole


def test_a_listing_taken_slower_than_the_minimum_rate_is_cut_and_its_connection_freed(tmp_path, caplog):
    """A listing is written as it is made, its length unknown: taken at 192 KiB/s (never stalled), a
    listing of 8,000 long topics (8.9 MB) kept its connection busy for 45 s, and a reader doing so on every
    connection kept every other reader out (503); the bytes it has taken must keep up with the minimum rate
    too, after ``request_timeout_s``."""
    caplog.set_level(logging.INFO)
    limits = ApiLimits(max_connections=1, request_timeout_s=1.0, min_read_bytes_per_s=2 << 20)
    harness = ApiHarness(tmp_path / "store", token=TOKEN, limits=limits)
    try:

        async def fill(store: LogStore) -> None:
            for number in range(8000):
                store.append(f"fleet/{number:05d}/" + "x" * 1000, sample_record(1))
            await store.wait_durable()

        harness.run(fill(harness.store))
        got = [0]
        started = time.monotonic()
        reader = trickle_reader(harness.port, "/v1/logs", TOKEN, got)
        time.sleep(0.3)
        assert status_of(harness.port, "/v1/logs?pattern=none", TOKEN) == 503  # the listing holds the cap
        while status_of(harness.port, "/v1/logs?pattern=none", TOKEN) != 200:
            assert time.monotonic() - started < 8, "a listing taken slowly still holds its connection"
            time.sleep(0.2)
        reader.join(10)
        assert not reader.is_alive() and 0 < got[0] < 8_800_000  # cut short, its connection closed
    finally:
        harness.close()
    lines = [r for r in caplog.records if getattr(r, "reason", None) == "http_slow_reader"]
    assert lines and lines[0].peer == "127.0.0.1"
    assert not logged_errors(caplog.records)
