"""WebSocket listeners hold the pre-CONNECT bounds of TCP ones: an upgrade request that does not arrive in
``limits.connect_timeout_s`` is closed and counted (``connect_timeout``), so is an upgraded connection that
sends no CONNECT, sockets beyond ``limits.max_connections`` are answered 503 and counted, and a client
sending more than ``limits.max_connect_packet_size`` before its CONNECT is read (one oversized frame, or a
large frame dripped slowly) is closed, counted and logged as ``connect_too_large``."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import socket
import time
from typing import Any

import aiohttp
import pytest

from tests.e2e.broker_clients import PahoClient, RawClient, wait_for

READ_MAX = 262_144
"""The most one read of a socket hands over (asyncio's and uvloop's read buffer)."""

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


def too_large_refusals(caplog) -> list[Any]:
    return [r for r in caplog.records if getattr(r, "reason", None) == "connect_too_large"]


async def first_frame_answer(port: int, payload: bytes) -> aiohttp.WSMessage:
    """What an aiohttp WebSocket client hears after sending ``payload`` as its first binary message."""
    async with (
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/mqtt", protocols=("mqtt",)) as ws,
    ):
        await ws.send_bytes(payload)
        return await ws.receive(timeout=5)


def test_an_oversized_first_frame_is_closed_counted_and_logged(start_broker, caplog):
    caplog.set_level(logging.INFO)
    broker = websocket_broker(start_broker, connect_timeout_s=10)
    # The start of a CONNECT within its limit (60,000 bytes), in one frame of 200 KB: the broker must not
    # gather the frame to find out.
    answer = asyncio.run(first_frame_answer(broker.port, b"\x10\xe0\xd4\x03" + bytes(200_000)))
    assert answer.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
    assert wait_for(lambda: broker.refused("connect_too_large") == 1)
    assert wait_for(lambda: bool(too_large_refusals(caplog)))
    [line] = too_large_refusals(caplog)
    assert line.levelno == logging.WARNING and line.action == "connect" and line.listener == "ws"
    assert line.peer.startswith("127.0.0.1:") and line.limit == 65_536
    assert 65_536 < line.bytes < 200_000
    assert broker.call(lambda: len(broker.broker.connections)) == 0


def test_a_large_frame_dripped_slowly_is_closed_once_past_the_budget(start_broker, caplog):
    caplog.set_level(logging.INFO)
    broker = websocket_broker(start_broker, connect_timeout_s=30, max_connect_packet_size=4096)
    with upgraded(broker.port) as sock:
        mask = os.urandom(4)
        sock.sendall(bytes([0x82, 0xFF]) + (900_000).to_bytes(8, "big") + mask)  # a 900 KB frame declared
        sent, started = 0, time.monotonic()
        with pytest.raises(OSError):
            while time.monotonic() - started < 10:
                sock.sendall(bytes(512))
                sent += 512
                time.sleep(0.005)
        assert time.monotonic() - started < 10  # closed long before the CONNECT timeout
    assert 4096 < sent < 900_000  # the frame never finished: closed while it was still arriving
    assert wait_for(lambda: broker.refused("connect_too_large") == 1)
    assert broker.refused("connect_timeout") == 0
    [line] = too_large_refusals(caplog)
    # Closed at the first read past the budget: what that read held is all it took beyond it.
    assert line.limit == 4096 and 4096 + 14 < line.bytes <= 4096 + 14 + READ_MAX


def test_the_budget_ends_with_the_connect_and_is_the_tcp_one(start_broker, caplog):
    caplog.set_level(logging.INFO)
    broker = start_broker(
        listeners=[
            {"name": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0},
        ],
        limits={"max_connect_packet_size": 1024, "new_connections_per_second": 0},
    )
    device = PahoClient(broker.port_of("ws"), "meter-ws", transport="websockets")
    assert device.connack_result[1] == 0
    device.publish("devices/meter-ws/firmware", bytes(300_000), qos=1)  # past CONNECT: no budget
    assert device.client.is_connected()
    raw = RawClient(broker.port_of("tcp"), 4)
    raw.send(b"\x10\x80\x10")  # a first packet declaring 2048 bytes
    assert raw.closed()
    assert wait_for(lambda: broker.refused("connect_too_large") == 1)
    [line] = too_large_refusals(caplog)
    assert line.listener == "tcp" and line.limit == 1024
    assert broker.refused("protocol_error") == 0
