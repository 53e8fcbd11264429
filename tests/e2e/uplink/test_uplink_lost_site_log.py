"""A site whose data directory was lost or replaced, or whose logs another broker with its certificate went
on with in the hub's copy: the hub already holds its topics up to an end the site's logs are below. The site
moves each such log on to the hub's end at connection, so what its devices publish from then on reaches the
hub (where everything below the hub's end was dropped there as already held); the records it holds below
that end stay in its log and are named, not sent up, with no word of their never being sent: they may have
been, before the other broker went on."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.port_keeper import PortKeeper
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, log_frames, pki_in, site_section

pytestmark = pytest.mark.timeout(60)

Brokers = Callable[..., RunningBroker]
TOPIC = "telemetry/w"
HELD = site_topic("plant-w", TOPIC)


def publish(site: RunningBroker, count: int, label: str) -> None:
    def send() -> None:
        for n in range(count):
            site.broker.publish(TOPIC, f"{label} {n}".encode(), qos=1)

    site.call(send)


def hub_end(hub: RunningBroker) -> int:
    store = hub.broker.store
    assert store is not None
    return hub.call(lambda: log_frames(store, HELD))[1]


def payloads(broker: RunningBroker, topic: str, offset: int, end: int) -> list[bytes]:
    store = broker.broker.store
    assert store is not None
    return [record.payload for record in broker.call(lambda: store.read(topic, offset, end - offset))]


def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level and r.name.startswith("broker_edge")]


def site_that_lost_its_disk(brokers: Brokers, tmp_path: Path) -> tuple[RunningBroker, LocalPki]:
    """A hub holding 10 records of plant-w's telemetry/w, sent by a site broker now gone."""
    pki: LocalPki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki))
    first = brokers("site-disk-1", uplink=site_section(pki, "plant-w", hub_port(hub)))
    publish(first, 10, "before")
    assert wait_for(lambda: hub_end(hub) == 10, timeout=20)
    first.stop()
    return hub, pki


def test_a_site_started_on_an_empty_data_directory_goes_on_at_the_hubs_end_and_loses_nothing(
    brokers: Brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hub, pki = site_that_lost_its_disk(brokers, tmp_path)
    caplog.set_level(logging.WARNING, logger="broker_edge")
    second = brokers("site-disk-2", uplink=site_section(pki, "plant-w", hub_port(hub)))
    assert wait_for(lambda: second.call(lambda: second.broker.site_link.connected), timeout=20)
    publish(second, 15, "after")
    assert wait_for(lambda: hub_end(hub) == 25, timeout=20), hub_end(hub)
    assert payloads(hub, HELD, 0, 25) == [f"before {n}".encode() for n in range(10)] + [
        f"after {n}".encode() for n in range(15)
    ]
    assert payloads(second, TOPIC, 10, 25) == [f"after {n}".encode() for n in range(15)]
    warnings = messages(caplog, logging.WARNING)
    assert any("the hub holds 'telemetry/w' up to 10, this site none of it" in text for text in warnings)
    assert any("goes on at 10" in text for text in warnings), warnings
    assert messages(caplog, logging.ERROR) == []


def test_records_a_site_took_before_it_reached_the_hub_stay_in_its_log_and_are_named(
    brokers: Brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hub, pki = site_that_lost_its_disk(brokers, tmp_path)
    port = hub_port(hub)
    hub.stop()
    keeper = PortKeeper(port)
    second = brokers("site-disk-2", uplink=site_section(pki, "plant-w", port))
    publish(second, 5, "offline")  # the hub is down: offsets 0 to 4 here, which the hub holds already
    caplog.set_level(logging.WARNING, logger="broker_edge")
    keeper.release()
    hub = brokers("hub", uplink_hub=hub_section(pki, port=port))
    assert wait_for(lambda: second.call(lambda: second.broker.site_link.connected), timeout=20)
    publish(second, 7, "after")
    assert wait_for(lambda: hub_end(hub) == 17, timeout=20), hub_end(hub)
    assert payloads(hub, HELD, 10, 17) == [f"after {n}".encode() for n in range(7)]
    assert payloads(second, TOPIC, 0, 5) == [f"offline {n}".encode() for n in range(5)]
    assert payloads(second, TOPIC, 10, 17) == [f"after {n}".encode() for n in range(7)]
    errors = messages(caplog, logging.ERROR)
    assert any(
        "the hub holds 'telemetry/w' up to 10, this site only to 5" in text
        and "its records 0 to 4 stay here, not sent up (the hub holds records at those offsets already"
        in text
        and "the log goes on at 10" in text
        for text in errors
    ), errors


def test_a_site_back_after_another_broker_went_on_does_not_call_the_records_it_sent_never_sent(
    brokers: Brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first broker sent 0 to 9 and stopped; a second with the site's certificate (another data
    directory) took the site and sent 10 to 14. The first, started again on its data directory, moves its
    log on to 15 and names its records 0 to 9 as kept here, not sent up, where it said "never sent" of
    records the hub holds byte for byte."""
    hub, pki = site_that_lost_its_disk(brokers, tmp_path)
    clone = brokers("site-clone", uplink=site_section(pki, "plant-w", hub_port(hub)))
    assert wait_for(lambda: clone.call(lambda: clone.broker.site_link.connected), timeout=20)
    publish(clone, 5, "clone")
    assert wait_for(lambda: hub_end(hub) == 15, timeout=20), hub_end(hub)
    clone.stop()
    caplog.set_level(logging.WARNING, logger="broker_edge")
    first = brokers("site-disk-1", uplink=site_section(pki, "plant-w", hub_port(hub)))
    assert wait_for(lambda: first.call(lambda: first.broker.site_link.connected), timeout=20)
    publish(first, 3, "again")
    assert wait_for(lambda: hub_end(hub) == 18, timeout=20), hub_end(hub)
    sent = [f"before {n}".encode() for n in range(10)]
    assert payloads(hub, HELD, 0, 10) == payloads(first, TOPIC, 0, 10) == sent
    assert payloads(hub, HELD, 15, 18) == [f"again {n}".encode() for n in range(3)]
    errors = messages(caplog, logging.ERROR)
    assert any(
        "the hub holds 'telemetry/w' up to 15, this site only to 10: this site's log was lost or replaced, "
        "or another broker with this site's certificate sent the hub more; its records 0 to 9 stay here, "
        "not sent up (the hub holds records at those offsets already: these if they were sent before, else "
        "others); the log goes on at 15" in text
        for text in errors
    ), errors
    assert not any("never sent" in text for text in errors), errors
