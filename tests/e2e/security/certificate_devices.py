"""Devices that log in with client certificates: a TLS listener requiring certificates of a test CA, a
paho client presenting one device's certificate under any client id, and a certificate issued again for
another validity (seconds, where ``timestone pki`` gives days)."""

from __future__ import annotations

import datetime
import ssl
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from broker_edge.runtime.local_pki import LocalPki, PemPair
from tests.e2e.broker_clients import PahoClient


def certificate_listener(pki: LocalPki) -> dict[str, Any]:
    """A ``devices`` TLS listener on a free port whose clients must present a certificate of ``pki``."""
    server = pki.server("edge")
    tls = {
        "certfile": str(server.cert),
        "keyfile": str(server.key),
        "cafile": str(pki.ca.cert),
        "require_client_cert": True,
    }
    return {"name": "devices", "type": "tls", "host": "127.0.0.1", "port": 0, "tls": tls}


def certificate_holder(
    pki: LocalPki,
    port: int,
    device_id: str,
    client_id: str,
    server_pki: LocalPki | None = None,
    **options: Any,
) -> PahoClient:
    """A client connected to ``port`` with ``device_id``'s certificate (its CN) as client ``client_id``,
    trusting the server's certificate of ``server_pki`` (default: ``pki``)."""
    context = ssl.create_default_context(cafile=str((server_pki or pki).ca.cert))
    pair = pki.client(device_id)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return PahoClient(port, client_id, tls_context=context, **options)


def reissued(pair: PemPair, ca: PemPair, not_before: datetime.datetime, not_after: datetime.datetime) -> None:
    """The certificate of ``pair`` issued again by the CA of ``ca`` (its names, uses and key) for another
    validity, written over it: ``timestone pki`` issues whole days only."""
    pair.cert.write_bytes(reissued_pem(pair.cert.read_bytes(), ca.key.read_bytes(), not_before, not_after))


def reissued_pem(
    cert: bytes, ca_key: bytes, not_before: datetime.datetime, not_after: datetime.datetime
) -> bytes:
    """The PEM certificate ``cert`` signed again with the CA key ``ca_key`` (PEM) for another validity, its
    names, key and extensions kept."""
    issued = x509.load_pem_x509_certificate(cert)
    signer = serialization.load_pem_private_key(ca_key, None)
    assert isinstance(signer, ec.EllipticCurvePrivateKey)
    builder = (
        x509.CertificateBuilder()
        .subject_name(issued.subject)
        .issuer_name(issued.issuer)
        .public_key(issued.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
    )
    for extension in issued.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    return builder.sign(signer, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def ending_in(pki: LocalPki, device_id: str, seconds: float) -> PemPair:
    """``device_id``'s certificate of ``pki``, issued again to end ``seconds`` from now."""
    pair = pki.client(device_id)
    now = datetime.datetime.now(datetime.UTC)
    reissued(pair, pki.ca, now - datetime.timedelta(minutes=5), now + datetime.timedelta(seconds=seconds))
    return pair
