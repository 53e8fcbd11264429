"""Throwaway PKI for tests: a CA, a server certificate for 127.0.0.1/localhost, and a client certificate.

Made with the builders of ``timestone pki`` (``broker_edge.pki.builders``), with EC P-256 keys so it takes
milliseconds. Import it from any suite:
``from tests.tls_certs import make_test_pki``.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from broker_edge.pki.builders import (
    LeafKey,
    PrivateKey,
    build_ca,
    build_leaf,
    subject_name,
    write_certificate,
    write_key,
)
from broker_edge.runtime.local_pki import LOOPBACK_NAMES

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


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    write_certificate(path, cert)


def _make_leaf(
    ca_key: PrivateKey, ca_cert: x509.Certificate, common_name: str, *, server: bool
) -> tuple[LeafKey, x509.Certificate]:
    subject = subject_name(common_name, "Timestone test")
    return build_leaf(
        ca_key, ca_cert, subject, server=server, client=not server, names=LOOPBACK_NAMES if server else ()
    )


def make_test_pki(directory: str | Path, client_common_name: str = "device-1") -> PkiPaths:
    """Write a fresh CA, server and client certificates, plus an unrelated CA and client, to ``directory``."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = build_ca(subject_name("Timestone test CA", "Timestone test"), days=30)
    server_key, server_cert = _make_leaf(ca_key, ca_cert, "localhost", server=True)
    client_key, client_cert = _make_leaf(ca_key, ca_cert, client_common_name, server=False)
    other_ca_key, other_ca_cert = build_ca(subject_name("Unrelated test CA", "Unrelated"), days=30)
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
    write_key(paths.ca_key, ca_key)
    _write_cert(paths.server_cert, server_cert)
    write_key(paths.server_key, server_key)
    _write_cert(paths.client_cert, client_cert)
    write_key(paths.client_key, client_key)
    _write_cert(paths.other_ca_cert, other_ca_cert)
    _write_cert(paths.other_client_cert, other_client_cert)
    write_key(paths.other_client_key, other_client_key)
    return paths


def client_ssl_context(
    pki: PkiPaths, *, certificate: bool = True, trust: Path | None = None
) -> ssl.SSLContext:
    """A client context trusting the test CA (or ``trust``), presenting the client certificate if asked."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(trust or pki.ca_cert))
    if certificate:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def mutual_tls(pki: PkiPaths, cafile: Path | None = None) -> dict[str, object]:
    """A TLS listener's ``tls`` section serving the test server certificate and requiring a client
    certificate of the test CA (or of ``cafile``)."""
    return {
        "certfile": str(pki.server_cert),
        "keyfile": str(pki.server_key),
        "cafile": str(cafile or pki.ca_cert),
        "require_client_cert": True,
    }
