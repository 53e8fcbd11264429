"""A site whose batches are larger than its hub takes (``uplink.batch_bytes`` past the hub's
``uplink_hub.max_message_bytes``) sends batches the hub takes: the hub says its limit in ``ENDS``, and a
record too large for it is said naming that setting. Where the hub closed the connection at each such batch
(WebSocket close code 1009) and the site sent the same batch again at each dial: nothing of its logs ever
reached the hub, and it said only "Cannot write to closing transport"."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from broker_edge.settings.uplink import site_topic
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import (
    batch_message,
    converse_as_site,
    frames_at,
    hub_port,
    hub_section,
    log_frames,
    pki_in,
    site_section,
)

pytestmark = pytest.mark.timeout(60)

Brokers = Callable[..., RunningBroker]


def publish(site: RunningBroker, topic: str, payloads: list[bytes]) -> None:
    def send() -> None:
        for payload in payloads:
            site.broker.publish(topic, payload, qos=1)

    site.call(send)


def held(hub: RunningBroker, topic: str) -> int:
    store = hub.broker.store
    assert store is not None
    return hub.call(lambda: log_frames(store, topic))[1]


def test_batches_larger_than_the_hub_takes_are_cut_to_fit_and_every_record_arrives(
    brokers: Brokers, tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki, max_message_bytes=100_000))
    section = site_section(pki, "plant-b", hub_port(hub), compression="none", batch_bytes=400_000)
    site = brokers("site", uplink=section)
    publish(site, "t/b", [os.urandom(10_000) for _ in range(60)])
    assert wait_for(lambda: held(hub, site_topic("plant-b", "t/b")) == 60, timeout=20)


def test_a_record_larger_than_the_hub_takes_is_said_naming_the_hubs_setting(
    brokers: Brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki, max_message_bytes=100_000))
    site = brokers("site", uplink=site_section(pki, "plant-b", hub_port(hub), compression="none"))
    publish(site, "t/huge", [os.urandom(150_000)])

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "uplink_hub.max_message_bytes" in r.getMessage()]

    assert wait_for(lambda: bool(said()), timeout=10)
    assert "'t/huge'" in said()[0] and "100000" in said()[0]


def test_a_message_past_the_hubs_limit_is_said_by_the_hub_naming_the_site_and_the_setting(
    brokers: Brokers, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A site of an earlier version does not know the hub's limit: the hub closes its connection (1009)
    and says why, where it said nothing."""
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki, max_message_bytes=10_000))
    frames = frames_at(0, [os.urandom(20_000)])
    answers = converse_as_site(pki, "plant-o", hub_port(hub), [batch_message("t/o", 0, frames)])
    assert answers[1] is None  # closed

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "broker_edge.uplink.hub"]

    assert wait_for(lambda: any("uplink_hub.max_message_bytes" in text for text in said()), timeout=10)
    text = next(text for text in said() if "uplink_hub.max_message_bytes" in text)
    assert "site plant-o" in text and "10000" in text


def test_a_report_of_many_logs_is_cut_to_fit_the_hubs_limit_and_every_record_arrives(
    brokers: Brokers, tmp_path: Path
) -> None:
    """The site's log ends ride in a batch's header (every log's, after each connection): 1,500 logs' ends
    are more than the hub's limit, and go in reports that fit it, where the batch carrying them was not
    sent and the site dialled again, forever."""
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki, max_message_bytes=20_000))
    site = brokers("site", uplink=site_section(pki, "plant-m", hub_port(hub), compression="none"))
    topics = [f"telemetry/device-{n:05d}" for n in range(1500)]

    def send() -> None:
        for topic in topics:
            site.broker.publish(topic, b"r", qos=1)

    site.call(send)
    store = hub.broker.store
    assert store is not None

    def held_logs() -> int:
        return hub.call(lambda: len(store.logs(site_topic("plant-m", "#"))))

    assert wait_for(lambda: held_logs() == len(topics), timeout=30)
