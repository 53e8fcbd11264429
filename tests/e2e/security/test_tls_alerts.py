"""A client certificate the broker refuses at the TLS handshake (none where one is required, another CA's,
revoked, expired) is refused with OpenSSL's alert, on the MQTT TLS and WSS listeners and on the offsets API
over HTTPS, under uvloop and asyncio's loop: the client reads ``certificate required``, ``unknown ca``,
``certificate revoked`` or ``certificate expired``, where both loops closed the connection without the alert
and the client saw a bare EOF, as from a broker that is down."""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.offsets_api.errors import BadRequestError, TlsRefused
from broker_edge.pki.authority import PemPair
from broker_edge.pki.builders import PrivateKey, new_key, subject_name, write_certificate, write_key
from broker_edge.pki.revocation import revoke
from broker_edge.runtime.local_pki import LocalPki
from tests.e2e.broker_clients import TIMEOUT
from tests.e2e.conftest import RunningBroker
from tests.tls_certs import make_test_pki

LOOPS = pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
CONNECT_V5 = b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00"


@dataclass(frozen=True)
class Devices:
    """A CA with its CRL, the broker's certificate, and the certificates of devices it refuses or takes."""

    ca: Path
    crl: Path
    server: PemPair
    good: PemPair
    revoked: PemPair
    expired: PemPair
    other_ca: PemPair

    def tls(self) -> dict[str, object]:
        """A server's ``tls`` section asking clients for a certificate of this CA, not revoked."""
        return {
            "certfile": str(self.server.cert),
            "keyfile": str(self.server.key),
            "cafile": str(self.ca),
            "require_client_cert": True,
            "crlfile": str(self.crl),
        }

    def context(self, pair: PemPair | None, tls12: bool = False) -> ssl.SSLContext:
        """A client trusting this CA, presenting ``pair`` (None: no certificate), TLS 1.2 at most if asked."""
        context = ssl.create_default_context(cafile=str(self.ca))
        if pair is not None:
            context.load_cert_chain(str(pair.cert), str(pair.key))
        if tls12:
            context.maximum_version = ssl.TLSVersion.TLSv1_2
        return context


