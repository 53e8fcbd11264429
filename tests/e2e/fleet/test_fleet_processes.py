"""A fleet over several processes and source addresses, on a real Timestone broker."""

from __future__ import annotations

import subprocess
import sys
import time

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.buckets import REPORT_TOPICS, bucket_of, report_topic
from pipelines.actions.publisher import MqttPublisher
from pipelines.fleet.fleet import Fleet
from pipelines.fleet.processes import FleetProcesses, loopback_sources
from tests.fleet_harness import FleetSpec, quiet_devices


def test_processes_split_the_fleet_with_the_ids_of_one_process_and_time_each_action(tmp_path):
    """Devices connect from 127.0.0.2 and .3 (a bind that failed would leave them unconnected)."""
    with BrokerProcess(tmp_path / "broker") as broker:
        spec = FleetSpec(
            brokers=[broker.address], count=7, groups=["a", "b"], source_addresses=["127.0.0.2", "127.0.0.3"]
        )
        with FleetProcesses(spec, quiet_devices(), procs=3) as fleet:
            connected, stats, cpu = fleet.status()
            assert connected == 7 and stats["connects"] == 7 and cpu > 0
            publisher = MqttPublisher([broker.address], client_id="actions-test")
            publisher.publish("actions/groups/a", b'{"action_id":"x1","kind":"command","command":"reboot"}')
            publisher.close()
            expected = [d.device_id for d in Fleet(spec).devices]
            in_group_a = set(expected[0::2])
            deadline = time.monotonic() + 20
            while fleet.finished("x1") < len(in_group_a) and time.monotonic() < deadline:
                time.sleep(0.1)
            times = fleet.times("x1")
            assert [t.device_id for t in times] == expected
            assert {t.device_id for t in times if t.received_at is not None} == in_group_a
            assert all(
                t.finished_at is not None and t.received_at is not None and t.finished_at >= t.received_at
                for t in times
                if t.device_id in in_group_a
            )
        offsets_api = OffsetsClient(broker.offsets_url)
        report_logs = {log.topic for log in offsets_api.list_logs(REPORT_TOPICS)}
        assert report_logs == {report_topic(bucket_of(d, spec.buckets)) for d in in_group_a}
        assert offsets_api.list_logs("devices/+/actions") == []  # no log per device


def test_loopback_sources_add_an_address_per_20000_connections():
    assert loopback_sources(10) == ["127.0.0.2"]
    assert loopback_sources(20_001) == ["127.0.0.2", "127.0.0.3"]
    assert len(loopback_sources(50_000)) == 3


def test_devices_simulate_in_processes_reports_its_own_cpu(tmp_path):
    with BrokerProcess(tmp_path / "broker") as broker:
        command = [sys.executable, "-m", "pipelines.cli", "devices", "simulate", "--count", "6"]
        command += ["--procs", "2", "--broker", f"127.0.0.1:{broker.port}", "--duration", "2"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "connected=6 simulator_cpu=" in result.stdout
