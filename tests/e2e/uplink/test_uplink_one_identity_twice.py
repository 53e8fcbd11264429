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

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import (
    WanRelay,
    hub_port,
    hub_section,
    log_frames,
    payloads,
    pki_in,
    site_section,
)

pytestmark = pytest.mark.timeout(60)

TOPIC = "t/c"
MIRROR = site_topic("plant-c", TOPIC)
HUB_LOG, SITE_LOG = "broker_edge.uplink.hub", "broker_edge.uplink.site_link"


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


class Publishing:
    """Each of ``sites`` publishing a QoS 1 record to ``TOPIC`` every 50 ms, labelled with its name, until
    the block ends (two live sites)."""

    def __init__(self, sites: dict[str, RunningBroker]) -> None:
        self.sites = sites
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(0.05):
            for name, site in self.sites.items():
                site.call(partial(site.broker.publish, TOPIC, f"{name} r{n}".encode(), qos=1))
            n += 1

    def __enter__(self) -> Publishing:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(5)


def first_site_holding(
    brokers: Callable[..., RunningBroker], pki: LocalPki, hub: RunningBroker, port: int
) -> RunningBroker:
    """A site broker of plant-c dialling the hub on ``port``, once the hub holds its first record."""
    first = brokers("site-1", uplink=site_section(pki, "plant-c", port))
    first.call(partial(first.broker.publish, TOPIC, b"site-1 first", qos=1))
    assert wait_for(lambda: frames(hub, MIRROR)[1] == 1, 20)
    return first


def holds_only(hub: RunningBroker, site: RunningBroker) -> bool:
    """Whether the hub's copy of plant-c's log is ``site``'s, byte for byte, and holds nothing of another.

    Waited for, not asserted once: the site's last publishes become durable (and are uplinked) a moment
    after the publishing ends, so the two logs can be equal a moment before the site's grows again. A
    record of another broker in the hub's copy stays there, so it never turns true once one is mixed in."""
    return frames(hub, MIRROR) == frames(site, TOPIC) and not [
        p for p in held(hub, MIRROR) if not p.startswith(b"site-1")
    ]


def test_a_second_broker_with_a_connected_sites_certificate_is_refused_and_never_mixed_in(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    first = first_site_holding(brokers, pki, hub, hub_port(hub))
    second = brokers("site-2", uplink=site_section(pki, "plant-c", hub_port(hub)))
    refusals = partial(hub.metric, "timestone_broker_uplink_site_refused_connections", site="plant-c")
    with Publishing({"site-1": first, "site-2": second}):
        assert wait_for(lambda: refusals() >= 2, 20)
        assert said(caplog, logging.ERROR, HUB_LOG, "site plant-c is already connected from 127.0.0.1")
        assert said(caplog, logging.ERROR, SITE_LOG, "site 'plant-c' is already connected")
    assert wait_for(lambda: holds_only(hub, first), 20)


def test_a_cut_keeps_the_site_for_its_broker_and_a_second_one_is_refused_meanwhile(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first broker's link is cut (no close): the second, dialling while the first cannot, is refused
    as while the first was connected, where it took the site over and its records went on in the hub's
    copy; the first gets the site back once its link heals."""
    caplog.set_level(logging.WARNING)
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    wan = WanRelay(hub_port(hub))
    try:
        first = first_site_holding(brokers, pki, hub, wan.port)
        link = first.broker.site_link
        assert link is not None
        wan.cut(down=True)
        assert wait_for(lambda: not first.call(lambda: link.connected), 20)
        second = brokers("site-2", uplink=site_section(pki, "plant-c", hub_port(hub)))
        refusals = partial(hub.metric, "timestone_broker_uplink_site_refused_connections", site="plant-c")
        with Publishing({"site-1": first, "site-2": second}):
            assert wait_for(lambda: refusals() >= 2, 20)
            assert said(caplog, logging.ERROR, HUB_LOG, "its connection ended without a close")
            wan.heal()
            assert wait_for(lambda: first.call(lambda: link.connected), 20)
        assert wait_for(lambda: holds_only(hub, first), 20)
    finally:
        wan.close()
