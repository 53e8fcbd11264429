"""The site in a network namespace that reaches the hub but cannot be reached from it (iptables), under
continuous telemetry from devices beside it: a WAN cut, then the site broker SIGKILLed and restarted.
Afterwards the hub holds the site's logs, every record the site acknowledged, at the same offsets, byte for
byte, none twice.

The cut lasts ``TIMESTONE_WAN_CUT_S`` seconds: 10 in the suite (long past the link's heartbeat, so the site
gives the connection up and its redials fail for a while), and minutes when ``make bench`` runs this test
(``TIMESTONE_WAN_CUT_S=300``), so that a backlog of minutes crosses once the WAN is back."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from broker_edge.settings.uplink import site_topic
from broker_edge.storage import LogStore
from tests.e2e.broker_clients import wait_for
from tests.e2e.conftest import RunningBroker
from tests.e2e.uplink.uplink_harness import hub_port, hub_section, log_frames, pki_in, site_section

WAN_CUT_S = float(os.environ.get("TIMESTONE_WAN_CUT_S", "10"))
CATCH_UP_S = 30 + WAN_CUT_S / 4
pytestmark = pytest.mark.timeout(150 + WAN_CUT_S + 3 * CATCH_UP_S)

SITE_MQTT_PORT = 1883
TOPICS = [f"telemetry/dev-{n}" for n in range(4)]
DEVICES = f"""
import sys, time
import paho.mqtt.client as mqtt
topics = {TOPICS!r}
acked = open(sys.argv[1], "a", buffering=1)
sequence = 0
while True:
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5, reconnect_on_failure=False)
    try:
        client.connect("127.0.0.1", {SITE_MQTT_PORT})
    except OSError:
        time.sleep(0.1)
        continue
    client.loop_start()
    try:
        while True:
            payload = "reading %d" % sequence
            info = client.publish(topics[sequence % len(topics)], payload, qos=1)
            sequence += 1
            info.wait_for_publish(2)
            if not info.is_published():
                break
            acked.write(payload + "\\n")
            time.sleep(0.002)
    except (RuntimeError, ValueError):
        pass
    client.loop_stop()
"""


def run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, timeout=10)


class SiteNetwork:
    """A network namespace joined to this host by a veth pair (a /30 of its own); inside, iptables drops every
    connection that does not start inside (the site dials out; nothing dials in)."""

    def __init__(self) -> None:
        tag = os.getpid() % 100_000
        self.name = f"ts-site-{tag}"
        self.host_ip = f"10.{200 + tag % 50}.{tag // 50 % 250}.1"
        self.site_ip = self.host_ip[:-1] + "2"
        host_end, site_end = f"tsh{tag}", f"tss{tag}"
        run("ip", "netns", "add", self.name)
        run("ip", "link", "add", host_end, "type", "veth", "peer", "name", site_end)
        run("ip", "link", "set", site_end, "netns", self.name)
        run("ip", "addr", "add", f"{self.host_ip}/30", "dev", host_end)
        run("ip", "link", "set", host_end, "up")
        self.inside("ip", "addr", "add", f"{self.site_ip}/30", "dev", site_end)
        self.inside("ip", "link", "set", site_end, "up")
        self.inside("ip", "link", "set", "lo", "up")
        self.inside("iptables", "-A", "INPUT", "-i", "lo", "-j", "ACCEPT")
        self.inside(
            "iptables", "-A", "INPUT", "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"
        )
        self.inside("iptables", "-A", "INPUT", "-j", "DROP")

    def inside(self, *command: str) -> None:
        run("ip", "netns", "exec", self.name, *command)

    def popen(self, *command: str, log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as output:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.name, *command], stdout=output, stderr=subprocess.STDOUT
            )

    def cut(self) -> None:
        self.inside("iptables", "-I", "OUTPUT", "1", "-d", self.host_ip, "-j", "DROP")

    def heal(self) -> None:
        self.inside("iptables", "-D", "OUTPUT", "1")

    def close(self) -> None:
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)


@pytest.fixture
def network() -> Iterator[SiteNetwork]:
    site_network = SiteNetwork()
    yield site_network
    site_network.close()


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def test_a_site_behind_a_one_way_firewall_survives_a_wan_cut_and_a_kill_and_the_hub_holds_its_logs(
    network: SiteNetwork, brokers: Callable[..., RunningBroker], tmp_path: Path
) -> None:
    pki = pki_in(tmp_path)
    hub = brokers("hub", uplink_hub=hub_section(pki, host=network.host_ip))
    uplink = site_section(pki, "plant-w", hub_port(hub), heartbeat_s=0.3)
    uplink["hubs"] = [f"wss://{network.host_ip}:{hub_port(hub)}/v1/uplink"]
    uplink["tls"]["check_hostname"] = (
        False  # the hub's test certificate names loopback only; the CA is checked
    )
    config = tmp_path / "site.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listeners": [{"name": "mqtt", "host": "127.0.0.1", "port": SITE_MQTT_PORT}],
                "storage": {"directory": str(tmp_path / "site-data")},
                "uplink": uplink,
            }
        )
    )
    site_command = (sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config))
    acked_file = tmp_path / "acked.txt"
    site = network.popen(*site_command, log=tmp_path / "site.log")
    devices = network.popen(sys.executable, "-c", DEVICES, str(acked_file), log=tmp_path / "devices.log")
    hub_store = hub.broker.store
    assert hub_store is not None

    def hub_records() -> int:
        return hub.call(
            lambda: sum(
                hub_store.durable_end(site_topic("plant-w", topic))
                for topic in TOPICS
                if site_topic("plant-w", topic) in hub_store
            )
        )

    def acked() -> list[str]:
        return acked_file.read_text().splitlines() if acked_file.exists() else []

    try:
        assert wait_for(lambda: hub_records() >= 100, timeout=30)
        with pytest.raises(OSError):  # the hub's side cannot open a connection into the site
            socket.create_connection((network.site_ip, SITE_MQTT_PORT), timeout=1).close()
        network.cut()
        during = len(acked())
        time.sleep(WAN_CUT_S)
        assert len(acked()) > during + 100  # the site keeps taking its devices' telemetry
        network.heal()
        # what the site acknowledged up to now crosses (the devices go on publishing: a count read at each
        # poll runs ahead of the hub by the link's latency, and under load the hub would never meet it)
        backlog = len(acked())
        assert wait_for(lambda: hub_records() >= backlog, timeout=CATCH_UP_S)
        stop(site, signal.SIGKILL)
        site = network.popen(*site_command, log=tmp_path / "site.log")
        count = len(acked())
        assert wait_for(lambda: len(acked()) > count + 100, timeout=30)
    finally:
        stop(devices)
    assert wait_for(lambda: hub_records() >= len(acked()), timeout=CATCH_UP_S)
    stop(site)
    payloads = hub.call(
        lambda: [
            record.payload
            for topic in TOPICS
            for record in hub_store.read(site_topic("plant-w", topic), 0, 1_000_000, 1 << 30)
        ]
    )
    assert {line.encode() for line in acked()} <= set(payloads)  # every acknowledged record
    # none twice: the hub's logs are the site's, offset for offset
    hub_logs = hub.call(lambda: [log_frames(hub_store, site_topic("plant-w", topic)) for topic in TOPICS])
    with LogStore(tmp_path / "site-data") as site_store:
        assert hub_logs == [log_frames(site_store, topic) for topic in TOPICS]
