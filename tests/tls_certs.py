"""Throwaway PKI for tests: a CA, a server certificate for 127.0.0.1/localhost, and a client certificate.

Made with the ``cryptography`` package (installed with the project's dependencies), in memory, with EC P-256
keys so it takes milliseconds. Import it from any suite: ``from tests.tls_certs import make_test_pki``.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["PkiPaths", "client_ssl_context", "make_test_pki"]


@dataclass(frozen=True)
class PkiPaths:
    """PEM files of one throwaway PKI (keys unencrypted)."""

    directory: Path
    ca_cert: Path
    ca_key: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_common_name: str
    other_ca_cert: Path
    """A second, unrelated CA: a client that trusts only it must reject the server."""
    other_client_cert: Path
    """A client certificate signed by the unrelated CA: the server must reject it."""
    other_client_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Timestone tests"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.chmod(0o600)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _make_ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _make_leaf(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, common_name: str, *, server: bool
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("::1")),
                ]
            ),
            critical=False,
        )
    return key, builder.sign(ca_key, hashes.SHA256())


def make_test_pki(directory: str | Path, client_common_name: str = "device-1") -> PkiPaths:
    """Write a fresh CA, server and client certificates, plus an unrelated CA and client, to ``directory``."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _make_ca("Timestone test CA")
    server_key, server_cert = _make_leaf(ca_key, ca_cert, "localhost", server=True)
    client_key, client_cert = _make_leaf(ca_key, ca_cert, client_common_name, server=False)
    other_ca_key, other_ca_cert = _make_ca("Unrelated test CA")
    other_client_key, other_client_cert = _make_leaf(
        other_ca_key, other_ca_cert, client_common_name, server=False
    )
    paths = PkiPaths(
        directory=root,
        ca_cert=root / "ca.pem",
        ca_key=root / "ca.key",
        server_cert=root / "server.pem",
        server_key=root / "server.key",
        client_cert=root / "client.pem",
        client_key=root / "client.key",
        client_common_name=client_common_name,
        other_ca_cert=root / "other-ca.pem",
        other_client_cert=root / "other-client.pem",
        other_client_key=root / "other-client.key",
    )
    _write_cert(paths.ca_cert, ca_cert)
    _write_key(paths.ca_key, ca_key)
    _write_cert(paths.server_cert, server_cert)
    _write_key(paths.server_key, server_key)
    _write_cert(paths.client_cert, client_cert)
    _write_key(paths.client_key, client_key)
    _write_cert(paths.other_ca_cert, other_ca_cert)
    _write_cert(paths.other_client_cert, other_client_cert)
    _write_key(paths.other_client_key, other_client_key)
    return paths


def client_ssl_context(
    pki: PkiPaths, *, certificate: bool = True, trust: Path | None = None
) -> ssl.SSLContext:
    """A client context trusting the test CA (or ``trust``), presenting the client certificate if asked."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(trust or pki.ca_cert))
    if certificate:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context
