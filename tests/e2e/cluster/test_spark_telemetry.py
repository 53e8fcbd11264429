"""The telemetry pipeline reading a 3-broker cluster while a partition leader is killed (SIGKILL) mid-stream.

Devices publish telemetry QoS 1 through every broker, moving to a survivor when theirs dies, and never
resend; the streaming query is given only the victim's URL (it learned the others from it). The victim is
killed inside a micro-batch, after Spark planned it (its tasks were to read the victim's partitions from
the victim) and before its tasks read: they read the same ranges from the other replicas. After the kill
the devices go on publishing through the survivors, and the query goes on reading from them. Bronze then
holds every message a device got a PUBACK for exactly once, and no record twice.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from deltalake import DeltaTable

from broker_edge.placement import partition_of
from pipelines.telemetry.config import load_telemetry_config
from pipelines.telemetry.job import TelemetryBatch, open_store, start_query
from sinks import BatchWriter
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


class KillingBatch(TelemetryBatch):
    """The pipeline's micro-batch, killing ``victim`` at the start of the first batch for which ``due()``:
    the batch's ranges are planned then, its records not read yet (the DataFrame is lazy)."""

    def __init__(self, *args, victim: Callable[[], None], due: Callable[[], bool], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.victim, self.due = victim, due
        self.killed_in: int | None = None

    def __call__(self, records, out: BatchWriter) -> None:
        if self.killed_in is None and self.due():
            self.victim()
            self.killed_in = out.batch_id
        super().__call__(records, out)


def _device_topics(target: EtcdTarget, leader: str, count: int) -> list[str]:
    """``count`` telemetry topics, every other one on a partition ``leader`` leads (once it leads one: the
    controller spreads leadership over the members a few partitions at a time)."""
    wait_until(
        lambda: any(p.leader == leader for p in cluster_state(target).partitions.values()),
        30,
        f"{leader} leading a partition",
    )
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

    def stored() -> list[tuple[str, str, int, bytes]]:
        """Bronze as delta-rs reads it (no Spark job competing with the query for the two cores)."""
        table = DeltaTable(str(tmp_path / "tables" / "bronze_telemetry")).to_pyarrow_table(
            columns=["broker", "topic", "offset", "payload"]
        )
        return list(zip(*(table.column(name).to_pylist() for name in table.column_names), strict=True))

    acked_at_kill: list[int] = []

    def kill() -> None:
        acked_at_kill.append(len(devices[0].acked))
        brokers[VICTIM].kill()

    batch = KillingBatch(config, open_store(spark, config), victim=kill, due=lambda: len(stored()) > 20)
    batch.ensure_tables()
    query = start_query(spark, config, batch)
    try:
        for device in devices:
            device.start()
        wait_until(lambda: bool(acked_at_kill), 90, "the kill inside a micro-batch", query.exception)
        acked_before = acked_at_kill[0]
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
        idle = ("isDataAvailable", "isTriggerActive")
        wait_until(lambda: not any(query.status[key] for key in idle), what="the query idle")
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
    killed_in = [report for report in batch.reports if report.batch_id == batch.killed_in]
    assert killed_in and killed_in[0].written["bronze_telemetry"]  # the batch read past the kill
