"""Devices whose certificates another PKI issued through an intermediate CA (``timestone pki ca`` makes CAs
that sign end certificates only): the listener trusts the root, devices send their chain, and the CRL the
broker checks is the intermediate's; a device revoked there is refused, and closed if it is connected. A
connection ends when its intermediate expires, or when a reload's ``cafile`` no longer holds an intermediate
the device does not send."""

from __future__ import annotations

import datetime
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from broker_edge.runtime.main import reload_files
from pipelines.cli import main
from tests.e2e.broker_clients import TIMEOUT, PahoClient
from tests.e2e.security.test_certificate_revocation import handshake_refused

NOW = datetime.datetime.now(datetime.UTC)
DAY = datetime.timedelta(days=1)


def named(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def signed(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Name,
    issuer_key: ec.EllipticCurvePrivateKey,
    ca: bool,
    until: datetime.datetime = NOW + 30 * DAY,
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(named(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - DAY)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), False)
    )
    if ca:
        usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
        builder = builder.add_extension(usage, critical=True).add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False
        )
    else:
        builder = builder.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
    return builder.sign(issuer_key, hashes.SHA256())


def pem(*certificates: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


class OtherPki:
    """A root, an intermediate it signed (valid ``until``), and devices the intermediate signed, in
    ``directory``."""

    def __init__(self, directory: Path, until: datetime.datetime = NOW + 30 * DAY) -> None:
        self.directory = directory
        self.root_key, self.key = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
        self.root = signed("plant root", self.root_key, named("plant root"), self.root_key, ca=True)
        self.intermediate = signed(
            "plant devices", self.key, self.root.subject, self.root_key, ca=True, until=until
        )
        (directory / "root.pem").write_bytes(pem(self.root))
        self.devices: dict[str, x509.Certificate] = {}

    def device(self, name: str, sends_intermediate: bool = True) -> ssl.SSLContext:
        """A device's TLS context: its certificate, then the intermediate's unless not ``sends_intermediate``
        (the listener's ``cafile`` must hold it then)."""
        key = ec.generate_private_key(ec.SECP256R1())
        self.devices[name] = signed(name, key, self.intermediate.subject, self.key, ca=False)
        chain = (self.intermediate,) if sends_intermediate else ()
        (self.directory / f"{name}.pem").write_bytes(pem(self.devices[name], *chain))
        (self.directory / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        context = ssl.create_default_context(cafile=str(self.directory / "server-ca" / "ca.pem"))
        context.load_cert_chain(str(self.directory / f"{name}.pem"), str(self.directory / f"{name}.key"))
        return context

    def crl(self, *revoked: str) -> Path:
        builder = x509.CertificateRevocationListBuilder().issuer_name(self.intermediate.subject)
        builder = builder.last_update(NOW - DAY).next_update(NOW + 7 * DAY)
        for name in revoked:
            entry = x509.RevokedCertificateBuilder().serial_number(self.devices[name].serial_number)
            builder = builder.add_revoked_certificate(entry.revocation_date(NOW - DAY).build())
        path = self.directory / "crl.pem"
        path.write_bytes(builder.sign(self.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
        return path


def devices_listener(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], cafile: Path, crlfile: Path | None = None
) -> dict[str, Any]:
    """A ``devices`` TLS listener requiring client certificates of ``cafile``'s CAs, serving a certificate
    ``timestone pki`` issued (the devices trust its CA, ``server-ca``)."""
    server = ["issue", "server", "broker", "--ca", str(tmp_path / "server-ca"), "--ip", "127.0.0.1"]
    server += ["--dns", "localhost"]
    assert main(["pki", "ca", str(tmp_path / "server-ca")]) == 0 and main(["pki", *server]) == 0
    capsys.readouterr()
    tls = {
        "certfile": str(tmp_path / "server-ca" / "server-broker.pem"),
        "keyfile": str(tmp_path / "server-ca" / "server-broker.key"),
        "cafile": str(cafile),
        "require_client_cert": True,
    }
    if crlfile is not None:
        tls["crlfile"] = str(crlfile)
    return {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}


def test_devices_of_an_intermediate_ca_connect_and_one_revoked_there_is_closed_and_refused(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = OtherPki(tmp_path)
    # the root only: devices send the intermediate; the intermediate's CRL (the root may sign CAs, its CRL
    # is not asked for)
    broker = start_broker(listeners=[devices_listener(tmp_path, capsys, tmp_path / "root.pem", other.crl())])
    meter_1, meter_2 = other.device("meter-1"), other.device("meter-2")
    first = PahoClient(broker.port, "m1", tls_context=meter_1)
    second = PahoClient(broker.port, "m2", tls_context=meter_2)
    assert first.connack_result[1] == second.connack_result[1] == 0

    other.crl("meter-1")
    broker.call(lambda: reload_files(broker.broker))
    assert first.disconnects.get(timeout=TIMEOUT) == 0x87
    assert handshake_refused(broker.port, meter_1)
    second.publish("plant/1/temp", b"21.5", qos=1)  # the intermediate's other device goes on
    second.disconnect()


def test_a_device_that_does_not_send_its_intermediate_is_closed_when_a_reload_takes_it_out_of_the_cafile(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A device that sends its certificate alone verifies through an intermediate of ``cafile``: once a
    reload's ``cafile`` holds the root alone, its chain no longer verifies, and its connection is closed
    (v5 DISCONNECT 0x87); a device that sends the intermediate still verifies, and stays."""
    other = OtherPki(tmp_path)
    cafile = tmp_path / "cas.pem"
    cafile.write_bytes(pem(other.root, other.intermediate))
    broker = start_broker(listeners=[devices_listener(tmp_path, capsys, cafile)])
    sender, leaner = other.device("meter-1"), other.device("meter-2", sends_intermediate=False)
    sending = PahoClient(broker.port, "m1", tls_context=sender)
    leaning = PahoClient(broker.port, "m2", tls_context=leaner)
    assert sending.connack_result[1] == leaning.connack_result[1] == 0

    cafile.write_bytes(pem(other.root))
    broker.call(lambda: reload_files(broker.broker))
    assert leaning.disconnects.get(timeout=TIMEOUT) == 0x87
    assert handshake_refused(broker.port, leaner)
    sending.publish("plant/1/temp", b"21.5", qos=1)
    assert sending.disconnects.empty()
    sending.disconnect()


def test_a_device_is_closed_when_its_intermediate_ca_expires_before_its_own_certificate(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """The chain's authorization ends with its first certificate to end: an intermediate of a few seconds
    closes its device's connection (v5 DISCONNECT 0x87), said naming the CA."""
    lifetime = 8.0  # time enough for the device to connect on a busy machine
    ends = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=lifetime)
    other = OtherPki(tmp_path, until=ends)
    caplog.set_level(logging.WARNING)
    broker = start_broker(listeners=[devices_listener(tmp_path, capsys, tmp_path / "root.pem")])
    meter = other.device("meter-1")
    device = PahoClient(broker.port, "m1", tls_context=meter)
    assert device.connack_result[1] == 0
    assert device.disconnects.get(timeout=lifetime + 30) == 0x87
    said = [r.getMessage() for r in caplog.records if "closing the connection" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(
        "closing the connection: the certificate of its CA (CN=plant devices) expired at "
    ), said
    assert said[0].endswith(" UTC (CN=meter-1)")
