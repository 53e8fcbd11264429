"""A site with a topic per device (many thousands of logs) whose hub is away: its uplink's checks of the
backlog (the retention warning every ``heartbeat_s``, the lag in ``/metrics`` and the status) read the
oldest unsent record of every log each time, on the broker's event loop, so the devices' PUBACKs waited
seconds at each check. Each log's oldest unsent record's time is now read once (until the hub's end or the
log's start moves) and the check gives way to other work as it goes."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from broker_edge.runtime.launcher import BrokerProcess, free_port
from broker_edge.storage import LogStore
from tests.e2e.uplink.uplink_harness import pki_in, site_section

pytestmark = pytest.mark.timeout(90)

DEVICES = 20_000
BACKLOG_AGE_S = 120


def fill_site(directory: Path, devices: int, written_ms: int) -> list[str]:
    """One record on each device's topic, in the site's data directory before it starts (a fleet's
    readings while the hub was away)."""
    topics = [f"site/dev-{n:05d}/temp" for n in range(devices)]
    with LogStore(directory) as store:
        for topic in topics:
            store.append_message(topic, b'{"t": 21.5}', timestamp_ms=written_ms)
        store.flush()
    return topics


def worst_puback_s(port: int, seconds: float) -> float:
    """The longest a device waits for its QoS 1 PUBACKs, publishing one after another for ``seconds``."""
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="probe", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", port)
    client.loop_start()
    worst = 0.0
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sent = time.monotonic()
            info = client.publish("probe/live", b"1", qos=1)
            info.wait_for_publish(30)
            assert info.is_published()
            worst = max(worst, time.monotonic() - sent)
            time.sleep(0.02)
    finally:
        client.loop_stop()
        client.disconnect()
    return worst


def test_a_site_of_many_device_topics_whose_hub_is_away_keeps_acknowledging_its_devices_promptly(
    tmp_path: Path,
) -> None:
    pki = pki_in(tmp_path)
    pki.server("hub")
    away = free_port()  # no hub listens there: the link is down, every record unsent
    written_ms = int(time.time() * 1000) - BACKLOG_AGE_S * 1000
    fill_site(tmp_path / "site" / "data", DEVICES, written_ms)
    section = site_section(pki, "plant-m", away, topics=["site/#"], heartbeat_s=0.2, reconnect_max_s=2.0)
    site = BrokerProcess(tmp_path / "site", dies_with_parent=True, uplink=section).start()
    try:
        worst = worst_puback_s(site.port, 4.0)
        with urllib.request.urlopen(site.offsets_url + "/v1/uplink/sites", timeout=30) as answer:
            status = json.load(answer)["site"]
    finally:
        site.stop()
    assert status["connected"] is False and status["topics"] == DEVICES
    assert status["lag_records"] == DEVICES
    assert BACKLOG_AGE_S <= status["lag_seconds"] < BACKLOG_AGE_S + 60
    assert worst < 1.0, f"a device waited {worst:.2f} s for a PUBACK"
    assert "Traceback" not in site.log_path.read_text()
