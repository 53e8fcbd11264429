"""A hub whose data directory was lost or replaced (a restore, a new disk): a site's copies of the hub's
downlinked topics end past the hub's logs, and the records the hub takes below those ends never reach the
site. The hub says so at each connection, naming the site, the topic and both ends, where it said nothing
and the site's devices silently missed the actions published there."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import free_port
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_section, log_frames, pki_in, site_section

pytestmark = pytest.mark.timeout(60)


def publish(broker: RunningBroker, topic: str, count: int) -> None:
    def send() -> None:
        for n in range(count):
            broker.broker.publish(topic, f'{{"action": "ota-{n}"}}'.encode(), qos=1)

    broker.call(send)


def test_a_hub_holding_less_of_a_downlinked_topic_than_its_site_says_so(
    brokers: Callable[..., RunningBroker], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = pki_in(tmp_path)
    port = free_port()
    hub = brokers("hub-disk-1", uplink_hub=hub_section(pki, port=port))
    site = brokers("site", uplink=site_section(pki, "plant-h", port))
    site_store = site.broker.store
    assert site_store is not None
    publish(hub, "actions/all", 10)
    assert wait_for(lambda: site.call(lambda: log_frames(site_store, "actions/all"))[1] == 10, timeout=20)
    hub.stop()

    caplog.set_level(logging.ERROR, logger="broker_edge.uplink.hub")
    hub = brokers("hub-disk-2", uplink_hub=hub_section(pki, port=port))
    publish(hub, "actions/all", 3)
    said = "site plant-h holds 'actions/all' up to 10, this hub only to 3"

    def told() -> bool:
        return any(said in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)

    assert wait_for(told, timeout=20)
