"""Clients that close their connection before their answer is written: a WebSocket client gone during its
upgrade, a reader gone before the first bytes of a listing of the logs. Mobile devices and scripts do it
all day; each logged an ERROR with a traceback (``HTTP request from None failed``, ``offsets API request
failed``), so that a stranger repeating it filled the broker's log. They are said at DEBUG, nothing is
left behind, and the next clients are served."""

from __future__ import annotations

import base64
import logging
import os
import socket
import struct
from collections.abc import Callable

import pytest

from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.offsets_api.api_harness import status_of

UPGRADE = (
    "GET /mqtt HTTP/1.1\r\nHost: broker\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
)
LISTING = "GET /v1/logs HTTP/1.1\r\nHost: broker\r\n\r\n"

GONE = "closed its connection before its answer was written"


def send_and_go(port: int, request: str, how: str) -> None:
    """Send ``request`` and go without reading a byte: closing (``close``), closing after a half-close
    (``half-close``), or with a TCP reset (``reset``)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(request.encode())
    if how == "half-close":
        sock.shutdown(socket.SHUT_WR)
    elif how == "reset":
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def said_gone(caplog: pytest.LogCaptureFixture, how: str) -> bool:
    """Whether the broker said at DEBUG that a client went before its answer: at least once in ten after a
    close, whose FIN follows the request; a reset may reach the broker first (the kernel then drops the
    request unread, and there is nothing to say)."""
    return how == "reset" or any(GONE in r.getMessage() for r in caplog.records)


def errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The broker's lines at WARNING or above, and any with a traceback."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]


@pytest.fixture
def edge(start_broker: Callable[..., RunningBroker]) -> RunningBroker:
    """A broker with a TCP and a WebSocket listener, its commitlog and offsets API."""
    return start_broker(
        listeners=[
            {"name": "tcp", "host": "127.0.0.1", "port": 0},
            {"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0},
        ],
        storage={},
        offsets_api={"enabled": True, "port": 0},
        limits={"new_connections_per_second": 0},
    )


@pytest.mark.parametrize("how", ["close", "half-close", "reset"])
def test_websocket_clients_gone_during_their_upgrade_log_no_error_and_hold_nothing(
    edge: RunningBroker, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.DEBUG)
    port = edge.port_of("ws")
    for _ in range(10):
        send_and_go(port, UPGRADE.format(key=base64.b64encode(os.urandom(16)).decode()), how)

    device = PahoClient(port, "meter-ws", transport="websockets")  # the next client is served
    assert device.connack_result[1] == 0
    assert wait_for(lambda: edge.call(lambda: len(edge.broker.connections)) == 1)  # the device's only
    assert not errors(caplog)
    assert said_gone(caplog, how)


@pytest.mark.parametrize("how", ["close", "half-close", "reset"])
def test_readers_gone_before_a_listing_of_the_logs_log_no_error(
    edge: RunningBroker, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    caplog.set_level(logging.DEBUG)
    device = PahoClient(edge.port, "meter-1")
    for number in range(3):
        device.publish(f"devices/meter-1/m{number}", b"1", qos=1)
    port = edge.broker.offsets_port
    assert port is not None
    for _ in range(10):
        send_and_go(port, LISTING, how)

    assert status_of(port, "/v1/logs", timeout_s=10) == 200  # the next reader is served
    assert not errors(caplog)
    assert said_gone(caplog, how)