def expired_client(pki: LocalPki, name: str) -> PemPair:
    """A client certificate of ``pki``'s CA that expired yesterday."""
    ca_key = serialization.load_pem_private_key((pki.authority.directory / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, PrivateKey)
    key = new_key("ec")
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject_name(name, "Timestone test"))
        .issuer_name(pki.authority.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(now - datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([x509.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pair = PemPair(pki.directory / f"expired-{name}.pem", pki.directory / f"expired-{name}.key")
    write_key(pair.key, key)
    write_certificate(pair.cert, certificate)
    return pair


@pytest.fixture
def devices(tmp_path: Path) -> Devices:
    pki = LocalPki(tmp_path / "pki", name="plant-ca")
    revoked = pki.client("meter-2")
    _certificate, crl, _new = revoke(pki.authority, revoked.cert)
    return Devices(
        ca=pki.ca.cert,
        crl=crl,
        server=pki.server("broker"),
        good=pki.client("meter-1"),
        revoked=revoked,
        expired=expired_client(pki, "meter-3"),
        other_ca=LocalPki(tmp_path / "other", name="other-ca").client("meter-1"),
    )


def alert_of(port: int, context: ssl.SSLContext) -> str:
    """What a Python TLS client sees: OpenSSL's reason of the error the broker's refusal raised, ``closed``
    for a connection closed without a word, ``served`` when the broker took the client. Every step has a
    timeout; a timeout fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="localhost") as tls:
                tls.sendall(CONNECT_V5)  # TLS 1.3: the client's handshake ends first, the refusal comes next
                return "served" if tls.recv(100) else "closed"
        except ssl.SSLError as error:
            return str(error.reason) if not isinstance(error, ssl.SSLEOFError) else "closed"
        except ConnectionError:
            return "closed"


REFUSALS = [
    ("good", False, "served"),
    (None, False, "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
    ("other_ca", False, "TLSV1_ALERT_UNKNOWN_CA"),
    ("revoked", False, "SSLV3_ALERT_CERTIFICATE_REVOKED"),
    ("expired", False, "SSLV3_ALERT_CERTIFICATE_EXPIRED"),
    (None, True, "SSLV3_ALERT_HANDSHAKE_FAILURE"),  # TLS 1.2's alert for no certificate
    ("other_ca", True, "TLSV1_ALERT_UNKNOWN_CA"),
    ("expired", True, "SSLV3_ALERT_CERTIFICATE_EXPIRED"),
]


def seen_alerts(devices: Devices, port: int) -> list[tuple[str | None, bool, str]]:
    return [
        (name, tls12, alert_of(port, devices.context(getattr(devices, name) if name else None, tls12)))
        for name, tls12, _alert in REFUSALS
    ]


@LOOPS
def test_a_tls_listener_refusing_a_client_certificate_sends_the_alert(
    start_broker: Callable[..., RunningBroker], devices: Devices, loop: str
) -> None:
    listener = {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": devices.tls()}
    broker = start_broker(listeners=[listener], runtime={"event_loop": loop})

    assert seen_alerts(devices, broker.port) == REFUSALS


@LOOPS
def test_a_wss_listener_refusing_a_client_certificate_sends_the_alert(
    start_broker: Callable[..., RunningBroker], devices: Devices, loop: str
) -> None:
    wss = {
        "name": "wss",
        "type": "wss",
        "host": "127.0.0.1",
        "port": 0,
        "path": "/mqtt",
        "tls": devices.tls(),
    }
    broker = start_broker(listeners=[wss], runtime={"event_loop": loop})

    for name, tls12, alert in REFUSALS[1:]:
        context = devices.context(getattr(devices, name) if name else None, tls12)
        assert alert_of(broker.port, context) == alert, (name, tls12)


def paho_refusal(port: int, context: ssl.SSLContext, transport: Literal["tcp", "websockets"] = "tcp") -> str:
    """What paho-mqtt tells of a connection the broker refuses at TLS: the error ``connect`` raises (TLS
    1.2), else the line its log gives when the connection is lost (TLS 1.3, after its handshake)."""
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2, "refused", transport=transport, reconnect_on_failure=False
    )
    client.tls_set_context(context)
    lines: list[str] = []
    lost = threading.Event()
    client.on_log = lambda _c, _u, _level, line: lines.append(line)
    client.on_disconnect = lambda *_args: lost.set()
    try:
        client.connect("127.0.0.1", port)
    except ssl.SSLError as error:
        return str(error)
    client.loop_start()
    try:
        assert lost.wait(TIMEOUT), "paho was neither refused nor disconnected"
    finally:
        client.loop_stop()
    return "\n".join(lines)


@LOOPS
def test_paho_over_tls_and_wss_reads_why_its_certificate_was_refused(
    start_broker: Callable[..., RunningBroker], devices: Devices, loop: str
) -> None:
    tls = {"name": "tls", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": devices.tls()}
    wss = {**tls, "name": "wss", "type": "wss", "path": "/mqtt"}
    broker = start_broker(listeners=[tls, wss], runtime={"event_loop": loop})

    assert "TLSV13_ALERT_CERTIFICATE_REQUIRED" in paho_refusal(broker.port, devices.context(None))
    assert "TLSV1_ALERT_UNKNOWN_CA" in paho_refusal(
        broker.port, devices.context(devices.other_ca, tls12=True)
    )
    over_wss = paho_refusal(broker.port_of("wss"), devices.context(devices.revoked), "websockets")
    assert "SSLV3_ALERT_CERTIFICATE_REVOKED" in over_wss


@LOOPS
def test_the_offsets_api_over_https_refusing_a_reader_certificate_is_not_taken_for_a_broker_down(
    brokers: Callable[..., RunningBroker], devices: Devices, loop: str
) -> None:
    """The offsets client raises ``TlsRefused`` (no retry mends it) naming the alert, where it read a closed
    connection and retried until ``BrokerUnavailable``."""
    broker = brokers(offsets_api={"tls": devices.tls()}, runtime={"event_loop": loop})
    url = f"https://127.0.0.1:{broker.broker.offsets_port}"
    refusals = [
        (None, False, "TLSV13_ALERT_CERTIFICATE_REQUIRED"),
        (None, True, "SSLV3_ALERT_HANDSHAKE_FAILURE"),
        (devices.other_ca, False, "TLSV1_ALERT_UNKNOWN_CA"),
        (devices.expired, False, "SSLV3_ALERT_CERTIFICATE_EXPIRED"),
    ]

    for pair, tls12, alert in refusals:
        context = devices.context(pair, tls12)
        client = OffsetsClient(url, ssl_context=context, retries=5, retry_backoff_s=1.0)
        with client, pytest.raises(TlsRefused, match=f"refused this client's certificate: .*{alert}"):
            client.list_logs()
    with OffsetsClient(url, ssl_context=devices.context(devices.good), retries=0) as client:
        assert client.list_logs() == []


def plain_http_answer(port: int) -> bytes:
    """What a TLS port answers to a request in plain HTTP (``http://`` where ``https://`` was meant)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /v1/logs HTTP/1.1\r\nHost: broker\r\n\r\n")
        answer = b""
        while data := sock.recv(4096):
            answer += data
        return answer


def test_plain_http_to_a_tls_port_is_answered_400_saying_to_use_tls(brokers, tmp_path, caplog):
    """A reader or a browser speaking plain HTTP to the offsets API over TLS, to a WSS or an MQTT TLS listener
    got its connection closed without a word (and the offsets API logged nothing): it now reads a 400 in
    JSON saying that the port speaks TLS, and the offsets API's refusal is logged with the peer."""
    pki = make_test_pki(tmp_path / "pki")
    tls = {"certfile": str(pki.server_cert), "keyfile": str(pki.server_key)}
    broker = brokers(
        listeners=[
            {"name": "tls", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls},
            {"name": "wss", "type": "wss", "host": "127.0.0.1", "port": 0, "tls": tls},
        ],
        offsets_api={"tls": tls},
    )
    for port in (broker.broker.offsets_port, broker.port_of("tls"), broker.port_of("wss")):
        answer = plain_http_answer(port)
        assert answer.startswith(b"HTTP/1.1 400 Bad Request\r\n"), answer
        assert b'"error": "bad_request"' in answer and b"speaks TLS" in answer, answer
    with (
        OffsetsClient(f"http://127.0.0.1:{broker.broker.offsets_port}", retries=0) as reader,
        pytest.raises(BadRequestError, match="speaks TLS"),  # not BrokerUnavailable after its retries
    ):
        reader.list_logs()
    refused = [r.getMessage() for r in caplog.records if "TLS handshake" in r.getMessage()]
    assert any("offsets API" in line and "http_request" in line for line in refused), refused
