"""A site's uplink ends with the hub's certificate's authorization, as the hub ends it with the site's: the
site checks, for as long as the link lasts, the certificate the hub served at the handshake, and closes the
link once it expires or once a SIGHUP reads the site's ``uplink.tls.cafile`` without its CA. OpenSSL checks
it at the handshake only. The site says so once naming the hub, counts it, and dials again: refused at the
handshake until the hub serves a certificate it trusts, then connected."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.runtime.main import reload_files
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.security.certificate_devices import reissued
from tests.e2e.uplink.test_uplink_site_certificates import site_warnings
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(180)

LIFETIME_S = 8.0
"""How long the hub's short-lived certificate holds: time enough for the site to connect on a busy
machine."""


def closes(site: RunningBroker, reason: str) -> float:
    return site.metric("timestone_broker_https_certificate_refusals_total", endpoint="uplink", reason=reason)


def connected(site: RunningBroker) -> bool:
    return site.metric("timestone_broker_uplink_connected") == 1


def closes_said(caplog: pytest.LogCaptureFixture, hub: RunningBroker, containing: str) -> list[str]:
    """The site's WARNINGs that it closed its uplink to ``hub``, ``containing`` the reason."""
    prefix = f"uplink to wss://127.0.0.1:{hub_port(hub)}/v1/uplink: closing the connection: "
    said = site_warnings(caplog, "broker_edge.http.guard", containing)
    return [line for line in said if line.startswith(prefix)]


def refused_at_the_handshake(caplog: pytest.LogCaptureFixture, words: str) -> bool:
    """The site dialed again and its handshake failed, the site's WARNING naming ``words``."""
    return wait_for(
        lambda: any(
            "again in" in line for line in site_warnings(caplog, "broker_edge.uplink.site_link", words)
        ),
        timeout=30,
    )


def test_a_site_ends_its_uplink_once_the_hubs_certificate_expires_and_is_back_once_the_hub_renews_it(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    pki = pki_in(tmp_path)
    server = pki.server("hub")
    now = datetime.datetime.now(datetime.UTC)
    reissued(
        server, pki.ca, now - datetime.timedelta(minutes=5), now + datetime.timedelta(seconds=LIFETIME_S)
    )
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-h", hub_port(hub)))
    assert wait_for(lambda: connected(site))
    assert wait_for(lambda: closes(site, "certificate_expired") == 1, timeout=LIFETIME_S + 30)
    said = closes_said(caplog, hub, "its server certificate expired at")
    assert len(said) == 1 and "(CN=hub)" in said[0], said
    assert refused_at_the_handshake(caplog, "certificate has expired")
    assert not connected(site)
    pki.authority.renew(server.cert, days=30)  # timestone pki renew, then SIGHUP the hub
    hub.call(lambda: reload_files(hub.broker))
    assert wait_for(lambda: connected(site), timeout=30)
    assert hub.metric("timestone_broker_uplink_site_connected", site="plant-h") == 1
    assert closes(site, "certificate_expired") == 1


def test_a_sighup_that_takes_the_hubs_ca_out_of_the_sites_cafile_ends_its_uplink(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last step of a hubs' CA rotation on the site: its ``uplink.tls.cafile`` read without the CA of
    the certificate the hub serves. The site ends the link, refused at its next handshakes; put back, the CA
    lets it in again at its next dial."""
    caplog.set_level(logging.INFO)
    pki = pki_in(tmp_path)
    other = LocalPki(tmp_path / "pki", name="hubs-2")
    cafile = tmp_path / "hub-cas.pem"
    cafile.write_bytes(pki.ca.cert.read_bytes() + other.ca.cert.read_bytes())
    hub = brokers("hub", uplink_hub=hub_section(pki))
    section = site_section(pki, "plant-t", hub_port(hub))
    section["tls"]["cafile"] = str(cafile)
    site = brokers("site", uplink=section)
    assert wait_for(lambda: connected(site))
    cafile.write_bytes(other.ca.cert.read_bytes())
    site.call(lambda: reload_files(site.broker))
    assert wait_for(lambda: closes(site, "certificate_untrusted") == 1, timeout=30)
    said = closes_said(caplog, hub, "its server certificate (CN=hub) is no longer trusted")
    assert len(said) == 1 and f"{cafile} lacks a CA its chain rests on" in said[0], said
    assert refused_at_the_handshake(caplog, "certificate verify failed")
    assert not connected(site)
    cafile.write_bytes(pki.ca.cert.read_bytes() + other.ca.cert.read_bytes())
    site.call(lambda: reload_files(site.broker))
    assert wait_for(lambda: connected(site), timeout=30)
    assert closes(site, "certificate_untrusted") == 1
