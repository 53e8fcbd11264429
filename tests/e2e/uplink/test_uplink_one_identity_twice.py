"""Two site brokers using one site's certificate (a cloned machine) uplinking to one hub at once. The hub
keeps the site's logs exactly one broker's: the second connection of a site already connected from another
broker (another data directory) is refused, said at ERROR on both ends and counted, so the records of the
two never mix in the site's logs at the same offsets, where the two took turns replacing each other's
connection and the hub's copy held records of both."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, log_frames, payloads, pki_in, site_section

pytestmark = pytest.mark.timeout(60)

TOPIC = "t/c"


def said(caplog: pytest.LogCaptureFixture, level: int, logger: str, text: str) -> bool:
    return any(r.levelno == level and r.name == logger and text in r.getMessage() for r in caplog.records)


def frames(broker: RunningBroker, topic: str) -> tuple[int, int, bytes]:
    store = broker.broker.store
    assert store is not None
    return broker.call(lambda: log_frames(store, topic))


def held(broker: RunningBroker, topic: str) -> list[bytes]:
    store = broker.broker.store
    assert store is not None
    return broker.call(lambda: payloads(store, [topic]))


def test_a_second_broker_with_a_connected_sites_certificate_is_refused_and_never_mixed_in(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    first = brokers("site-1", uplink=site_section(pki, "plant-c", hub_port(hub)))
    mirror = site_topic("plant-c", TOPIC)
    first.call(partial(first.broker.publish, TOPIC, b"site-1 first", qos=1))
    assert wait_for(lambda: frames(hub, mirror)[1] == 1, 20)
    second = brokers("site-2", uplink=site_section(pki, "plant-c", hub_port(hub)))
    sites = {"site-1": first, "site-2": second}
    stop = threading.Event()

    def publish() -> None:  # both keep sending, as two live sites do
        n = 0
        while not stop.wait(0.05):
            for name, site in sites.items():
                site.call(partial(site.broker.publish, TOPIC, f"{name} r{n}".encode(), qos=1))
            n += 1

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    hub_log, site_log = "broker_edge.uplink.hub", "broker_edge.uplink.site_link"
    refusals = partial(hub.metric, "timestone_broker_uplink_site_refused_connections", site="plant-c")
    try:
        assert wait_for(lambda: refusals() >= 2, 20)
        assert said(caplog, logging.ERROR, hub_log, "site plant-c is already connected from 127.0.0.1")
        assert said(caplog, logging.ERROR, site_log, "site 'plant-c' is already connected")
    finally:
        stop.set()
        thread.join(5)
    assert wait_for(lambda: frames(hub, mirror)[1:] == frames(first, TOPIC)[1:], 20)
    assert frames(hub, mirror) == frames(first, TOPIC)
    assert not [p for p in held(hub, mirror) if p.startswith(b"site-2")]
