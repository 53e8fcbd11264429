"""Every refusal visible: an MQTT 3.1.1 device publishing outside its ACL (PUBACK 0, as 3.1.1 has no other
answer), a denied SUBSCRIBE, a refused login and a failed TLS handshake each write a WARNING naming client id,
user, topic and action, rate-limited per reason, counted by reason; JSON log lines carry them as fields."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
from pathlib import Path
from typing import Any

import pytest

from broker_edge.observe.logs import JsonFormatter
from broker_edge.observe.refusal_log import LINES_PER_WINDOW, RefusalLog
from broker_edge.protocol.packets import PubAck, Publish, SubAck
from broker_edge.security.auth import PasswordFile
from tests.e2e.broker_clients import PahoClient, RawClient, wait_for
from tests.tls_certs import PkiPaths, client_ssl_context, make_test_pki, mutual_tls

ACL = {"rules": [{"permission": "allow", "action": "all", "topic": "devices/%u/#"}]}


@pytest.fixture
def secured(start_broker, tmp_path):
    path = tmp_path / "passwd"
    PasswordFile.set_password(path, "meter-7", "s3cret", create=True)
    pki = make_test_pki(tmp_path / "pki")
    tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
    return start_broker(
        listeners=[
            {"name": "tcp", "host": "127.0.0.1", "port": 0, "allow_anonymous": False},
            {
                "name": "tls",
                "type": "tls",
                "host": "127.0.0.1",
                "port": 0,
                "tls": tls,
                "allow_anonymous": False,
            },
        ],
        auth={"password_file": str(path)},
        acl=ACL,
    )


def refusals(caplog, reason: str) -> list[Any]:
    """The WARNING records of refusals for ``reason`` (their fields are attributes: ``line.client_id``)."""
    return [
        r for r in caplog.records if getattr(r, "reason", None) == reason and r.levelno == logging.WARNING
    ]


@pytest.mark.mqtt311("MQTT-3.3.5-2")
def test_a_publish_outside_the_acl_is_logged_with_client_user_and_topic(secured, caplog):
    caplog.set_level(logging.INFO)
    device = RawClient(secured.port, version=4)
    assert device.connect("meter-7-a", username="meter-7", password=b"s3cret").reason_code == 0
    device.send_packet(Publish("devices/meter-8/energy", b"42", 1, packet_id=3))
    assert device.recv() == PubAck(3)  # 3.1.1 cannot say no: the log must
    assert wait_for(lambda: bool(refusals(caplog, "acl_denied")))
    [line] = refusals(caplog, "acl_denied")
    assert (line.client_id, line.username, line.topic, line.action, line.qos) == (
        "meter-7-a",
        "meter-7",
        "devices/meter-8/energy",
        "publish",
        1,
    )
    assert line.peer.startswith("127.0.0.1:")
    document = json.loads(JsonFormatter().format(line))
    assert document["username"] == "meter-7" and document["topic"] == "devices/meter-8/energy"
    assert secured.drops("acl_denied") == 1

    assert device.subscribe("devices/+/energy", 1) == SubAck(1, [0x80])
    assert wait_for(lambda: bool(refusals(caplog, "subscribe_denied")))
    [line] = refusals(caplog, "subscribe_denied")
    assert (line.client_id, line.username, line.topic, line.action) == (
        "meter-7-a",
        "meter-7",
        "devices/+/energy",
        "subscribe",
    )
    assert secured.drops("subscribe_denied") == 1


def test_a_refused_login_names_the_username_tried(secured, caplog):
    caplog.set_level(logging.INFO)
    answer = RawClient(secured.port, version=5).connect("intruder", username="admin", password=b"guess")
    assert answer.reason_code == 0x86
    assert wait_for(lambda: bool(refusals(caplog, "bad_credentials")))
    [line] = refusals(caplog, "bad_credentials")
    assert (line.client_id, line.username, line.action) == ("intruder", "admin", "connect")
    assert line.getMessage() == "connection refused: bad_credentials"
    assert secured.refused("bad_credentials") == 1


def test_a_failed_tls_handshake_is_logged_and_counted(secured, caplog):
    caplog.set_level(logging.INFO)
    with socket.create_connection(("127.0.0.1", secured.port_of("tls")), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")  # not TLS at all
        sock.recv(1024)
    assert wait_for(lambda: secured.refused("tls_error") == 1)
    assert wait_for(lambda: bool(refusals(caplog, "tls_error")))
    assert refusals(caplog, "tls_error")[0].listener == "tls"


def tls_failures(broker, listener: str, reason: str) -> int:
    return int(
        broker.metric("timestone_broker_tls_handshake_failures_total", listener=listener, reason=reason)
    )


def test_failed_tls_handshakes_name_the_peer_the_listener_and_why(start_broker, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    pki = make_test_pki(tmp_path / "pki")
    tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
    broker = start_broker(
        listeners=[
            {"name": "tls", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls},
            {"name": "wss", "type": "wss", "host": "127.0.0.1", "port": 0, "tls": tls},
        ],
        limits={"connect_timeout_s": 0.5, "new_connections_per_second": 0},
    )
    peers = {}
    for listener in ("tls", "wss"):
        with socket.create_connection(("127.0.0.1", broker.port_of(listener)), timeout=5) as sock:
            peers[listener] = f"127.0.0.1:{sock.getsockname()[1]}"
            sock.sendall(b"GET / HTTP/1.1\r\nHost: broker\r\n\r\n")  # not TLS: OpenSSL says http_request
            sock.recv(1024)
    distrustful = client_ssl_context(pki, certificate=False, trust=pki.other_ca_cert)
    with (
        socket.create_connection(("127.0.0.1", broker.port_of("tls")), timeout=5) as sock,
        pytest.raises(ssl.SSLError),
    ):
        peers["distrust"] = f"127.0.0.1:{sock.getsockname()[1]}"
        distrustful.wrap_socket(sock, server_hostname="localhost")
    with socket.create_connection(("127.0.0.1", broker.port_of("wss")), timeout=5) as sock:
        peers["silent"] = f"127.0.0.1:{sock.getsockname()[1]}"
        assert sock.recv(1024) == b""  # no handshake within connect_timeout_s: closed

    assert wait_for(lambda: len(refusals(caplog, "tls_error")) == 4)
    lines = {line.peer: line for line in refusals(caplog, "tls_error")}
    assert set(lines) == set(peers.values())
    said = {(lines[peer].listener, lines[peer].tls_reason) for peer in peers.values()}
    assert said == {
        ("tls", "http_request"),
        ("wss", "http_request"),
        ("tls", "tlsv1_alert_unknown_ca"),
        ("wss", "timeout"),
    }
    assert lines[peers["tls"]].getMessage() == "TLS handshake failed: http_request"
    assert broker.refused("tls_error") == 4
    assert tls_failures(broker, "tls", "http_request") == 1
    assert tls_failures(broker, "wss", "timeout") == 1
    device = PahoClient(
        broker.port_of("wss"), "meter-wss", transport="websockets", tls_context=client_ssl_context(pki)
    )
    assert device.connack_result[1] == 0  # the listener still serves


def test_a_tls_client_is_logged_with_its_address_to_the_end(secured, caplog):
    caplog.set_level(logging.INFO)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    raw = context.wrap_socket(socket.create_connection(("127.0.0.1", secured.port_of("tls")), timeout=5))
    device = RawClient(secured.port_of("tls"), version=5, sock=raw)
    assert device.connect("meter-7-tls", username="meter-7", password=b"s3cret").reason_code == 0
    device.close()
    assert wait_for(lambda: any(r.getMessage().startswith("disconnected") for r in caplog.records))
    lines = [r for r in caplog.records if getattr(r, "client_id", None) == "meter-7-tls"]
    assert {r.getMessage() for r in lines} >= {"connected"}
    assert all(r.peer.startswith("127.0.0.1:") for r in lines), [(r.getMessage(), r.peer) for r in lines]
    [connected] = [r for r in lines if r.getMessage() == "connected"]
    assert (connected.username, connected.version, connected.session_present) == ("meter-7", 5, False)


def test_refusal_lines_are_limited_per_reason_and_say_how_many_were_held_back(caplog):
    caplog.set_level(logging.INFO)
    log = logging.getLogger("test.refusals")
    refusal_log = RefusalLog()
    written = [refusal_log.write(log, 0.5, "acl_denied", "publish refused", topic="t") for _ in range(50)]
    assert written.count(True) == LINES_PER_WINDOW
    assert refusal_log.write(log, 1.0, "bad_credentials", "connection refused")  # its own allowance
    assert refusal_log.write(log, 11.0, "acl_denied", "publish refused", topic="t")  # a new window
    assert caplog.records[-1].suppressed == 50 - LINES_PER_WINDOW


def test_a_websocket_client_is_logged_with_its_address_to_the_end(start_broker, caplog):
    caplog.set_level(logging.INFO)
    broker = start_broker(listeners=[{"name": "ws", "type": "websocket", "host": "127.0.0.1", "port": 0}])
    device = PahoClient(broker.port, "meter-ws", transport="websockets")
    device.disconnect()
    assert wait_for(lambda: any(r.getMessage().startswith("disconnected") for r in caplog.records))
    lines = [r for r in caplog.records if getattr(r, "client_id", None) == "meter-ws"]
    assert {r.getMessage().split(" ")[0] for r in lines} >= {"connected", "disconnected"}
    assert all(r.peer.startswith("127.0.0.1:") for r in lines), [(r.getMessage(), r.peer) for r in lines]


def test_a_client_refusing_the_brokers_certificate_is_told_apart_from_a_refused_client(
    start_broker, tmp_path, caplog
):
    """A device dialling a host name the broker's certificate does not name refuses it, with TLS's 'bad
    certificate' alert; the broker's line said only ``sslv3_alert_bad_certificate``, which reads as the
    device's certificate being bad. It says whose certificate was refused, and what to look at."""
    caplog.set_level(logging.INFO)
    pki = make_test_pki(tmp_path / "pki")
    tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
    broker = start_broker(
        listeners=[{"name": "tls", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}]
    )
    with (
        socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock,
        pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"),
    ):
        client_ssl_context(pki, certificate=False).wrap_socket(sock, server_hostname="edge-7.plant.example")
    assert wait_for(lambda: bool(refusals(caplog, "tls_error")))
    (line,) = refusals(caplog, "tls_error")
    assert line.tls_reason == "sslv3_alert_bad_certificate"
    assert line.refused_by == (
        f"the client: the broker's certificate ({pki.server_cert}) does not name the host it dialled, "
        "is not of a CA it trusts, or has expired (timestone pki show)"
    )


