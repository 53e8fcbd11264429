"""A site broker SIGKILLed and restarted under continuous telemetry: every record a device had acknowledged
reaches the hub once, at the site's offsets, byte for byte."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from broker_edge.settings.uplink import site_topic
from broker_edge.storage import LogStore
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import (
    Telemetry,
    hub_port,
    hub_section,
    log_frames,
    pki_in,
    site_section,
)

pytestmark = pytest.mark.timeout(120)

TOPICS = [f"telemetry/dev-{n}" for n in range(5)]


def hub_payloads(hub: RunningBroker, site_id: str) -> list[bytes]:
    store = hub.broker.store
    assert store is not None

    def read() -> list[bytes]:
        payloads: list[bytes] = []
        for topic in TOPICS:
            name = site_topic(site_id, topic)
            if name in store:
                payloads += [record.payload for record in store.read(name, 0, 1_000_000, 1 << 30)]
        return payloads

    return hub.call(read)


def test_a_killed_and_restarted_site_loses_nothing_it_acknowledged_and_sends_nothing_twice(
    brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = BrokerProcess(tmp_path / "site", uplink=site_section(pki, "plant-k", hub_port(hub))).start()
    telemetry = Telemetry(site.port, TOPICS)
    try:
        assert wait_for(lambda: len(telemetry.acknowledged) >= 200, timeout=20)
        site.kill()
        acknowledged_before = len(telemetry.acknowledged)
        site.start()
        assert wait_for(lambda: len(telemetry.acknowledged) >= acknowledged_before + 200, timeout=20)
        site.kill()
        site.start()
        assert wait_for(lambda: len(telemetry.acknowledged) >= acknowledged_before + 400, timeout=20)
    finally:
        telemetry.stop()
    assert wait_for(lambda: telemetry.acknowledged <= set(hub_payloads(hub, "plant-k")), timeout=30)
    site.stop()
    # None twice: the hub's logs are the site's, offset for offset (a device's QoS 1 resend after a kill is
    # the device's duplicate, at its own offset on the site, and so on the hub).
    hub_store = hub.broker.store
    assert hub_store is not None
    hub_logs = hub.call(lambda: [log_frames(hub_store, site_topic("plant-k", topic)) for topic in TOPICS])
    with LogStore(tmp_path / "site" / "data") as site_store:
        assert hub_logs == [log_frames(site_store, topic) for topic in TOPICS]
