"""A site's link ends with its certificate's authorization: when the certificate expires while the site is
connected, and at a SIGHUP whose ``uplink_hub.tls.cafile`` no longer holds its CA or whose CRLs revoke it.
OpenSSL checks both at the handshake only; the hub ends the link itself, says so once naming the site, and
counts it. The site's next handshakes are refused until it has a renewed certificate; then it resumes from
the hub's ends, and the hub's copy equals the site's logs, every acknowledged record once."""

from __future__ import annotations

import base64
import datetime
import logging
import os
import socket
import ssl
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from broker_edge.pki.revocation import revoke, write_crl
from broker_edge.runtime.local_pki import LocalPki, PemPair
from broker_edge.runtime.main import reload_files
from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.security.certificate_devices import reissued
from tests.e2e.security.test_certificate_revocation import handshake_refused
from tests.e2e.uplink.uplink_harness import (
    Telemetry,
    hub_port,
    hub_section,
    log_frames,
    payloads,
    pki_in,
    site_section,
)

pytestmark = pytest.mark.timeout(180)

LIFETIME_S = 8.0
"""How long the short-lived site certificate holds: time enough for the site to connect on a busy machine."""

TOPICS = [f"telemetry/dev-{n}" for n in range(3)]


def site_context(server_pki: LocalPki, pair: PemPair) -> ssl.SSLContext:
    """A site's TLS as it dials: its certificate files as they are now, the hub's CA trusted."""
    context = ssl.create_default_context(cafile=str(server_pki.ca.cert))
    context.load_cert_chain(str(pair.cert), str(pair.key))
    return context


def site_warnings(caplog: pytest.LogCaptureFixture, logger: str, containing: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == logger and r.levelno == logging.WARNING and containing in r.getMessage()
    ]


def refused_while_dialling(
    hub: RunningBroker, pki: LocalPki, pair: PemPair, caplog: pytest.LogCaptureFixture, site_id: str
) -> None:
    """The site, ended, dials again and is refused at each handshake: it stays out (twice more seen)."""
    said = len(site_warnings(caplog, "broker_edge.uplink.site_link", "again in"))
    assert wait_for(
        lambda: len(site_warnings(caplog, "broker_edge.uplink.site_link", "again in")) >= said + 2, timeout=30
    )
    assert hub.metric("timestone_broker_uplink_site_connected", site=site_id) == 0
    assert handshake_refused(hub_port(hub), site_context(pki, pair))


def exactly_mirrored(hub: RunningBroker, site: RunningBroker, site_id: str, telemetry: Telemetry) -> bool:
    """The hub's copy is the site's logs offset for offset, byte for byte (none twice), and holds every
    payload the devices had acknowledged (none lost)."""
    hub_store, site_store = hub.broker.store, site.broker.store
    assert hub_store is not None and site_store is not None
    names = [site_topic(site_id, topic) for topic in TOPICS]
    hub_logs = hub.call(lambda: [log_frames(hub_store, name) for name in names])
    site_logs = site.call(lambda: [log_frames(site_store, topic) for topic in TOPICS])
    held = set(hub.call(lambda: payloads(hub_store, names)))
    return hub_logs == site_logs and telemetry.acknowledged <= held


def back_in_exactly(
    hub: RunningBroker, site: RunningBroker, site_id: str, telemetry: Telemetry, published: int
) -> None:
    """The site, its certificate renewed, is connected again; once its devices stop, the hub holds its logs
    exactly."""
    connected = partial(hub.metric, "timestone_broker_uplink_site_connected", site=site_id)
    assert wait_for(lambda: connected() == 1, timeout=30)
    assert wait_for(lambda: len(telemetry.acknowledged) >= published + 50, timeout=30)
    telemetry.stop()
    assert wait_for(lambda: exactly_mirrored(hub, site, site_id, telemetry), timeout=60)


