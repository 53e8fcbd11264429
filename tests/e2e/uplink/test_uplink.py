"""A site sends its logs to a hub over one connection it dials: the hub holds them at the site's offsets,
byte for byte, once, through cuts of the link; strangers and devices cannot write a site's namespace."""

from __future__ import annotations

import json
import ssl
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from broker_edge.runtime.local_pki import LocalPki
from broker_edge.runtime.main import reload_files
from broker_edge.settings.uplink import site_topic
from broker_edge.uplink.status_cli import uplink_main
from tests.e2e.broker_clients import PahoClient, wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.port_keeper import PortKeeper
from tests.e2e.uplink.uplink_harness import (
    HelloClosingHub,
    WanRelay,
    hub_port,
    hub_section,
    log_frames,
    mirrored,
    pki_in,
    site_section,
    wait_while_progressing,
)

pytestmark = pytest.mark.timeout(90)

Brokers = Callable[..., RunningBroker]


@pytest.fixture
def pki(tmp_path: Path) -> LocalPki:
    return pki_in(tmp_path)


def publish(site: RunningBroker, topic: str, payloads: list[bytes]) -> None:
    """Publishes logged at QoS 1 through the broker's own path (what a device's publish becomes)."""

    def send() -> None:
        for payload in payloads:
            site.broker.publish(topic, payload, qos=1)

    site.call(send)


def held(broker: RunningBroker, topic: str) -> tuple[int, int, bytes]:
    store = broker.broker.store
    assert store is not None
    return broker.call(lambda: log_frames(store, topic))


def same_logs(site: RunningBroker, hub: RunningBroker, site_id: str, topics: list[str], records: int) -> bool:
    """Whether the hub holds the site's ``records`` records of ``topics`` as the site does."""
    site_store, hub_store = site.broker.store, hub.broker.store
    assert site_store is not None and hub_store is not None
    return bool(
        hub.call(lambda: site.call(lambda: mirrored(site_store, hub_store, site_id, topics, records)))
    )


def status(broker: RunningBroker) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{broker.broker.offsets_port}/v1/uplink/sites") as answer:
        return json.load(answer)


