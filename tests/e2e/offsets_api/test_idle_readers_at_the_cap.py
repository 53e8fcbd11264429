"""Readers kept alive between requests on a real broker: at the connection cap the longest idle of them
makes room for a new reader; readers waiting for their answer never do."""

from __future__ import annotations

import socket
import time

import pytest

from tests.e2e.broker_clients import PahoClient
from tests.e2e.offsets_api.api_harness import read_until_closed, status_of

READERS = [
    {"name": "slow-notebook", "token": "slow-secret", "topics": ["#"]},
    {"name": "spark", "token": "spark-secret", "topics": ["#"]},
]
WHOLE_CAP = {"tokens": READERS, "reader_connection_share": 1.0}
"""One token may hold every connection: these tests fill the endpoint's cap with one token's (its share of
them is test_reader_connections')."""


def listing(sock: socket.socket) -> bytes:
    """The whole chunked answer to ``GET /v1/logs`` on ``sock``."""
    sock.sendall(b"GET /v1/logs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer spark-secret\r\n\r\n")
    answer = b""
    while not answer.endswith(b"\r\n0\r\n\r\n"):
        answer += sock.recv(65536)
    return answer


def test_at_the_cap_the_longest_idle_kept_alive_reader_makes_room_for_a_new_one(brokers):
    """At ``max_connections``, readers whose connections were kept alive after their answer kept every new
    reader out (503) for as long as they sat idle; the longest idle of them is now closed instead."""
    api = {**WHOLE_CAP, "max_connections": 3, "request_timeout_s": 5.0}
    running = brokers(offsets_api=api)
    port = running.broker.offsets_port
    idle = []
    for _ in range(3):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        assert listing(sock).startswith(b"HTTP/1.1 200")
        idle.append(sock)
        time.sleep(0.05)

    assert status_of(port, "/v1/logs") == 200  # a new reader is served
    assert read_until_closed(idle[0]) == b""  # the longest idle one was closed for it
    for sock in idle[1:]:  # the others stay
        assert listing(sock).startswith(b"HTTP/1.1 200")
        sock.close()


def long_poll(port: int) -> socket.socket:
    """A reader waiting (``wait_ms`` 5 s) for a record past the end of ``t``."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"GET /v1/logs/t/records?offset=latest&wait_ms=5000&format=jsonl HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer spark-secret\r\n\r\n"
    )
    return sock


def test_at_the_cap_the_longest_waiting_long_poll_gives_way_to_a_new_reader(brokers):
    """One reader's long polls filling ``max_connections`` kept every other reader out (503) for as long as
    they waited (up to 60 s, and again with the next polls); the one waiting longest is now answered at once
    with what there is (nothing) and its connection closed, as a stop answers them."""
    api = {**WHOLE_CAP, "max_connections": 2, "request_timeout_s": 5.0}
    running = brokers(offsets_api=api)
    PahoClient(running.port, "pub").publish("t", b"x", 1)
    port = running.broker.offsets_port
    polls = [long_poll(port)]
    time.sleep(0.1)
    polls.append(long_poll(port))
    time.sleep(0.2)
    started = time.monotonic()

    assert status_of(port, "/v1/logs") == 200  # a new reader is served
    answer = read_until_closed(polls[0])  # the oldest poll: answered empty, then closed
    assert answer.startswith(b"HTTP/1.1 200") and b"Timestone-Record-Count: 0" in answer
    assert time.monotonic() - started < 2
    polls[1].settimeout(0.5)
    with pytest.raises(TimeoutError):  # the other one still waits
        polls[1].recv(1)
    for sock in polls:
        sock.close()


def test_at_the_cap_readers_sending_a_request_are_never_pushed_out(brokers):
    api = {**WHOLE_CAP, "max_connections": 2, "request_timeout_s": 2.0}
    running = brokers(offsets_api=api)
    port = running.broker.offsets_port
    senders = []
    for _ in range(2):  # two fetches whose bodies are still arriving: being handled, not waiting
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(
            b"POST /v1/fetch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer spark-secret\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        senders.append(sock)
    time.sleep(0.3)
    refusal = read_until_closed(socket.create_connection(("127.0.0.1", port), timeout=5))
    assert refusal.startswith(b"HTTP/1.1 503") and b'"too_many_connections"' in refusal
    for sock in senders:  # each gets its 408 once its body is late, not a close for the newcomer
        assert read_until_closed(sock).startswith(b"HTTP/1.1 408")