def test_a_site_whose_certificate_expires_is_ended_refused_and_back_in_exactly_once_renewed(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A site certificate of a few seconds: the hub ends the link once it has expired, says so once and
    counts it; the site's redials are refused; ``timestone pki renew`` lets it back in."""
    caplog.set_level(logging.INFO)
    pki = pki_in(tmp_path)
    pair = pki.site("plant-e")
    now = datetime.datetime.now(datetime.UTC)
    reissued(pair, pki.ca, now - datetime.timedelta(minutes=5), now + datetime.timedelta(seconds=LIFETIME_S))
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-e", hub_port(hub)))
    closes = partial(
        hub.metric, "timestone_broker_uplink_site_certificate_closes", site="plant-e", reason="expired"
    )
    telemetry = Telemetry(site.port, TOPICS)
    try:
        assert wait_for(lambda: hub.metric("timestone_broker_uplink_site_connected", site="plant-e") == 1)
        assert wait_for(lambda: closes() == 1, timeout=LIFETIME_S + 30)
        refused_while_dialling(hub, pki, pair, caplog, "plant-e")
        said = site_warnings(caplog, "broker_edge.uplink.hub", "its client certificate expired at")
        assert len(said) == 1 and said[0].startswith("site plant-e: closing the connection:"), said
        assert closes() == 1
        pki.authority.renew(pair.cert, days=30)  # timestone pki renew: a new key and certificate
        back_in_exactly(hub, site, "plant-e", telemetry, len(telemetry.acknowledged))
    finally:
        telemetry.stop()
    assert closes() == 1


@pytest.mark.parametrize("why", ["untrusted", "revoked"])
def test_a_reload_that_no_longer_trusts_or_revokes_a_site_ends_its_link_and_a_new_certificate_gets_back_in(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture, why: str
) -> None:
    """The last step of a sites' CA rotation (``cafile`` read with the new CA alone), or the site's
    certificate revoked (``crlfile`` read with its serial): the SIGHUP ends the link of the site still
    connected with it, says so once and counts it; its redials are refused; a certificate of the new CA (a
    renewed one) lets it back in."""
    caplog.set_level(logging.INFO)
    pki = pki_in(tmp_path)  # the hub's CA, and the sites' first CA
    new_ca = LocalPki(tmp_path / "pki", name="sites-2")
    pair = pki.site("plant-r")
    cafile, crlfile = tmp_path / "sites-cas.pem", tmp_path / "sites-crls.pem"
    cafile.write_bytes(pki.ca.cert.read_bytes() + new_ca.ca.cert.read_bytes())

    def write_crls() -> None:
        crlfile.write_bytes(write_crl(pki.authority).read_bytes() + write_crl(new_ca.authority).read_bytes())

    section = hub_section(pki)
    section["tls"]["cafile"] = str(cafile)
    if why == "revoked":
        write_crls()
        section["tls"]["crlfile"] = str(crlfile)
    hub = brokers("hub", uplink_hub=section)
    site = brokers("site", uplink=site_section(pki, "plant-r", hub_port(hub)))
    closes = partial(
        hub.metric, "timestone_broker_uplink_site_certificate_closes", site="plant-r", reason=why
    )
    telemetry = Telemetry(site.port, TOPICS)
    try:
        assert wait_for(lambda: hub.metric("timestone_broker_uplink_site_connected", site="plant-r") == 1)
        assert wait_for(lambda: len(telemetry.acknowledged) >= 50, timeout=30)
        if why == "untrusted":
            cafile.write_bytes(new_ca.ca.cert.read_bytes())
        else:
            revoke(pki.authority, pair.cert)
            write_crls()
        hub.call(lambda: reload_files(hub.broker))
        assert wait_for(lambda: closes() == 1, timeout=10)
        refused_while_dialling(hub, pki, pair, caplog, "plant-r")
        reason = "is no longer trusted" if why == "untrusted" else "is revoked in"
        said = site_warnings(caplog, "broker_edge.uplink.hub", reason)
        assert len(said) == 1 and said[0].startswith("site plant-r: closing its uplink:"), said
        if why == "untrusted":
            new_ca.authority.issue("site", "plant-r", out=pair.cert.with_suffix(""), replace=True)
        else:
            pki.authority.renew(pair.cert, days=30)
        back_in_exactly(hub, site, "plant-r", telemetry, len(telemetry.acknowledged))
    finally:
        telemetry.stop()
    assert closes() == 1


def upgrade(port: int, context: ssl.SSLContext, session: ssl.SSLSession | None = None) -> tuple[bytes, Any]:
    """A WebSocket upgrade of the hub's uplink path over TLS (resuming ``session`` when given): the
    answer's status line, and the TLS session (to resume) with whether this one was resumed."""
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /v1/uplink HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost", session=session) as tls,
    ):
        tls.sendall(request.encode())
        answer = tls.recv(65536)
        return answer.split(b"\r\n", 1)[0], (tls.session, tls.session_reused)


@pytest.mark.parametrize("why", ["untrusted", "revoked"])
def test_a_tls_session_begun_before_the_reload_does_not_let_the_certificate_back_in(
    brokers: Callable[..., RunningBroker], tmp_path: Path, why: str
) -> None:
    """A resumed TLS session is not verified again: the holder of a site's key, who kept a session from
    before the reload that revoked its certificate (or took its CA out), resumes it. The hub refuses the
    upgrade (403), where it took it as the site."""
    pki = pki_in(tmp_path)
    new_ca = LocalPki(tmp_path / "pki", name="sites-2")
    pair = pki.site("plant-s")
    cafile, crlfile = tmp_path / "sites-cas.pem", tmp_path / "sites-crls.pem"
    cafile.write_bytes(pki.ca.cert.read_bytes() + new_ca.ca.cert.read_bytes())

    def write_crls() -> None:
        crlfile.write_bytes(write_crl(pki.authority).read_bytes() + write_crl(new_ca.authority).read_bytes())

    write_crls()
    section = hub_section(pki)
    section["tls"].update(cafile=str(cafile), crlfile=str(crlfile))
    hub = brokers("hub", uplink_hub=section)
    context = site_context(pki, pair)
    status, (session, _) = upgrade(hub_port(hub), context)
    assert status == b"HTTP/1.1 101 Switching Protocols"
    status, (session, resumed) = upgrade(hub_port(hub), context, session)
    assert status == b"HTTP/1.1 101 Switching Protocols" and resumed  # the server resumes sessions
    uplink_hub = hub.broker.uplink_hub
    assert uplink_hub is not None
    assert wait_for(lambda: not hub.call(lambda: len(uplink_hub.certificates.connections)))  # both ended
    if why == "untrusted":
        cafile.write_bytes(new_ca.ca.cert.read_bytes())
    else:
        revoke(pki.authority, pair.cert)
        write_crls()
    hub.call(lambda: reload_files(hub.broker))

    status, (_, resumed) = upgrade(hub_port(hub), context, session)
    assert resumed and status == b"HTTP/1.1 403 Forbidden", status
    reason = "untrusted" if why == "untrusted" else "revoked"
    assert hub.metric("timestone_broker_uplink_site_certificate_closes", site="plant-s", reason=reason) == 1
    assert handshake_refused(hub_port(hub), context)
