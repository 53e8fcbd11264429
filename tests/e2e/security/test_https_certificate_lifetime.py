"""A kept-alive HTTPS connection opened with a client certificate ends with that certificate's authorization:
a request on it after the certificate expired, or after a SIGHUP whose ``cafile`` no longer holds its CA,
is refused (403, the connection closed), counted and said, where it was served for as long as the client
kept the connection alive. OpenSSL checks a certificate at the handshake only."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509

from broker_edge.pki.revocation import revoke, write_crl
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.runtime.main import reload_files
from tests.e2e.broker_clients import wait_for
from tests.e2e.security.certificate_devices import ending_in
from tests.e2e.security.test_certificate_revocation import handshake_refused

LIFETIME_S = 6.0
"""How long the short-lived reader certificate holds: time enough for a first request on a busy machine."""


def mutual_tls(pki: LocalPki, cafile: Path | None = None) -> dict[str, Any]:
    """The offsets API's TLS: a server certificate of ``pki``, client certificates of ``cafile``'s CAs."""
    server = pki.server("edge")
    return {
        "certfile": str(server.cert),
        "keyfile": str(server.key),
        "cafile": str(cafile or pki.ca.cert),
        "require_client_cert": True,
    }


def reader_context(pki: LocalPki, name: str, server_pki: LocalPki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(server_pki.ca.cert))
    pair = pki.client(name)
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return context


def ask(connection: http.client.HTTPSConnection) -> tuple[int, dict[str, Any], str | None]:
    """``GET /v1/logs`` on ``connection`` (kept alive): the status, the JSON body, its Connection header."""
    connection.request("GET", "/v1/logs")
    answer = connection.getresponse()
    return answer.status, json.loads(answer.read()), answer.getheader("Connection")


def refusals(broker: Any, reason: str) -> float:
    return float(
        broker.metric(
            "timestone_broker_https_certificate_refusals_total", endpoint="offsets API", reason=reason
        )
    )


def test_a_request_after_the_client_certificate_expired_is_refused_on_its_kept_alive_connection(
    brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pki = LocalPki(tmp_path / "pki")
    pair = ending_in(pki, "reader-1", LIFETIME_S)
    ends = x509.load_pem_x509_certificate(pair.cert.read_bytes()).not_valid_after_utc.timestamp()
    broker = brokers(offsets_api={"host": "127.0.0.1", "port": 0, "tls": mutual_tls(pki)})
    port = broker.broker.offsets_port
    context = reader_context(pki, "reader-1", pki)
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    assert ask(connection)[0] == 200
    assert wait_for(lambda: time.time() > ends + 1, timeout=LIFETIME_S + 30)

    status, body, closing = ask(connection)
    assert (status, body.get("error"), closing) == (403, "certificate_expired", "close"), body
    assert refusals(broker, "certificate_expired") == 1
    said = [r.getMessage() for r in caplog.records if "its client certificate expired at" in r.getMessage()]
    assert len(said) == 1 and said[0].endswith("UTC (CN=reader-1)"), said
    assert handshake_refused(port, context)


def kept_alive(port: int, context: ssl.SSLContext) -> http.client.HTTPSConnection:
    """A connection that was served once and is kept alive."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    assert ask(connection)[0] == 200
    return connection


@pytest.mark.parametrize("why", ["untrusted", "revoked"])
def test_a_request_on_a_connection_a_reload_no_longer_trusts_or_revokes_is_refused(
    brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture, why: str
) -> None:
    """The SIGHUP that reads ``cafile`` without the CA a kept-alive connection's certificate rests on (the
    last step of a CA rotation), or a ``crlfile`` listing it: that connection's next request is refused;
    another reader's kept-alive connection, of a CA still trusted and not revoked, is served."""
    caplog.set_level(logging.WARNING)
    pki = LocalPki(tmp_path / "pki")  # the server's CA, and the readers' first
    new_ca = LocalPki(tmp_path / "pki", name="readers-2")
    cafile = tmp_path / "reader-cas.pem"
    cafile.write_bytes(pki.ca.cert.read_bytes() + new_ca.ca.cert.read_bytes())
    crlfile = tmp_path / "reader-crls.pem"

    def write_crls() -> None:
        crlfile.write_bytes(write_crl(pki.authority).read_bytes() + write_crl(new_ca.authority).read_bytes())

    tls = mutual_tls(pki, cafile)
    if why == "revoked":
        write_crls()
        tls["crlfile"] = str(crlfile)
    broker = brokers(offsets_api={"host": "127.0.0.1", "port": 0, "tls": tls})
    port = broker.broker.offsets_port
    ended = kept_alive(port, reader_context(pki, "reader-1", pki))
    other = kept_alive(port, reader_context(new_ca, "reader-2", pki))
    if why == "untrusted":
        cafile.write_bytes(new_ca.ca.cert.read_bytes())
    else:
        revoke(pki.authority, pki.client("reader-1").cert)
        write_crls()
    broker.call(lambda: reload_files(broker.broker))

    status, body, closing = ask(ended)
    assert (status, body.get("error"), closing) == (403, f"certificate_{why}", "close"), body
    assert ask(other)[0] == 200
    assert refusals(broker, f"certificate_{why}") == 1
    said = "is no longer trusted" if why == "untrusted" else "is revoked in"
    lines = [r.getMessage() for r in caplog.records if said in r.getMessage()]
    serial = x509.load_pem_x509_certificate(pki.client("reader-1").cert.read_bytes()).serial_number
    named = "(CN=reader-1)" if why == "untrusted" else f"(CN=reader-1, serial {serial:x})"
    assert len(lines) == 1 and f"its client certificate {named}" in lines[0], lines
    assert handshake_refused(port, reader_context(pki, "reader-1", pki))
