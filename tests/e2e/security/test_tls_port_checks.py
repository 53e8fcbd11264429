"""A port check on a TLS port (a load balancer's health check, a process waiting for the port to open: a
TCP connect, then a close without a byte) is counted as a ``probe``, said at DEBUG, and is not a refusal:
every such check wrote a refusal WARNING (``TLS handshake failed: closed``) on the MQTT TLS and WSS listeners
and the HTTPS endpoints, so a health check every few seconds filled the log with alarms. A client that
began its handshake and hung up is still a refusal (``closed``), under uvloop and asyncio's loop."""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import pytest

from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.refusals.test_refusals_logged import tls_failures
from tests.tls_certs import make_test_pki

HALF_A_CLIENT_HELLO = bytes.fromhex("16030100c8010000c40303") + bytes(16)
"""The start of a ClientHello record that announces 200 bytes and sends 27."""


def port_check(port: int) -> str:
    """Connect to ``port`` and close without a byte, as a TCP health check does; the peer address used."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        return f"127.0.0.1:{sock.getsockname()[1]}"


def half_handshake(port: int) -> str:
    """Begin a TLS handshake on ``port`` and hang up in the middle of it; the peer address used."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(HALF_A_CLIENT_HELLO)
        return f"127.0.0.1:{sock.getsockname()[1]}"


def warnings_about(caplog: pytest.LogCaptureFixture, peers: set[str]) -> list[str]:
    """The WARNING lines naming one of ``peers`` (as a field or in the text)."""
    return [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.WARNING
        and (getattr(record, "peer", None) in peers or any(peer in record.getMessage() for peer in peers))
    ]


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_port_check_on_a_tls_port_is_counted_as_a_probe_not_a_refusal(
    brokers: Callable[..., RunningBroker], tmp_path, caplog: pytest.LogCaptureFixture, loop: str
) -> None:
    caplog.set_level(logging.DEBUG)
    pki = make_test_pki(tmp_path / "pki")
    tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
    broker = brokers(
        listeners=[
            {"name": "tls", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls},
            {"name": "wss", "type": "wss", "host": "127.0.0.1", "port": 0, "tls": tls},
        ],
        offsets_api={"tls": tls},
        runtime={"event_loop": loop},
    )
    assert broker.broker.offsets_port is not None
    ports = {"tls": broker.port_of("tls"), "wss": broker.port_of("wss"), "api": broker.broker.offsets_port}
    checks = {name: port_check(port) for name, port in ports.items()}
    assert wait_for(lambda: [tls_failures(broker, name, "probe") for name in ("tls", "wss")] == [1, 1])
    assert wait_for(lambda: sum("port check" in r.getMessage() for r in caplog.records) == 3)
    assert warnings_about(caplog, set(checks.values())) == []
    assert broker.refused("tls_error") == 0

    halves = {name: half_handshake(port) for name, port in ports.items()}
    assert wait_for(lambda: len(warnings_about(caplog, set(halves.values()))) == 3)
    said = warnings_about(caplog, set(halves.values()))
    assert all("failed: closed" in line for line in said), said
    assert tls_failures(broker, "tls", "closed") == 1 and tls_failures(broker, "wss", "closed") == 1
    assert broker.refused("tls_error") == 2
