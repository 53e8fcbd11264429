"""A site with a topic per device (many thousands of logs).

Its hub away: the uplink's checks of the backlog (the retention warning every ``heartbeat_s``, the lag in
``/metrics`` and the status) read the oldest unsent record of every log each time, on the broker's event
loop, so the devices' PUBACKs waited seconds at each check. Each log's oldest unsent record's time is now
read once (until the hub's end or the log's start moves) and the check gives way to other work as it goes.

Its hub connected: each time the link had sent everything, it waited for the next record by listing every
log and handing them all to the store's long poll (which checks and registers each), so each record a
device published cost the site the work of every log. The link now hears of each log appended to."""

from __future__ import annotations

import json
import os
import random
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess, free_port
from broker_edge.settings.uplink import site_topic
from broker_edge.storage import LogStore
from broker_edge.storage.mirrored import append_mirrored
from tests.e2e.broker_clients import wait_for
from tests.e2e.uplink.uplink_harness import hub_section, pki_in, site_section
from tests.harness.cpu_waits import round_trip_s

pytestmark = pytest.mark.timeout(90)

DEVICES = 20_000
BACKLOG_AGE_S = 120
NO_FSYNC = {"durability": "none"}
"""The site's storage when its PUBACKs measure its event loop: each waits for no fsync, which a busy
machine's disk made last up to 0.7 s."""


def fill_site(directory: Path, devices: int, written_ms: int) -> list[str]:
    """One record on each device's topic, in the site's data directory before it starts (a fleet's
    readings while the hub was away)."""
    topics = [f"site/dev-{n:05d}/temp" for n in range(devices)]
    with LogStore(directory) as store:
        for topic in topics:
            store.append_message(topic, b'{"t": 21.5}', timestamp_ms=written_ms)
        store.flush()
    return topics


def copy_to_hub(site_data: Path, hub_data: Path, site_id: str) -> None:
    """The hub's copy of every log of the site, as the uplink leaves it (the site's frames at its offsets)."""
    with LogStore(site_data) as site, LogStore(hub_data) as hub:
        for topic in site.topics():
            frames, count = site.replicated_log.read_frames(topic, 0, 1 << 20)
            append_mirrored(hub, site_topic(site_id, topic), 0, count, b"".join(frames))
        hub.flush()


