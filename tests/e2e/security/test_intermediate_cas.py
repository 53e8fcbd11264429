"""Devices whose certificates another PKI issued through an intermediate CA (``timestone pki ca`` makes CAs
that sign end certificates only): the listener trusts the root, devices send their chain, and the CRL the
broker checks is the intermediate's; a device revoked there is refused, and closed if it is connected."""

from __future__ import annotations

import datetime
import ssl
from pathlib import Path

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
) -> x509.Certificate:
    builder = (
        x509.CertificateBuilder()
        .subject_name(named(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - DAY)
        .not_valid_after(NOW + 30 * DAY)
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
    """A root, an intermediate it signed, and devices the intermediate signed, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.root_key, self.key = (
            ec.generate_private_key(ec.SECP256R1()),
            ec.generate_private_key(ec.SECP256R1()),
        )
        self.root = signed("plant root", self.root_key, named("plant root"), self.root_key, ca=True)
        self.intermediate = signed("plant devices", self.key, self.root.subject, self.root_key, ca=True)
        (directory / "root.pem").write_bytes(pem(self.root))
        self.devices: dict[str, x509.Certificate] = {}

    def device(self, name: str) -> ssl.SSLContext:
        key = ec.generate_private_key(ec.SECP256R1())
        self.devices[name] = signed(name, key, self.intermediate.subject, self.key, ca=False)
        (self.directory / f"{name}.pem").write_bytes(pem(self.devices[name], self.intermediate))
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


def test_devices_of_an_intermediate_ca_connect_and_one_revoked_there_is_closed_and_refused(
    start_broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = ["issue", "server", "broker", "--ca", str(tmp_path / "server-ca"), "--ip", "127.0.0.1"]
    assert main(["pki", "ca", str(tmp_path / "server-ca")]) == 0 and main(["pki", *server]) == 0
    capsys.readouterr()
    other = OtherPki(tmp_path)
    meter_1, meter_2 = other.device("meter-1"), other.device("meter-2")
    tls = {
        "certfile": str(tmp_path / "server-ca" / "server-broker.pem"),
        "keyfile": str(tmp_path / "server-ca" / "server-broker.key"),
        "cafile": str(tmp_path / "root.pem"),  # the root only: devices send the intermediate
        "require_client_cert": True,
        "crlfile": str(other.crl()),  # the intermediate's: the root may sign CAs, its CRL is not asked for
    }
    broker = start_broker(
        listeners=[{"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}]
    )
    first = PahoClient(broker.port, "m1", tls_context=meter_1)
    second = PahoClient(broker.port, "m2", tls_context=meter_2)
    assert first.connack_result[1] == second.connack_result[1] == 0

    other.crl("meter-1")
    broker.call(lambda: reload_files(broker.broker))
    assert first.disconnects.get(timeout=TIMEOUT) == 0x87
    assert handshake_refused(broker.port, meter_1)
    second.publish("plant/1/temp", b"21.5", qos=1)  # the intermediate's other device goes on
    second.disconnect()
