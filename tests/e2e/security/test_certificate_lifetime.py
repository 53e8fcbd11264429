"""A device's connection ends with its certificate's authorization: when the certificate expires while it is
connected. OpenSSL checks it at the handshake only; the broker closes such connections itself: v5
DISCONNECT 0x87 (Not authorized), a 3.1.1 client's connection closed, counted and said at WARNING."""

from __future__ import annotations

import logging
import queue
import ssl
from pathlib import Path

import pytest

from broker_edge.runtime.local_pki import LocalPki
from tests.e2e.broker_clients import TIMEOUT, PahoClient
from tests.e2e.security.certificate_devices import certificate_holder, certificate_listener, ending_in
from tests.e2e.security.test_certificate_revocation import handshake_refused

LIFETIME_S = 8.0
"""How long the short-lived certificate holds: time enough for its device to connect on a busy machine."""

NOT_AUTHORIZED = 0x87


def closed_by_the_broker(client: PahoClient, timeout: float = TIMEOUT) -> int:
    """The reason code of the broker's close of ``client`` (an MQTT 3.1.1 client: the close it saw)."""
    try:
        return int(client.disconnects.get(timeout=timeout).value)
    except queue.Empty:
        raise AssertionError(f"{client.client._client_id!r} is still connected") from None


def device_context(pki: LocalPki, device_id: str, server_pki: LocalPki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(server_pki.ca.cert))
    pair = pki.client(device_id)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return context


def warnings(caplog: pytest.LogCaptureFixture, containing: str) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return [line for line in said if containing in line]


def test_a_device_whose_certificate_expires_while_connected_is_closed_then_and_its_will_published(
    start_broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A certificate of a few seconds (as a short-lived device credential): both its v5 and its 3.1.1
    connection are closed once it has expired, the v5 one with DISCONNECT 0x87; the device's will is
    published (it is gone, not an impostor), the CA's other device stays, and a new handshake is refused."""
    pki = LocalPki(tmp_path)
    ending_in(pki, "meter-1", LIFETIME_S)
    caplog.set_level(logging.WARNING)
    broker = start_broker(listeners=[certificate_listener(pki)])
    watcher = certificate_holder(pki, broker.port, "meter-2", "m2")
    watcher.subscribe("wills/#", qos=1)
    expiring = certificate_holder(pki, broker.port, "meter-1", "m1", will=("wills/m1", b"gone", 1, False))
    expiring_v3 = certificate_holder(pki, broker.port, "meter-1", "m1-v3", version=4)
    assert expiring.connack_result[1] == expiring_v3.connack_result[1] == 0

    assert closed_by_the_broker(expiring, LIFETIME_S + 30) == NOT_AUTHORIZED
    assert closed_by_the_broker(expiring_v3) != 0
    assert watcher.expect()[0].payload == b"gone"
    said = warnings(caplog, "closing the connection: its client certificate expired at")
    assert len(said) == 2 and all(line.endswith(" UTC (CN=meter-1)") for line in said), said
    assert broker.metric("timestone_broker_disconnects_total", reason="certificate_expired") == 2
    assert handshake_refused(broker.port, device_context(pki, "meter-1", pki))
    watcher.publish("plant/1/temp", b"21.5", qos=1)  # the CA's other device goes on
    watcher.disconnect()
