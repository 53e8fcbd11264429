"""A device's connection ends with its certificate's authorization: when the certificate expires while it is
connected, and when a reload's ``cafile`` no longer holds the CA it rests on (the end of a CA rotation).
OpenSSL checks both at the handshake only; the broker closes such connections itself: v5 DISCONNECT 0x87
(Not authorized), a 3.1.1 client's connection closed, counted and said at WARNING."""

from __future__ import annotations

import logging
import queue
import ssl
from pathlib import Path
from typing import Any

import pytest

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.runtime.main import reload_files
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


@pytest.mark.parametrize("kind", ["tls", "wss"])
def test_devices_of_a_ca_a_reload_no_longer_trusts_are_closed_and_their_wills_dropped(
    start_broker, tmp_path: Path, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    """The last step of a devices' CA rotation: ``cafile`` held the old and the new CA, the SIGHUP reads it
    with the new one alone. The old CA's devices still connected are closed by that reload (v5 DISCONNECT
    0x87, a 3.1.1 one closed), their wills not published; the new CA's device stays. MQTT over TLS and
    over WebSocket over TLS alike."""
    old, new = LocalPki(tmp_path, "ca"), LocalPki(tmp_path, "ca-2")
    trusted = tmp_path / "device-cas.pem"
    trusted.write_bytes(old.ca.cert.read_bytes() + new.ca.cert.read_bytes())
    section = certificate_listener(old)
    section["type"], section["tls"]["cafile"] = kind, str(trusted)
    broker = start_broker(listeners=[section])
    transport: dict[str, Any] = {"transport": "websockets" if kind == "wss" else "tcp"}
    kept = certificate_holder(new, broker.port, "meter-3", "m3", server_pki=old, **transport)
    kept.subscribe("wills/#", qos=1)
    will = ("wills/m1", b"gone", 1, False)
    untrusted = certificate_holder(old, broker.port, "meter-1", "m1", will=will, **transport)
    untrusted_v3 = certificate_holder(old, broker.port, "meter-2", "m2", version=4, **transport)

    trusted.write_bytes(new.ca.cert.read_bytes())
    caplog.set_level(logging.WARNING)
    broker.call(lambda: reload_files(broker.broker))  # what SIGHUP does
    assert closed_by_the_broker(untrusted) == NOT_AUTHORIZED
    assert closed_by_the_broker(untrusted_v3) != 0
    said = warnings(caplog, "is no longer trusted")
    assert sorted(line.split("(CN=")[1].split(")")[0] for line in said) == ["meter-1", "meter-2"], said
    assert all(f"{trusted} lacks a CA its chain rests on" in line for line in said)
    assert broker.metric("timestone_broker_disconnects_total", reason="certificate_untrusted") == 2
    kept.publish("wills/check", b"delivered", qos=1)
    assert [m.payload for m in kept.expect()] == [b"delivered"]  # and no will before it
    kept.expect_none(0.3)
    assert handshake_refused(broker.port, device_context(old, "meter-1", old))
    kept.disconnect()


def test_a_reload_that_keeps_the_ca_closes_nobody(
    start_broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A SIGHUP with the same ``cafile`` (a server certificate renewed) leaves every device connected."""
    pki = LocalPki(tmp_path)
    broker = start_broker(listeners=[certificate_listener(pki)])
    device = certificate_holder(pki, broker.port, "meter-1", "m1")
    device.subscribe("plant/#", qos=1)
    broker.call(lambda: reload_files(broker.broker))
    device.publish("plant/1/temp", b"after the reload", qos=1)
    assert device.expect()[0].payload == b"after the reload"
    assert device.disconnects.empty()
    assert broker.metric("timestone_broker_disconnects_total", reason="certificate_untrusted") == 0
    device.disconnect()
