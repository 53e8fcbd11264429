"""Devices that log in with client certificates: a TLS listener requiring certificates of a test CA, and
a paho client presenting one device's certificate under any client id."""

from __future__ import annotations

import ssl
from typing import Any

from broker_edge.runtime.local_pki import LocalPki
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
    pki: LocalPki, port: int, device_id: str, client_id: str, **options: Any
) -> PahoClient:
    """A client connected to ``port`` with ``device_id``'s certificate (its CN) as client ``client_id``."""
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    pair = pki.client(device_id)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return PahoClient(port, client_id, tls_context=context, **options)
