"""A hub that refuses a site's connection says why to both ends: the site's WARNING carries the hub's reason
(a site not in ``uplink_hub.sites``, a certificate naming no site), and the hub logs the refusal naming the
site, where the site said only "answered 403 Forbidden" and the hub said nothing."""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from broker_edge.uplink.wire import REFUSAL_HEADER
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(60)


def said(caplog: pytest.LogCaptureFixture, logger: str, text: str) -> bool:
    return any(r.name == logger and text in r.getMessage() for r in caplog.records)


def test_a_site_the_hub_does_not_admit_is_told_why_and_the_hub_says_so(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki, sites=["plant-1"]))
    brokers("site", uplink=site_section(pki, "plant-9", hub_port(hub)))
    site_log, hub_log = "broker_edge.uplink.site_link", "broker_edge.uplink.hub"
    reason = "site 'plant-9' is not admitted here"
    assert wait_for(lambda: said(caplog, site_log, f"answered 403 Forbidden: {reason}"), timeout=10)
    assert said(caplog, hub_log, f"refused a site's connection: {reason}")


def test_a_certificate_naming_no_site_is_told_so(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A site of ours does not dial with such a certificate (``uplink.tls.certfile`` must name its site, at
    start and at each dial); another client of the same CA does, and is told why by the hub."""
    caplog.set_level(logging.WARNING)
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    member = pki.member("b1")  # of the same CA, naming a node and no site
    reason = "the client certificate names no site (timestone://site/<site_id>)"

    async def dial() -> tuple[int, str]:
        context = ssl.create_default_context(cafile=str(pki.ca.cert))
        context.load_cert_chain(str(member.cert), str(member.key))
        context.check_hostname = False
        async with aiohttp.ClientSession() as session:
            try:
                await session.ws_connect(f"wss://127.0.0.1:{hub_port(hub)}/v1/uplink", ssl=context)
            except aiohttp.WSServerHandshakeError as refused:
                told = refused.headers.get(REFUSAL_HEADER, "") if refused.headers is not None else ""
                return refused.status, told
        raise AssertionError("the hub took the connection")

    assert asyncio.run(dial()) == (403, reason)
    assert wait_for(lambda: said(caplog, "broker_edge.uplink.hub", f"refused a site's connection: {reason}"))
