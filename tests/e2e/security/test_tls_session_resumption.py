"""A TLS session resumed after a SIGHUP does not let a certificate that reload revoked, or whose CA it took
out of ``cafile``, back in. OpenSSL verifies no resumed session: the holder of a stolen key who kept a
session from before the revocation resumed it and was answered CONNACK 0. MQTT over TLS and over WebSocket
over TLS alike: the connection is refused before its CONNECT is read, counted and said."""

from __future__ import annotations

import base64
import os
import socket
import ssl
import struct
from pathlib import Path

import pytest

from broker_edge.pki.revocation import revoke, write_crl
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.runtime.main import reload_files
from tests.e2e.security.certificate_devices import certificate_listener
from tests.e2e.security.test_certificate_lifetime import device_context

CONNECT = b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00"
"""A v5 CONNECT of an empty client id."""


def _upgraded(tls: ssl.SSLSocket) -> None:
    key = base64.b64encode(os.urandom(16)).decode()
    tls.sendall(
        (
            "GET /mqtt HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
        ).encode()
    )
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += tls.recv(4096)
    assert answer.startswith(b"HTTP/1.1 101"), answer


def _frame(payload: bytes) -> bytes:
    """A client's masked binary WebSocket frame of ``payload`` (under 126 bytes)."""
    mask = os.urandom(4)
    return (
        struct.pack("!BB", 0x82, 0x80 | len(payload))
        + mask
        + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    )


def connack(
    port: int, context: ssl.SSLContext, kind: str, session: ssl.SSLSession | None = None
) -> tuple[bytes, ssl.SSLSession | None, bool]:
    """A CONNECT over TLS (``kind`` tls) or WebSocket over TLS (wss), resuming ``session`` when given: the
    first bytes answered (b"" when the broker closed the connection instead), the TLS session, and whether
    it was resumed."""
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost", session=session) as tls,
    ):
        if kind == "wss":
            _upgraded(tls)
        tls.sendall(_frame(CONNECT) if kind == "wss" else CONNECT)
        try:
            answer = tls.recv(100)
        except (ssl.SSLError, ConnectionError):
            answer = b""
        return answer, tls.session, bool(tls.session_reused)


def accepted(answer: bytes, kind: str) -> bool:
    """Whether ``answer`` holds a CONNACK with reason 0 (in a WebSocket frame for wss)."""
    packet = answer[2:] if kind == "wss" else answer
    return packet[:1] == b"\x20" and packet[3:4] == b"\x00"


@pytest.mark.parametrize("kind", ["tls", "wss"])
@pytest.mark.parametrize("why", ["revoked", "untrusted"])
def test_a_session_resumed_after_the_reload_does_not_let_the_certificate_back_in(
    start_broker, tmp_path: Path, kind: str, why: str
) -> None:
    old, new = LocalPki(tmp_path, "ca"), LocalPki(tmp_path, "ca-2")
    cafile, crlfile = tmp_path / "device-cas.pem", tmp_path / "device-crls.pem"
    cafile.write_bytes(old.ca.cert.read_bytes() + new.ca.cert.read_bytes())

    def write_crls() -> None:
        crlfile.write_bytes(write_crl(old.authority).read_bytes() + write_crl(new.authority).read_bytes())

    write_crls()
    section = certificate_listener(old)
    section["type"] = kind
    section["tls"].update(cafile=str(cafile), crlfile=str(crlfile))
    broker = start_broker(listeners=[section])
    context = device_context(old, "meter-1", old)
    answer, session, _ = connack(broker.port, context, kind)
    assert accepted(answer, kind), answer
    answer, session, resumed = connack(broker.port, context, kind, session)
    assert resumed and accepted(answer, kind), answer  # the broker resumes sessions
    if why == "revoked":
        revoke(old.authority, old.client("meter-1").cert)
        write_crls()
    else:
        cafile.write_bytes(new.ca.cert.read_bytes())
    broker.call(lambda: reload_files(broker.broker))

    answer, _, resumed = connack(broker.port, context, kind, session)
    assert resumed and not accepted(answer, kind), answer
    assert broker.metric("timestone_broker_connections_refused_total", reason=f"certificate_{why}") == 1


def test_two_brokers_of_one_process_check_resumed_sessions_against_their_own_reload(
    brokers, tmp_path: Path
) -> None:
    """Two brokers in one process serve the same TLS files, each reloaded once: the first before the
    certificate was revoked, the second after. A session resumed on the second is refused: the second
    broker's reload is checked, not the first's (what a cache of the process, keyed by file names and the
    count of reloads, handed it)."""
    pki = LocalPki(tmp_path, "ca")
    crlfile = tmp_path / "device-crls.pem"
    crlfile.write_bytes(write_crl(pki.authority).read_bytes())
    section = certificate_listener(pki)
    section["tls"]["crlfile"] = str(crlfile)
    first, second = brokers("a", listeners=[section]), brokers("b", listeners=[section])
    context = device_context(pki, "meter-1", pki)
    sessions = []
    for broker in (first, second):
        answer, session, _ = connack(broker.port, context, "tls")
        assert accepted(answer, "tls"), answer
        sessions.append(session)
    first.call(lambda: reload_files(first.broker))
    answer, _, resumed = connack(first.port, context, "tls", sessions[0])
    assert resumed and accepted(answer, "tls"), answer

    revoke(pki.authority, pki.client("meter-1").cert)
    crlfile.write_bytes(write_crl(pki.authority).read_bytes())
    second.call(lambda: reload_files(second.broker))

    answer, _, resumed = connack(second.port, context, "tls", sessions[1])
    assert resumed and not accepted(answer, "tls"), answer
    assert second.metric("timestone_broker_connections_refused_total", reason="certificate_revoked") == 1
