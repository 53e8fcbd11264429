"""A site whose data directory was lost or replaced: the hub already holds its topics, the site's new logs
start again at 0, and the site says which of its records the hub will never hold."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, log_frames, pki_in, site_section

pytestmark = pytest.mark.timeout(60)

Brokers = Callable[..., RunningBroker]


def publish(site: RunningBroker, topic: str, count: int, label: str) -> None:
    def send() -> None:
        for n in range(count):
            site.broker.publish(topic, f"{label} {n}".encode(), qos=1)

    site.call(send)


def hub_end(hub: RunningBroker, topic: str) -> int:
    store = hub.broker.store
    assert store is not None
    return hub.call(lambda: log_frames(store, topic))[1]


def test_a_site_started_on_an_empty_data_directory_says_which_records_the_hub_will_not_hold(
    brokers: Brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki: LocalPki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    first = brokers("site-disk-1", uplink=site_section(pki, "plant-w", hub_port(hub)))
    publish(first, "telemetry/w", 10, "before")
    held = site_topic("plant-w", "telemetry/w")
    assert wait_for(lambda: hub_end(hub, held) == 10, timeout=20)
    first.stop()

    caplog.set_level(logging.ERROR, logger="broker_edge.uplink")
    second = brokers("site-disk-2", uplink=site_section(pki, "plant-w", hub_port(hub)))
    assert wait_for(lambda: second.call(lambda: second.broker.site_link.connected), timeout=20)
    publish(second, "telemetry/w", 15, "after")
    assert wait_for(lambda: hub_end(hub, held) == 15, timeout=20)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("'telemetry/w' up to 10, this site only to 0" in text for text in errors), errors
