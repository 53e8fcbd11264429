"""TLS and WSS listeners hold ``limits.max_connections`` for sockets still in their TLS handshake, as a plain
TCP listener does for sockets that have not sent CONNECT: a client opening sockets and never sending a
ClientHello takes at most that many descriptors, the rest are closed at once and counted; a healthy client
is still served meanwhile."""

from __future__ import annotations

import socket
import time

import pytest

from tests.e2e.broker_clients import PahoClient, wait_for
from tests.tls_certs import client_ssl_context, make_test_pki

SILENT = 12
LIMIT = 4


@pytest.fixture
def pki(tmp_path):
    return make_test_pki(tmp_path / "pki")


def tls_broker(start_broker, pki, kind: str):
    tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
    return start_broker(
        listeners=[{"name": kind, "type": kind, "host": "127.0.0.1", "port": 0, "tls": tls}],
        limits={"max_connections": LIMIT, "connect_timeout_s": 5, "new_connections_per_second": 0},
    )


def still_open(sockets: list[socket.socket]) -> int:
    """How many of ``sockets`` the broker has not closed."""
    count = 0
    for sock in sockets:
        sock.setblocking(False)
        try:
            count += sock.recv(1) != b""
        except BlockingIOError:
            count += 1
        except OSError:
            pass
    return count


def closed_handshakes(broker, listener: str) -> int:
    """Handshakes of ``listener`` that ended with the client closing its socket without a byte."""
    failures = "timestone_broker_tls_handshake_failures_total"
    return int(broker.metric(failures, listener=listener, reason="probe") or 0)


@pytest.mark.parametrize("kind", ["tls", "wss"])
def test_silent_handshakes_beyond_max_connections_are_closed_at_once(start_broker, pki, kind):
    broker = tls_broker(start_broker, pki, kind)
    silent = [socket.create_connection(("127.0.0.1", broker.port_of(kind))) for _ in range(SILENT)]
    try:
        assert wait_for(lambda: still_open(silent) <= LIMIT, timeout=2)  # not after connect_timeout_s
        time.sleep(0.2)
        assert still_open(silent) == LIMIT
    finally:
        for sock in silent:
            sock.close()
    if kind == "tls":
        assert wait_for(lambda: broker.refused("max_connections") == SILENT - LIMIT)
    # the broker sees the silent sockets it kept close (their handshakes end): then a device gets in
    assert wait_for(lambda: closed_handshakes(broker, kind) >= LIMIT, timeout=10)
    device = PahoClient(
        broker.port_of(kind),
        f"after-{kind}",
        transport="websockets" if kind == "wss" else "tcp",
        tls_context=client_ssl_context(pki, certificate=False),
    )
    assert device.connack_result[1] == 0  # the silent ones gone, the listener serves
