"""The admin endpoint holds a client that takes its answers slowly no longer than the offsets API does: an
answer of N bytes not taken within ``request_timeout_s`` + N / ``min_read_bytes_per_s`` seconds is
abandoned and its connection closed, so that clients that stopped reading cannot hold every connection."""

from __future__ import annotations

import array
import fcntl
import socket
import termios
import time

from tests.e2e.offsets_api.api_harness import status_of


def pipelined_unread(port: int, target: str, requests: int = 400, headers: str = "") -> socket.socket:
    """A client that sends ``requests`` GETs of ``target`` at once and reads none of their answers: once
    the sockets' buffers are full, the broker's answer waits for room for as long as the client likes."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n{headers}\r\n".encode() * requests)
    return sock


def unread_bytes(sock: socket.socket) -> int:
    """How many bytes of answers wait in ``sock``'s receive buffer."""
    pending = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, pending)
    return pending[0]


def test_admin_clients_that_stop_reading_are_closed_and_scrapes_are_served(start_broker):
    """Two clients sending scrapes they never read held both connections of the admin endpoint for ever
    (each answer waiting for room), and every scrape after them was answered 503."""
    admin = {"port": 0, "max_connections": 2, "request_timeout_s": 4.0}  # both answered well within it
    broker = start_broker(admin_http=admin)
    port = broker.broker.admin_port
    assert status_of(port, "/health") == 200  # (the endpoint is served from its first connection on)
    stuck = [pipelined_unread(port, "/metrics") for _ in range(2)]
    started = time.monotonic()
    # both answered before the scrape below: one sent while a client is still idle would take its place
    while not all(unread_bytes(sock) for sock in stuck):
        assert time.monotonic() - started < 10, "the two clients that stopped reading were never answered"
        time.sleep(0.05)
    assert status_of(port, "/health") == 503  # both are being handled, neither idle
    while status_of(port, "/health") != 200:  # (pages built in turns fill their sockets in seconds when busy)
        assert time.monotonic() - started < 20, "clients that stopped reading hold the admin endpoint"
        time.sleep(0.2)
    for sock in stuck:
        sock.close()
