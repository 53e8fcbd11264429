"""Two site brokers using one site's certificate (a cloned machine) take turns replacing each other's
connection, and their records mix in the hub's copy at the same offsets. Both ends say so: the replaced
connection is told why before it is closed (the site's WARNING), and the hub logs an ERROR naming the site
once its connection keeps being replaced, where the site said only that the hub closed the connection and
the hub logged each replacement at INFO."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, pki_in, site_section

pytestmark = pytest.mark.timeout(60)


def test_two_brokers_with_one_sites_certificate_are_said_at_both_ends(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    sites = [
        brokers(name, uplink=site_section(pki, "plant-c", hub_port(hub))) for name in ("site-1", "site-2")
    ]
    stop = threading.Event()

    def publish() -> None:  # both keep sending, as two live sites do
        n = 0
        while not stop.wait(0.05):
            for site in sites:
                site.call(partial(site.broker.publish, "t/c", f"r{n}".encode(), qos=1))
            n += 1

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    try:

        def said(level: int, logger: str, text: str) -> bool:
            return any(
                r.levelno == level and r.name == logger and text in r.getMessage() for r in caplog.records
            )

        hub_log, site_log = "broker_edge.uplink.hub", "broker_edge.uplink.site_link"
        assert wait_for(lambda: said(logging.ERROR, hub_log, "site plant-c: a new connection replaced"), 20)
        assert said(logging.WARNING, site_log, "site 'plant-c' connected again from 127.0.0.1")
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR and r.name == hub_log]
        assert "two brokers" in errors[0] and "$site/plant-c/#" in errors[0]
    finally:
        stop.set()
        thread.join(5)
