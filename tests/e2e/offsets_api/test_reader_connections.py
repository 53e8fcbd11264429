"""One reader's token cannot hold every connection of the offsets API on a real broker: at its share of
``offsets_api.max_connections`` (``reader_share``), a request of it first closes one of its own idle
connections or has its own longest long poll answer, else it is answered 503 at once, so that the other
readers keep the rest."""

from __future__ import annotations

import socket
import time

import pytest

from tests.e2e.broker_clients import PahoClient
from tests.e2e.offsets_api.api_harness import read_until_closed, status_of

READERS = [
    {"name": "greedy", "token": "greedy-secret", "topics": ["#"]},
    {"name": "spark", "token": "spark-secret", "topics": ["#"]},
]
API = {"tokens": READERS, "max_connections": 4, "request_timeout_s": 5.0}
"""Half of 4 connections: two per reader."""


def trickled_fetch(port: int, token: str) -> socket.socket:
    """A ``POST /v1/fetch`` whose body is still arriving (its first byte of 100 sent): being handled."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        f"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
    )
    return sock


def first_answer(sock: socket.socket) -> bytes:
    """The first answer on ``sock``, whose body has a ``Content-Length`` (read without waiting for the
    connection to close: the broker reads what is left of the request's body first)."""
    answer = b""
    while b"\r\n\r\n" not in answer and (chunk := sock.recv(65536)):
        answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    return head + b"\r\n\r\n" + body


def listing(sock: socket.socket, token: str) -> bytes:
    """The whole chunked answer to ``GET /v1/logs`` on ``sock``."""
    sock.sendall(f"GET /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
    answer = b""
    while not answer.endswith(b"\r\n0\r\n\r\n") and (chunk := sock.recv(65536)):
        answer += chunk
    return answer


def test_one_reader_trickling_request_bodies_leaves_the_other_readers_their_share(brokers):
    """Four fetches of one token whose bodies arrive a byte at a time held every connection, and every
    other reader got 503 until their bodies timed out; the third is now refused at once."""
    running = brokers(offsets_api=API)
    port = running.broker.offsets_port
    held = [trickled_fetch(port, "greedy-secret") for _ in range(2)]
    time.sleep(0.2)
    started = time.monotonic()
    refused = [first_answer(trickled_fetch(port, "greedy-secret")) for _ in range(2)]
    for answer in refused:
        assert answer.startswith(b"HTTP/1.1 503") and b'"too_many_connections"' in answer, answer
        assert b"greedy" in answer and b"Retry-After: 1" in answer
    assert status_of(port, "/v1/logs", "spark-secret") == 200
    assert time.monotonic() - started < 2  # at once, not once the bodies are late (5 s)
    for sock in held:  # its own two are not cut short: each gets its 408 once its body is late
        assert first_answer(sock).startswith(b"HTTP/1.1 408")


def test_at_its_share_a_reader_request_closes_its_own_idle_connection(brokers):
    """Executors of one Spark job share a token: at its share, a new connection of it takes the place of
    its own connection idle the longest, and is served."""
    running = brokers(offsets_api=API)
    port = running.broker.offsets_port
    idle = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert listing(sock, "spark-secret").startswith(b"HTTP/1.1 200")
        idle.append(sock)
        time.sleep(0.05)
    assert status_of(port, "/v1/logs", "spark-secret") == 200
    assert read_until_closed(idle[0]) == b""  # its longest idle connection made room
    assert listing(idle[1], "spark-secret").startswith(b"HTTP/1.1 200")
    for sock in idle:
        sock.close()


def test_at_its_share_a_reader_request_has_its_own_longest_long_poll_answer(brokers):
    """With all of its connections in long polls, a new request of the token has the one waiting the
    longest answer at once (empty, as after its ``wait_ms``) and close; the token's other poll waits on."""
    running = brokers(offsets_api=API)
    PahoClient(running.port, "pub").publish("t", b"x", 1)
    port = running.broker.offsets_port
    polls = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(
            b"GET /v1/logs/t/records?offset=latest&wait_ms=5000&format=jsonl HTTP/1.1\r\nHost: x\r\n"
            b"Authorization: Bearer spark-secret\r\n\r\n"
        )
        polls.append(sock)
        time.sleep(0.1)
    started = time.monotonic()
    assert status_of(port, "/v1/logs", "spark-secret") == 200
    answer = read_until_closed(polls[0])  # answered empty, then closed
    assert answer.startswith(b"HTTP/1.1 200") and b"Timestone-Record-Count: 0" in answer
    assert time.monotonic() - started < 2
    polls[1].settimeout(0.5)
    with pytest.raises(TimeoutError):  # still waiting
        polls[1].recv(1)
    for sock in polls:
        sock.close()
