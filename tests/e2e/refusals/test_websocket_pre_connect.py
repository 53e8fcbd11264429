"""WebSocket listeners hold the pre-CONNECT bounds of TCP ones: an upgrade request that does not arrive in
``limits.connect_timeout_s`` is closed and counted (``connect_timeout``), so is an upgraded connection that
sends no CONNECT, and sockets beyond ``limits.max_connections`` are answered 503 and counted."""

from __future__ import annotations

import base64
import os
import socket
import time

import pytest

from tests.e2e.broker_clients import PahoClient, wait_for

UPGRADE = (
    "GET /mqtt HTTP/1.1\r\nHost: broker\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
)


def websocket_broker(start_broker, **limits):
    return start_broker(
        listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}],
        limits={"connect_timeout_s": 0.5, "new_connections_per_second": 0, **limits},
    )


def closed_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        pass
    return True


def masked_frame(payload: bytes) -> bytes:
    """One binary WebSocket frame from a client (masked, as RFC 6455 requires), payload under 126 bytes."""
    mask = os.urandom(4)
    return bytes([0x82, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def upgraded(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(UPGRADE.format(key=base64.b64encode(os.urandom(16)).decode()).encode())
    assert sock.recv(4096).startswith(b"HTTP/1.1 101")
    return sock


def test_a_slow_upgrade_request_is_closed_and_counted(start_broker):
    broker = websocket_broker(start_broker)
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(b"GET /mqtt HTTP/1.1\r\nHost: broker\r\n")  # and never the rest
        started = time.monotonic()
        assert closed_within(sock, 5)
        assert time.monotonic() - started < 3
    assert wait_for(lambda: broker.refused("connect_timeout") == 1)


def test_an_upgraded_connection_without_connect_is_closed_and_counted(start_broker):
    broker = websocket_broker(start_broker)
    with upgraded(broker.port) as sock:
        sock.sendall(masked_frame(b"\x10\x7f"))  # the start of a CONNECT of 127 bytes, never the rest
        assert closed_within(sock, 5)
    assert wait_for(lambda: broker.refused("connect_timeout") == 1)


@pytest.mark.parametrize("held", [2])
def test_sockets_beyond_max_connections_are_answered_503_and_counted(start_broker, held):
    broker = websocket_broker(start_broker, max_connections=held, connect_timeout_s=10)
    idle = [upgraded(broker.port) for _ in range(held)]  # upgraded, no CONNECT yet: they count
    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as extra:
        extra.sendall(UPGRADE.format(key=base64.b64encode(os.urandom(16)).decode()).encode())
        answer = extra.recv(4096)
    assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer
    assert wait_for(lambda: broker.refused("max_connections") == 1)
    for sock in idle:
        sock.close()
    assert wait_for(lambda: broker.call(lambda: len(broker.broker.connections)) == 0)
    device = PahoClient(broker.port, "meter-ws", transport="websockets")  # room again
    assert device.connack_result[1] == 0
