"""The simulated fleet on a Timestone broker: the command line, and devices holding their own log offsets."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.publisher import MqttPublisher
from pipelines.fleet.client import MqttClient
from pipelines.fleet.device import SimulatedDevice
from tests.e2e.cluster.proof import metric
from tests.fleet_harness import FleetHarness, FleetSpec, ota_message, quiet_devices
from tests.referrer import Referrer


@contextlib.contextmanager
def one_device(tmp_path: Path) -> Iterator[tuple[BrokerProcess, FleetHarness, SimulatedDevice]]:
    """A broker process and a simulated fleet of one device connected to it (quick to reconnect)."""
    with BrokerProcess(tmp_path / "broker") as broker:
        spec = FleetSpec(brokers=[broker.address], count=1, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices(offline_duration_s=(0.05, 0.05))) as harness:
            harness.wait_until(lambda: harness.fleet.connected() == 1)
            yield broker, harness, harness.fleet.devices[0]


@contextlib.contextmanager
def paused(broker: BrokerProcess) -> Iterator[None]:
    """The broker process stalled (SIGSTOP) for the block: the kernel still takes connections and bytes in."""
    assert broker.process is not None
    os.kill(broker.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.process.pid, signal.SIGCONT)


def test_devices_simulate_command_publishes_telemetry(tmp_path):
    with BrokerProcess(tmp_path / "broker") as broker:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                "devices",
                "simulate",
                "--count",
                "5",
                "--broker",
                f"127.0.0.1:{broker.port}",
                "--telemetry-interval",
                "0.3",
                "--duration",
                "3",
                "--id-prefix",
                "site1-",  # ends in a separator: kept as it is
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        assert "5 devices connected" in result.stdout
        logs = OffsetsClient(broker.offsets_url).list_logs("devices/+/telemetry")
        assert sorted(log.topic for log in logs) == [f"devices/site1-{n:05d}/telemetry" for n in range(5)]
        assert all(log.end_offset >= 1 for log in logs)


def test_offline_device_gets_an_action_from_its_held_offset_after_a_broker_restart(tmp_path):
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        spec = FleetSpec(brokers=[broker.address], count=3, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices(offline_duration_s=(0.5, 1.0))) as harness:
            devices = harness.fleet.devices
            first = {"action_id": "a-1", "kind": "command", "command": "noop"}
            publisher = MqttPublisher([broker.address], client_id="operator-1")
            publisher.publish("actions/groups/g", json.dumps(first).encode())
            publisher.close()
            harness.wait_until(lambda: harness.fleet.finished("a-1") == 3)
            held = devices[0].offsets["actions/groups/g"]
            assert held == 1  # the device stored the next offset of the group topic's log

            harness.call(lambda: devices[0].go_offline(3600))  # away for good, unless it reconnects itself
            second = ota_message("a-2", "2.0.0")
            publisher = MqttPublisher([broker.address], client_id="operator-2")
            publisher.publish("actions/groups/g", json.dumps(second).encode())
            publisher.close()
            harness.wait_until(lambda: harness.fleet.finished("a-2") == 2)

            received_before = harness.fleet.stats["actions_received"]
            broker.stop()
            broker.start()  # same ports, same commitlog directory
            harness.call(lambda: devices[0].go_offline(0))  # the device comes back now and resubscribes
            harness.wait_until(lambda: "a-2" in devices[0].actions, timeout_s=30)
            harness.wait_until(lambda: harness.fleet.finished("a-2") == 3, timeout_s=30)
            assert devices[0].firmware == "2.0.0"
            assert devices[0].offsets["actions/groups/g"] == 2
            # exactly one more delivery: a-2 from offset 1; a-1 (offset 0) was not replayed
            assert harness.fleet.stats["actions_received"] == received_before + 1
    finally:
        broker.stop()


def simulate(port: int, *options: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "pipelines.cli", "devices", "simulate", "--broker", f"127.0.0.1:{port}"]
    return subprocess.run(
        [*command, "--telemetry-interval", "0.3", "--duration", "3", *options],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_sparkplug_b_fleet_from_the_command_line_births_then_sends_data_by_alias(tmp_path):
    with BrokerProcess(tmp_path / "broker") as broker:
        result = simulate(broker.port, "--payload", "sparkplug_b", "--count", "2", "--devices-per-node", "3")
        assert result.returncode == 0, result.stderr
        assert "2 Sparkplug B edge nodes connected" in result.stdout
        client = OffsetsClient(broker.offsets_url)
        topics = {log.topic: log.end_offset for log in client.list_logs("spBv1.0/#")}
        assert topics["spBv1.0/fleet/NBIRTH/node-000"] == 1 and topics["spBv1.0/fleet/NBIRTH/node-001"] == 1
        births = [t for t in topics if "/DBIRTH/" in t]
        data = [t for t in topics if "/DDATA/" in t]
        assert len(births) == 6 and len(data) == 6 and all(topics[t] >= 1 for t in data)
        # a clean stop publishes each node's NDEATH before DISCONNECT
        assert topics["spBv1.0/fleet/NDEATH/node-000"] == 1


def test_devices_back_off_while_no_broker_answers_and_connect_again_when_one_does(tmp_path):
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        spec = FleetSpec(brokers=[broker.address], count=5, groups=["g"])
        behaviour = quiet_devices(offline_duration_s=(0.05, 0.05), reconnect_backoff_max_s=0.8)
        with FleetHarness(broker.address, spec, behaviour) as harness:
            harness.wait_until(lambda: harness.fleet.connected() == 5)
            broker.stop()
            harness.wait_until(lambda: harness.fleet.connected() == 0)
            failed_before = harness.fleet.stats["reconnect_failures"]
            time.sleep(4.0)
            failures = harness.fleet.stats["reconnect_failures"] - failed_before
            # each drop and failed attempt counted by its cause: the broker said it was shutting down
            # (DISCONNECT 0x8B), then nothing listened on its port
            stats = harness.call(lambda: dict(harness.fleet.stats))
            assert stats["dropped_0x8b"] == 5
            assert stats["connect_failed_unreachable"] == stats["reconnect_failures"]
            # pauses of 0.05, 0.1, 0.2, 0.4, then 0.8 s: about 9 attempts a device in 4 s (80 without backing
            # off); a loaded machine only makes fewer
            assert 5 <= failures <= 5 * 12, failures
            broker.start()  # same ports
            started = time.monotonic()
            harness.wait_until(lambda: harness.fleet.connected() == 5, timeout_s=30)
            assert time.monotonic() - started < 10  # within a pause of at most 0.8 s, and the connect itself
    finally:
        broker.stop()


def test_a_device_told_to_reconnect_while_connecting_ends_with_one_connection(tmp_path):
    """A device dropped twice while its broker stalls (overloaded, here paused) sends two CONNECTs the broker
    takes in one after the other when it resumes: the second takes the session over and closes the first.
    The device then holds one connection and keeps it; before, the closed one started another connect, which
    took over the one the device held, whose close started another: a device taking itself over for ever."""
    with one_device(tmp_path) as (broker, harness, device):
        with paused(broker):
            harness.call(lambda: device.go_offline(0.05))
            time.sleep(0.5)  # its reconnect has sent CONNECT and waits for the CONNACK
            harness.call(lambda: device.go_offline(0.05))
            time.sleep(0.5)
        harness.wait_until(lambda: harness.fleet.stats["connects"] >= 2)  # the first, then one after
        connects = harness.fleet.stats["connects"]
        time.sleep(3.0)
        assert harness.fleet.stats["connects"] == connects, "the device kept taking itself over"
        assert harness.fleet.connected() == 1


def test_a_connect_that_timed_out_leaves_no_connection_behind(tmp_path):
    """A client that gave up waiting for a stalled broker's CONNACK closes its socket: the broker, resuming,
    holds no session for it (one that, on a cluster, would take over the connection the device opened on
    another member meanwhile)."""
    with BrokerProcess(tmp_path / "broker") as broker:
        with paused(broker), pytest.raises(TimeoutError):
            asyncio.run(MqttClient.connect("127.0.0.1", broker.port, "dev-late", timeout_s=0.5))
        time.sleep(2.0)
        assert metric(broker, "timestone_broker_connections", listener="mqtt") == 0


def test_a_device_refused_with_connack_0x9c_connects_to_the_server_it_names(tmp_path):
    """A device whose only configured broker refuses its CONNECT with 0x9C and a Server Reference (MQTT 5
    4.11) connects next to the broker named, not to the one that refused it again and again."""
    with BrokerProcess(tmp_path / "broker") as broker:
        referrer = Referrer(f"127.0.0.1:{broker.port}")
        try:
            spec = FleetSpec(brokers=[("127.0.0.1", referrer.port)], count=1, groups=["g"])
            devices = quiet_devices(offline_duration_s=(0.05, 0.05))
            with FleetHarness(broker.address, spec, devices) as harness:
                harness.wait_until(lambda: harness.fleet.stats["connects"] == 1, timeout_s=10)
                device = harness.fleet.devices[0]
                stats = harness.call(lambda: dict(harness.fleet.stats))
                assert harness.call(lambda: device.broker) == broker.address
                assert (stats["connect_failed_refused_0x9c"], stats["server_references_followed"]) == (1, 1)
                assert harness.fleet.connected() == 1 and referrer.connections == 1
        finally:
            referrer.close()


@pytest.mark.parametrize("told", ["stop", "go_offline"])
def test_a_device_told_to_stop_or_go_offline_while_connecting_holds_no_connection(tmp_path, told):
    """A device's reconnect waits on a stalled broker (paused) when it is told to stop, or to go offline
    for a while: once the broker answers, the stopped device holds no connection, and the offline one
    drops the connection just made and comes back after its pause, once."""
    with one_device(tmp_path) as (broker, harness, device):
        with paused(broker):
            harness.call(lambda: device.go_offline(0.05))
            time.sleep(0.5)  # its reconnect has sent CONNECT and waits for the CONNACK
            if told == "stop":
                harness.run(device.stop())
            else:
                harness.call(lambda: device.go_offline(1.0))
        if told == "stop":
            time.sleep(2.0)
            assert harness.fleet.connected() == 0 and harness.fleet.stats["connects"] == 1
            listener_only = 1  # the harness's report listener
            assert metric(broker, "timestone_broker_connections", listener="mqtt") == listener_only
        else:
            harness.wait_until(lambda: harness.fleet.stats["connects"] == 2, timeout_s=15)
            time.sleep(1.0)
            stats = harness.call(lambda: dict(harness.fleet.stats))
            assert (stats["connects"], stats["offline"]) == (2, 2)
            assert harness.fleet.connected() == 1


def test_a_device_whose_held_offset_is_past_a_new_stores_end_reads_that_store_from_its_start(tmp_path):
    """A broker whose logs were wiped starts them again at offset 0 (a new store, docs/commitlog.md). A
    device back with offsets held from the old store asked for them; past the new end, the broker started it
    at the end, so the actions published to the new store before it came back were never delivered to it.
    Offsets never go backwards in one store: a device told its offset is past the end (the SUBACK's
    ``offset_out_of_range``) reads that log again from its start."""
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        spec = FleetSpec(brokers=[broker.address], count=1, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices(offline_duration_s=(0.05, 0.05))) as harness:
            device = harness.fleet.devices[0]
            publisher = MqttPublisher([broker.address], client_id="operator-1")
            for number in range(3):
                action = {"action_id": f"old-{number}", "kind": "command", "command": "noop"}
                publisher.publish("actions/groups/g", json.dumps(action).encode())
            publisher.close()
            harness.wait_until(lambda: harness.fleet.finished("old-2") == 1)
            assert device.offsets["actions/groups/g"] == 3

            harness.call(lambda: device.go_offline(3600))
            broker.stop()
            shutil.rmtree(broker.directory / "data" / "log")  # the logs wiped: a new store
            broker.start()
            publisher = MqttPublisher([broker.address], client_id="operator-2")
            fresh = {"action_id": "new-0", "kind": "command", "command": "noop"}
            publisher.publish("actions/groups/g", json.dumps(fresh).encode())
            publisher.close()
            harness.call(lambda: device.go_offline(0))

            harness.wait_until(lambda: harness.fleet.finished("new-0") == 1, timeout_s=20)
            assert device.offsets["actions/groups/g"] == 1
    finally:
        broker.stop()