def handshake_with_another_cas_certificate(pki: PkiPaths, port: int) -> None:
    """A TLS handshake on ``port`` with a client certificate of another CA than ``pki``'s."""
    stranger = client_ssl_context(pki, certificate=False)
    stranger.load_cert_chain(str(pki.other_client_cert), str(pki.other_client_key))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        contextlib.suppress(ssl.SSLError, OSError),  # TLS 1.3: the alert may come after the handshake
    ):
        stranger.wrap_socket(sock, server_hostname="localhost").recv(1)


def assert_refused_as_of_another_ca(line: Any, setting: str, cafile: Path) -> None:
    """``line`` refused a client certificate of another CA, in OpenSSL's words, naming the file ``cafile``
    that ``setting`` names (``hint``)."""
    assert line.tls_reason == "certificate_verify_failed"
    assert "unable to get local issuer certificate" in line.error
    assert line.hint == (
        f"the client's certificate did not verify against {setting} ({cafile}): not issued by a CA there, "
        "expired or not yet valid, as the error says (timestone pki show names a certificate's issuer and "
        "validity)"
    )


def test_a_client_certificate_the_broker_refuses_names_the_ca_file_it_was_checked_against(
    start_broker, tmp_path, caplog
):
    """A device whose certificate is of another CA than the listener's ``tls.cafile`` (or the file holds
    another CA than meant): the line said only OpenSSL's ``unable to get local issuer certificate``, naming
    no setting. It names the file it was checked against (``hint``)."""
    caplog.set_level(logging.INFO)
    pki = make_test_pki(tmp_path / "pki")
    tls = mutual_tls(pki)
    broker = start_broker(
        listeners=[{"name": "tls", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}]
    )
    handshake_with_another_cas_certificate(pki, broker.port)
    assert wait_for(lambda: bool(refusals(caplog, "tls_error")))
    (line,) = refusals(caplog, "tls_error")
    assert_refused_as_of_another_ca(line, "the listener's tls.cafile", pki.ca_cert)
    assert not hasattr(line, "refused_by")


def test_a_reader_certificate_the_offsets_api_refuses_names_the_ca_file_it_was_checked_against(
    start_broker, tmp_path, caplog
):
    """The HTTPS endpoints said only OpenSSL's reason for a client certificate they refused; the offsets
    API's line names the setting and the file it was checked against (``hint``), and OpenSSL's words
    (``error``), as a listener's does."""
    caplog.set_level(logging.INFO)
    pki = make_test_pki(tmp_path / "pki")
    broker = start_broker(storage={}, offsets_api={"port": 0, "tls": mutual_tls(pki)})
    handshake_with_another_cas_certificate(pki, broker.broker.offsets_port)

    def offsets_api_lines() -> list[Any]:
        return [r for r in refusals(caplog, "tls_handshake") if "offsets API" in r.getMessage()]

    assert wait_for(lambda: bool(offsets_api_lines()))
    (line,) = offsets_api_lines()
    assert_refused_as_of_another_ca(line, "offsets_api.tls.cafile", pki.ca_cert)
