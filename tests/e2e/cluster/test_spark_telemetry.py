"""The telemetry pipeline reading a 3-broker cluster while a partition leader is killed (SIGKILL) mid-stream.

Devices publish telemetry QoS 1 through every broker, moving to a survivor when theirs dies, and never
resend; the streaming query is given only the victim's URL (it learned the others from it). After the kill
the devices go on publishing through the survivors, and the query goes on reading from them. Bronze then
holds every message a device got a PUBACK for exactly once, and no record twice.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import pytest
from deltalake import DeltaTable

from broker_edge.cluster.view import partition_of
from pipelines.telemetry.config import load_telemetry_config
from pipelines.telemetry.job import TelemetryBatch, open_store, start_query
from tests.e2e.cluster.conftest import EtcdTarget
from tests.e2e.cluster.proof import Device, cluster_state, wait_settled, wait_until
from tests.e2e.telemetry.telemetry_harness import reading

pytestmark = pytest.mark.spark

NODES = ("a", "b", "c")
VICTIM = "b"
PUBLISH_S = 1.5


class TelemetryDevice(Device):
    """A ``proof.Device`` whose messages are telemetry readings (docs/device-protocol.md)."""

    def message(self, sequence: int) -> bytes:
        return reading(self.client_id, sequence + 1, seconds=sequence)


def _device_topics(target: EtcdTarget, leader: str, count: int) -> list[str]:
    """``count`` telemetry topics, every other one on a partition ``leader`` leads."""
    state = cluster_state(target)
    partitions = len(state.partitions)
    candidates = [f"devices/dev-{n:03d}/telemetry" for n in range(1000)]
    led = [t for t in candidates if state.partitions[partition_of(t, partitions)].leader == leader]
    others = [t for t in candidates if t not in led]
    return [led[n // 2] if n % 2 == 0 else others[n // 2] for n in range(count)]


def test_bronze_holds_every_acknowledged_message_once_across_a_leader_kill(
    spark, cluster_brokers, etcd, tmp_path: Path
):
    brokers = {node: cluster_brokers(node, replica_lag_max_ms=2000) for node in NODES}
    wait_settled(etcd, set(NODES), 3)
    config = load_telemetry_config(
        {
            "source": {
                "bootstrap_servers": [brokers[VICTIM].offsets_url],
                "options": {"clusterName": "plant", "fetchTimeoutMs": "5000", "retryBackoffMs": "100"},
            },
            "tables": {"root": str(tmp_path / "tables")},
            "stream": {"checkpoint": str(tmp_path / "checkpoint"), "trigger_interval": "500 milliseconds"},
            "quality": {"gx": {"schedule": "never"}},
        }
    )
    order = [brokers[node] for node in NODES]
    topics = _device_topics(etcd, VICTIM, 4)
    devices = [TelemetryDevice(t.split("/")[1], t, order, start_at=n) for n, t in enumerate(topics)]
    batch = TelemetryBatch(config, open_store(spark, config))
    batch.ensure_tables()
    query = start_query(spark, config, batch)

    def stored() -> list[tuple[str, str, int, bytes]]:
        """Bronze as delta-rs reads it (no Spark job competing with the query for the two cores)."""
        table = DeltaTable(str(tmp_path / "tables" / "bronze_telemetry")).to_pyarrow_table(
            columns=["broker", "topic", "offset", "payload"]
        )
        return list(zip(*(table.column(name).to_pylist() for name in table.column_names), strict=True))

    try:
        for device in devices:
            device.start()
        wait_until(lambda: len(stored()) > 20, 90, "bronze rows before the kill", query.exception)
        acked_before = len(devices[0].acked)
        brokers[VICTIM].kill()
        wait_until(
            lambda: len(devices[0].acked) > acked_before + 20,
            what="publishes on the victim's partition acknowledged by a new leader",
        )
        time.sleep(PUBLISH_S)
        for device in devices:
            device.stop()
        acked = {(device.topic, payload) for device in devices for payload in device.acked}
        wait_until(
            lambda: acked <= {(row[1], row[3]) for row in stored()},
            90,
            "every acknowledged message in bronze",
            lambda: (query.exception(), len(acked - {(row[1], row[3]) for row in stored()})),
        )
        assert query.exception() is None
    finally:
        query.stop()
        batch.close()
        for device in devices:
            device.stop()

    rows = stored()
    assert {row[0] for row in rows} == {"plant"}
    keys = [(topic, offset) for _, topic, offset, _ in rows]
    assert len(keys) == len(set(keys)), "a record written to bronze twice"
    copies = Counter((topic, payload) for _, topic, _, payload in rows)
    assert all(copies[message] == 1 for message in acked), "an acknowledged message not once"
    assert sum(device.moves for device in devices) >= 1  # somebody was connected to the dead broker