def test_a_sites_logs_reach_the_hub_at_the_same_offsets_byte_for_byte(
    brokers: Brokers, pki: LocalPki
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-1", hub_port(hub), compression="zlib"))
    device = PahoClient(site.port, "sensor-1")
    for n in range(30):
        device.publish("telemetry/sensor-1", f"reading {n}".encode(), qos=1)
    publish(site, "telemetry/sensor-2", [bytes([n]) * n for n in range(1, 200)])
    topics = ["telemetry/sensor-1", "telemetry/sensor-2"]

    assert wait_for(lambda: same_logs(site, hub, "plant-1", topics, 229), timeout=20)
    start, end, data = held(hub, site_topic("plant-1", "telemetry/sensor-2"))
    assert (start, end) == (0, 199) and len(data) > sum(range(1, 200))
    assert wait_for(lambda: status(hub)["sites"][0]["lag_records"] == 0, timeout=10)
    hub_view = status(hub)["sites"][0]
    assert hub_view["site"] == "plant-1" and hub_view["connected"] is True
    assert hub_view["received_records"] == 229 and hub_view["duplicate_records"] == 0
    site_view = status(site)["site"]
    assert site_view["connected"] is True and site_view["lag_records"] == 0
    assert site_view["sent_records"] == 229 and site_view["sent_bytes"] < site_view["stored_bytes_sent"]
    assert hub.metric("timestone_broker_uplink_site_received_records", site="plant-1") == 229
    assert site.metric("timestone_broker_uplink_lag_records") == 0


def test_timestone_uplink_status_shows_a_hubs_sites_and_a_sites_link(
    brokers: Brokers, pki: LocalPki, capsys: pytest.CaptureFixture[str]
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-7", hub_port(hub)))
    publish(site, "telemetry/a", [b"x"] * 10)
    assert wait_for(lambda: same_logs(site, hub, "plant-7", ["telemetry/a"], 10), timeout=20)
    assert uplink_main(["status", "--broker", f"http://127.0.0.1:{hub.broker.offsets_port}"]) == 0
    hub_table = capsys.readouterr().out.splitlines()
    assert hub_table[0] == "hub: 1 site(s)" and hub_table[2].split()[:6] == [
        "plant-7",
        "yes",
        "0",
        "s",
        "ago",
        "0",
    ]
    assert uplink_main(["status", "--broker", f"http://127.0.0.1:{site.broker.offsets_port}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["site"]["sent_records"] == 10
    hub.stop()
    assert uplink_main(["status", "--broker", f"http://127.0.0.1:{hub.broker.offsets_port}"]) == 1
    assert "cannot reach" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_a_cut_link_resumes_from_the_hubs_ends_and_sends_every_record_once(
    brokers: Brokers, pki: LocalPki
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    wan = WanRelay(hub_port(hub))
    try:
        site = brokers("site", uplink=site_section(pki, "plant-2", wan.port, batch_bytes=4096))
        topics = [f"line/{n}/temperature" for n in range(20)]
        for round_ in range(12):
            for topic in topics:
                publish(site, topic, [f"{topic} {round_} {n}".encode() * 8 for n in range(10)])
            wan.cut(down=round_ % 4 == 3)  # mid-stream; now and then the link stays down a while
            if round_ % 4 == 3:
                time.sleep(0.3)
                wan.heal()
        # each of the ~140 batches waits for the hub's fsync: on a loaded disk that takes a while, so the
        # wait lasts while the hub receives records, and fails once they stop coming
        received = partial(hub.metric, "timestone_broker_uplink_site_received_records", site="plant-2")
        assert wait_while_progressing(lambda: same_logs(site, hub, "plant-2", topics, 20 * 12 * 10), received)
        sites = status(hub)["sites"]
        assert wan.cuts == 12
        assert sites[0]["received_records"] == 20 * 12 * 10  # each appended once; resends were skipped
    finally:
        wan.close()


def test_a_site_dials_again_when_the_hub_closes_the_connection_before_answering_its_hello(
    brokers: Brokers, pki: LocalPki
) -> None:
    hub = HelloClosingHub(pki)  # a link cut between the HELLO and the hub's ENDS, every time
    try:
        site = brokers("site", uplink=site_section(pki, "plant-c", hub.port))
        assert wait_for(lambda: hub.hellos >= 3, timeout=20)  # the link goes on dialling
        assert status(site)["site"]["connected"] is False
    finally:
        hub.close()


def test_a_silent_cut_is_noticed_by_the_sites_keepalive_and_said_so(
    brokers: Brokers, pki: LocalPki, caplog: pytest.LogCaptureFixture
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    wan = WanRelay(hub_port(hub))
    try:
        site = brokers("site", uplink=site_section(pki, "plant-k", wan.port, keepalive_s=1, heartbeat_s=30))
        assert wait_for(lambda: status(site)["site"]["connected"] is True, timeout=20)
        wan.silence()  # no byte crosses any more, and neither end is told
        said = "the hub did not answer a ping within 0.5 s after 1 s of silence (uplink.keepalive_s)"
        assert wait_for(lambda: said in caplog.text, timeout=20)
        assert "the hub closed the uplink" not in caplog.text
        wan.heal()
        assert wait_for(lambda: status(site)["site"]["connected"] is True, timeout=20)
    finally:
        wan.close()


def test_a_hub_sees_a_sites_backlog_sent_after_it_starts_late(
    brokers: Brokers, pki: LocalPki, caplog: pytest.LogCaptureFixture
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    port = hub_port(hub)
    hub.stop()  # the hub is away: the site keeps its logs and dials again and again
    keeper = PortKeeper(port)
    site = brokers("site", uplink=site_section(pki, "plant-3", port))
    publish(site, "telemetry/a", [b"x" * 100] * 500)
    # each failed dial is said with the address it tried, not the TLS context's repr
    assert wait_for(lambda: f"cannot connect to 127.0.0.1:{port}: " in caplog.text, timeout=10)
    assert "SSLContext" not in caplog.text
    keeper.release()
    hub = brokers("hub", uplink_hub=hub_section(pki, port=port))
    assert wait_for(lambda: same_logs(site, hub, "plant-3", ["telemetry/a"], 500), timeout=20)


def test_a_certificate_naming_no_site_is_refused(brokers: Brokers, pki: LocalPki, tmp_path: Path) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki, sites=["plant-1"]))
    stranger = pki.client("stranger")
    context = ssl.create_default_context(cafile=str(pki.ca.cert))
    context.load_cert_chain(str(stranger.cert), str(stranger.key))
    request = urllib.request.Request(f"https://127.0.0.1:{hub_port(hub)}/v1/uplink")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, context=context)
    assert refused.value.code == 403
    site = brokers("site", uplink=site_section(pki, "plant-9", hub_port(hub)))  # not admitted
    publish(site, "telemetry/a", [b"x"])
    time.sleep(1.0)
    assert status(site)["site"]["connected"] is False
    listed = [(row["site"], row["connected"]) for row in status(hub)["sites"]]
    assert listed == [("plant-1", False)]  # the site it admits, listed from its start; no refused one


def test_devices_on_the_hub_cannot_write_a_sites_namespace(brokers: Brokers, pki: LocalPki) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    device = PahoClient(hub.port, "intruder")
    for _ in range(3):
        device.client.publish(site_topic("plant-1", "telemetry/a"), b"forged", qos=1).wait_for_publish(5)
    assert wait_for(lambda: hub.drops("acl_denied") == 3)
    store = hub.broker.store
    assert store is not None
    assert hub.call(lambda: store.logs("$site/#")) == []


def site_while_the_hub_is_away(
    brokers: Brokers, pki: LocalPki, site_id: str, storage: dict, warning_ratio: float
) -> RunningBroker:
    """A site whose hub is down (an outage: it cannot send), its logs kept under ``storage``'s retention."""
    hub = brokers("hub", uplink_hub=hub_section(pki))
    port = hub_port(hub)
    hub.stop()
    uplink = site_section(pki, site_id, port, retention_warning_ratio=warning_ratio)
    return brokers("site", storage=storage, uplink=uplink)


def test_unsent_records_near_retention_raise_a_warning_and_a_metric_while_the_hub_is_away(
    brokers: Brokers, pki: LocalPki, caplog: pytest.LogCaptureFixture
) -> None:
    site = site_while_the_hub_is_away(brokers, pki, "plant-r", {"retention_ms": 1500}, 0.1)
    publish(site, "telemetry/a", [b"r" * 100] * 40)
    assert wait_for(lambda: site.metric("timestone_broker_uplink_unsent_at_risk_records") > 0, timeout=10)
    assert "not yet sent are" in caplog.text


def test_unsent_records_in_the_bytes_size_retention_takes_first_raise_a_warning_and_a_metric(
    brokers: Brokers, pki: LocalPki, caplog: pytest.LogCaptureFixture
) -> None:
    site = site_while_the_hub_is_away(brokers, pki, "plant-b", {"retention_bytes": 20_000}, 0.5)
    publish(site, "telemetry/a", [b"s" * 200] * 40)  # about 9.6 KB: under half of retention_bytes
    publish(site, "telemetry/a", [b"s" * 200] * 40)  # about 19 KB: the oldest 9 KB are at risk
    assert wait_for(lambda: site.metric("timestone_broker_uplink_unsent_at_risk_records") > 0, timeout=10)
    at_risk = site.metric("timestone_broker_uplink_unsent_at_risk_records")
    assert 30 <= at_risk <= 50  # the oldest records, about half of the 80: not every unsent one
    assert "in the oldest bytes of a log" in caplog.text


def test_an_action_published_on_the_hub_reaches_the_sites_devices_and_their_reports_come_back(
    brokers: Brokers, pki: LocalPki
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    site = brokers("site", uplink=site_section(pki, "plant-d", hub_port(hub)))
    device = PahoClient(site.port, "device-1")
    device.subscribe("actions/all", qos=1)
    publish(
        hub, "actions/all", [b'{"action": "ota-1"}', b'{"action": "ota-2"}']
    )  # the actions job's publishes

    received = device.expect(2, timeout=10)
    assert [message.payload for message in received] == [b'{"action": "ota-1"}', b'{"action": "ota-2"}']
    hub_store, site_store = hub.broker.store, site.broker.store
    assert hub_store is not None and site_store is not None
    assert wait_for(
        lambda: site.call(lambda: log_frames(site_store, "actions/all")) == held(hub, "actions/all")
    )
    device.publish("actions/reports/0", b'{"device": "device-1", "state": "done"}', qos=1)
    assert wait_for(lambda: same_logs(site, hub, "plant-d", ["actions/reports/0"], 1), timeout=10)
    assert hub.call(lambda: site_topic("plant-d", "actions/all") not in hub_store)  # never sent back up
    assert status(site)["site"]["downlink_records"] == 2
    device.client.publish("actions/all", b"forged on the site", qos=1).wait_for_publish(
        5
    )  # only the hub writes
    assert wait_for(lambda: site.drops("acl_denied") == 1)
    assert site.call(lambda: site_store.durable_end("actions/all")) == 2


def test_sighup_rereads_the_hubs_certificate_and_sites_connect_after_it(
    brokers: Brokers, pki: LocalPki
) -> None:
    hub = brokers("hub", uplink_hub=hub_section(pki))
    uplink_hub = hub.broker.uplink_hub
    assert uplink_hub is not None
    hub.call(lambda: reload_files(hub.broker))
    assert uplink_hub.tls.reloads == 1
    site = brokers("site", uplink=site_section(pki, "plant-h", hub_port(hub)))
    publish(site, "telemetry/a", [b"after the reload"])
    assert wait_for(lambda: same_logs(site, hub, "plant-h", ["telemetry/a"], 1), timeout=20)