def cpu_s(process: BrokerProcess) -> float:
    """CPU time (user and system) ``process`` has used."""
    assert process.process is not None
    fields = Path(f"/proc/{process.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def publish_each(port: int, topics: list[str]) -> None:
    """One QoS 1 publish to each of ``topics``, each acknowledged before the next (a device's readings)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="reader", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    try:
        for topic in topics:
            info = client.publish(topic, b'{"t": 22.0}', qos=1)
            info.wait_for_publish(30)
            assert info.is_published()
    finally:
        client.loop_stop()
        client.disconnect()


def puback_waits_s(port: int, seconds: float, broker_pid: int) -> list[float]:
    """How long a device waits for each of its QoS 1 PUBACKs, publishing one after another for ``seconds``:
    each wait less the longest time the broker's event loop or a thread of this process waited for a CPU
    meanwhile (a busy machine's, not the broker's)."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="probe", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()

    def acknowledged() -> None:
        info = client.publish("probe/live", b"1", qos=1)
        info.wait_for_publish(30)
        assert info.is_published()

    waits = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            waits.append(round_trip_s(acknowledged, broker_pid))
            time.sleep(0.02)
    finally:
        client.loop_stop()
        client.disconnect()
    return waits


def test_a_site_of_many_device_topics_whose_hub_is_away_keeps_acknowledging_its_devices_promptly(
    tmp_path: Path,
) -> None:
    pki = pki_in(tmp_path)
    pki.server("hub")
    away = free_port()  # no hub listens there: the link is down, every record unsent
    written_ms = int(time.time() * 1000) - BACKLOG_AGE_S * 1000
    fill_site(tmp_path / "site" / "data", DEVICES, written_ms)
    section = site_section(pki, "plant-m", away, topics=["site/#"], heartbeat_s=0.2, reconnect_max_s=2.0)
    site = BrokerProcess(tmp_path / "site", dies_with_parent=True, storage=NO_FSYNC, uplink=section).start()
    assert site.process is not None
    try:  # each log's oldest unsent time read (the status reads them too): the checks from then on
        assert wait_for(lambda: json.loads(_status(site))["lag_seconds"] >= BACKLOG_AGE_S, timeout=30)
        waits = sorted(puback_waits_s(site.port, 4.0, site.process.pid))
        status = json.loads(_status(site))
    finally:
        site.stop()
    assert status["connected"] is False and status["topics"] == DEVICES
    assert status["lag_records"] == DEVICES
    assert BACKLOG_AGE_S <= status["lag_seconds"] < BACKLOG_AGE_S + 60
    stalled = sum(wait for wait in waits if wait > 0.05)  # reading every log, each check held it 0.1-0.2 s
    assert stalled < 0.6, f"a device's PUBACKs waited {stalled:.2f} s in all (the longest {waits[-1]:.2f} s)"
    assert "Traceback" not in site.log_path.read_text()


def test_a_connected_site_of_many_device_topics_forwards_each_reading_without_the_work_of_every_log(
    tmp_path: Path,
) -> None:
    pki = pki_in(tmp_path)
    topics = fill_site(tmp_path / "site" / "data", DEVICES, int(time.time() * 1000))
    copy_to_hub(tmp_path / "site" / "data", tmp_path / "hub" / "data", "plant-c")
    port = free_port()
    hub = BrokerProcess(tmp_path / "hub", dies_with_parent=True, uplink_hub=hub_section(pki, port=port))
    hub.start()
    section = site_section(pki, "plant-c", port, topics=["site/#"], heartbeat_s=5.0)
    site = BrokerProcess(tmp_path / "site", dies_with_parent=True, uplink=section).start()
    readings = random.Random(7).sample(topics, 300)
    reader = OffsetsClient(hub.offsets_url)

    def held() -> int:
        return sum(info.end_offset for info in reader.list_logs(site_topic("plant-c", "#")))

    try:
        assert wait_for(lambda: '"connected": true' in _status(site), timeout=20)
        before = cpu_s(site)
        publish_each(site.port, readings)
        assert wait_for(lambda: held() == DEVICES + len(readings), timeout=30)
        per_reading_ms = (cpu_s(site) - before) * 1000 / len(readings)
    finally:
        site.stop()
        hub.stop()
    # Each reading costs the site a few tenths of a millisecond; with the work of every log, about ten.
    assert per_reading_ms < 3.0, f"the site spent {per_reading_ms:.1f} ms of CPU per reading"


def test_a_connected_site_of_many_device_topics_answers_its_metrics_and_status_cheaply(
    tmp_path: Path,
) -> None:
    """Each of ``/metrics``' two lag gauges, the status, the retention check and each idle heartbeat listed
    the site's logs with their every detail and matched each against the uplink's filters again."""
    pki = pki_in(tmp_path)
    fill_site(tmp_path / "site" / "data", DEVICES, int(time.time() * 1000))
    copy_to_hub(tmp_path / "site" / "data", tmp_path / "hub" / "data", "plant-q")
    port = free_port()
    hub = BrokerProcess(tmp_path / "hub", dies_with_parent=True, uplink_hub=hub_section(pki, port=port))
    hub.start()
    section = site_section(pki, "plant-q", port, heartbeat_s=5.0)
    site = BrokerProcess(tmp_path / "site", dies_with_parent=True, uplink=section).start()
    metrics = f"http://127.0.0.1:{site.admin_port}/metrics"
    try:
        assert wait_for(lambda: '"connected": true' in _status(site), timeout=20)
        before = cpu_s(site)
        for _ in range(5):
            with urllib.request.urlopen(metrics, timeout=30) as answer:
                text = answer.read().decode()
            assert "timestone_broker_uplink_lag_records 0.0" in text
            assert f'"topics": {DEVICES}' in _status(site)
        per_scrape_ms = (cpu_s(site) - before) * 1000 / 5
    finally:
        site.stop()
        hub.stop()
    assert per_scrape_ms < 150, f"the site spent {per_scrape_ms:.0f} ms of CPU per scrape and status"


def _status(site: BrokerProcess) -> str:
    with urllib.request.urlopen(site.offsets_url + "/v1/uplink/sites", timeout=30) as answer:
        return json.dumps(json.load(answer)["site"])


def test_unsent_records_near_retention_on_many_device_topics_are_said_in_a_few_lines(tmp_path: Path) -> None:
    """Each log whose unsent records retention is about to delete was said in a WARNING line of its own at
    every check: a site of thousands of device topics wrote thousands of lines every ``heartbeat_s``.
    Twenty are named, the rest counted in one line."""
    pki = pki_in(tmp_path)
    pki.server("hub")
    devices = 2000
    fill_site(tmp_path / "site" / "data", devices, int(time.time() * 1000) - 55_000)
    section = site_section(pki, "plant-w", free_port(), heartbeat_s=0.5)
    site = BrokerProcess(
        tmp_path / "site", dies_with_parent=True, storage={"retention_ms": 60_000}, uplink=section
    ).start()
    more = f"uplink: and {devices - 20} more logs hold unsent records retention is about to delete"
    try:
        assert wait_for(lambda: site.log_path.read_text().count(more) >= 2, timeout=20)
        status = json.loads(_status(site))
    finally:
        site.stop()
    text = site.log_path.read_text()
    checks = text.count(more)
    assert text.count("not yet sent are") <= 20 * (checks + 1)
    assert f"({devices - 20} records)" in text
    assert status["unsent_at_risk_records"] == devices


def test_the_lag_is_counted_over_the_logs_once_in_a_turn_and_again_in_the_next(
    brokers, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``/metrics``' two lag gauges are read in one turn of the event loop, and each walked every log (two
    walks of 20,000 logs a scrape). They share one count now; a later turn counts again, so what was
    published meanwhile is in it."""
    site = brokers("site", uplink=site_section(pki_in(tmp_path), "plant-q", free_port()))  # its hub away
    link, store = site.broker.site_link, site.broker.store
    assert link is not None and store is not None
    unsent = link.unsent
    walks: list[int] = []
    listed = unsent.topics

    def walked() -> list[str]:
        walks.append(1)
        return listed()

    monkeypatch.setattr(unsent, "topics", walked)

    def publish(devices: range) -> None:
        for n in devices:
            site.broker.publish(f"plant/d-{n}/telemetry", b"reading", qos=1)

    site.call(lambda: publish(range(3)))
    assert wait_for(lambda: site.call(lambda: store.committed_end("plant/d-2/telemetry")) == 1)

    def lag_twice() -> tuple[tuple[int, float], tuple[int, float], int]:
        walks.clear()  # (the link's own checks walk them too, in other turns)
        return unsent.lag(), unsent.lag(), len(walks)

    first, second, walked = site.call(lag_twice)
    assert first[0] == 3 and second == first and walked == 1
    site.call(lambda: publish(range(3, 5)))
    assert wait_for(lambda: site.call(lambda: unsent.lag()[0]) == 5)  # counted again in a later turn
