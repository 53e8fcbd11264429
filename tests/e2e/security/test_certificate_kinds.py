"""A certificate of one kind presented where another is wanted, all issued by one CA with ``timestone pki``
(against docs/security.md's advice of one CA per trust, which is what makes it possible): a cluster
member's or a site's certificate is not a device's login on an MQTT listener, and a device's certificate
is not a member's on the members' endpoint."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from pipelines.cli import main
from tests.e2e.broker_clients import PahoClient


def pki(*argv: str) -> None:
    assert main(["pki", *argv]) == 0


@pytest.fixture
def ca(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """One CA that issued the broker's certificate, a device's, a member's and a site's."""
    ca = tmp_path / "ca"
    pki("ca", str(ca))
    pki("issue", "server", "broker", "--ca", str(ca), "--dns", "localhost", "--ip", "127.0.0.1")
    pki("issue", "client", "meter-1", "--ca", str(ca))
    pki("issue", "member", "b1", "--ca", str(ca), "--dns", "localhost")
    pki("issue", "site", "plant-1", "--ca", str(ca))
    capsys.readouterr()
    return ca


def holder(ca: Path, pem: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca / "ca.pem"))
    context.load_cert_chain(str(ca / f"{pem}.pem"), str(ca / f"{pem}.key"))
    return context


@pytest.mark.parametrize("version", [5, 4])
def test_a_members_or_a_sites_certificate_is_not_a_devices_login(
    start_broker, ca: Path, version: int
) -> None:
    """A member's key is kept on a broker's machine, a site's on a gateway: neither is an MQTT login (CN b1
    or plant-1 for the ACL) on a devices' listener that trusts their CA; CONNACK Not authorized (v5 0x87,
    v3.1.1 5), while the CA's device gets in."""
    tls = {
        "certfile": str(ca / "server-broker.pem"),
        "keyfile": str(ca / "server-broker.key"),
        "cafile": str(ca / "ca.pem"),
        "require_client_cert": True,
    }
    broker = start_broker(
        listeners=[{"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}]
    )
    device = PahoClient(broker.port, "meter-1", version=version, tls_context=holder(ca, "client-meter-1"))
    assert device.connack_result[1] == 0
    for kind in ("member-b1", "site-plant-1"):
        client = PahoClient(broker.port, kind, version=version, tls_context=holder(ca, kind))
        assert client.connack_result[1] == 0x87, kind  # paho reads v3.1.1's return code 5 as 0x87
    assert broker.refused("certificate_not_device") == 2
    device.disconnect()
