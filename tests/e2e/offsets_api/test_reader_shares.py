"""One reader's token cannot take the whole HTTP memory budget from the others on a real broker: answers
it has not taken yet, fetched side by side, stop at half of what readers may hold."""

from __future__ import annotations

import socket
import time

from tests.e2e.broker_clients import PahoClient
from tests.e2e.offsets_api.api_harness import status_of

READERS = [
    {"name": "greedy", "token": "greedy-secret", "topics": ["#"]},
    {"name": "spark", "token": "spark-secret", "topics": ["#"]},
]
BUDGET = {
    "messages_per_second_per_client": 0,
    "http_buffer_bytes": 40 << 20,
    "http_buffer_members_bytes": 2 << 20,
}
"""Readers share 38 MiB; one reader may hold 19 MiB, or one answer of any size when it holds nothing."""
READ = "/v1/logs/big/records?offset=0&max_bytes=16777216&format=frames"
"""The whole 12 MB of ``big``."""


def fetch_not_read(port: int, token: str) -> socket.socket:
    """A fetch of ``READ`` whose answer is not read (yet): the broker holds it."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {READ} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    return sock


def test_one_reader_fetching_side_by_side_leaves_the_other_readers_their_share(brokers):
    """Three 12 MB answers of one reader, taken slowly (at the minimum rate they may hold on for minutes),
    held 36 of the readers' 38 MiB, and every other reader's fetch got 503 until they were taken."""
    running = brokers(limits=BUDGET, offsets_api={"tokens": READERS})
    publisher = PahoClient(running.port, "pub")
    for number in range(60):
        publisher.publish("big", bytes([65 + number % 26]) * 200_000, 1)
    port = running.broker.offsets_port
    greedy = [fetch_not_read(port, "greedy-secret")]
    deadline = time.monotonic() + 5
    while running.broker.http_budget.held < 11_000_000:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    greedy += [fetch_not_read(port, "greedy-secret") for _ in range(2)]
    time.sleep(0.3)

    assert status_of(port, READ, "spark-secret") == 200  # another reader still has its share
    refused = [sock.recv(12) for sock in greedy[1:]]  # the greedy reader's own fetches beyond its half
    assert refused == [b"HTTP/1.1 503"] * 2
    for sock in greedy:
        sock.close()
