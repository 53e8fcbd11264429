"""A Sparkplug B edge node with devices into a Delta table, exactly once, through a broker restart.

A real broker process persists the node's messages (QoS 0, the Sparkplug namespace's default rule); the
``timestone`` Spark source reads its log; ``spark_sparkplug.sparkplug_rows`` keeps the node's session in the
query's state store; each micro-batch appends ``sparkplug_metrics`` through the tables' exactly-once writer.
Between two runs of the query the node is dropped (the broker publishes its NDEATH), the broker is
restarted, the node comes back with its next ``bdSeq`` and a host asks it for a rebirth; one micro-batch
fails after its append and is replayed.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from pipelines.fleet.background import LoopThread
from pipelines.fleet.sparkplug_node import DEVICE_METRICS, NODE_METRICS
from pipelines.payloads.spark_sparkplug import sparkplug_rows, with_times
from pipelines.payloads.sparkplug.encode import rebirth_request
from pipelines.payloads.sparkplug_tables import SPARKPLUG_METRICS, metric_rows, sparkplug_metrics
from sinks import BatchWriter, TableCatalog, open_table_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.payloads.stream_runs import FailOnce, run_available_now
from tests.e2e.payloads.test_sparkplug_broker import edge_node

pytestmark = pytest.mark.spark

BIRTH_ROWS = 2 + len(NODE_METRICS) + 2 * len(DEVICE_METRICS)  # bdSeq, Node Control/Rebirth; two devices
DATA_ROWS = 2 * len(DEVICE_METRICS)  # one DDATA per device


def logged(broker: BrokerProcess) -> dict[str, int]:
    return {log.topic: log.end_offset for log in OffsetsClient(broker.offsets_url).list_logs("spBv1.0/#")}


def wait_for_log(broker: BrokerProcess, topic: str, records: int) -> None:
    deadline = time.monotonic() + 20
    while logged(broker).get(topic, 0) < records:
        assert time.monotonic() < deadline, f"{topic} never held {records} records: {logged(broker)}"
        time.sleep(0.05)


def test_an_edge_node_into_sparkplug_metrics_exactly_once_through_a_death_a_broker_restart_and_a_rebirth(
    spark, tmp_path
):
    from sources import register_sources

    register_sources(spark)
    store = open_table_store(None, str(tmp_path / "tables"), "delta-rs", TableCatalog([sparkplug_metrics()]))
    store.ensure(SPARKPLUG_METRICS)
    broker = BrokerProcess(tmp_path / "broker").start()
    loop = LoopThread("edge-node")
    loop.start()
    presence: list[tuple[str | None, bool]] = []
    fail_once = FailOnce()

    def write(batch, out: BatchWriter) -> None:
        rows = with_times(batch).cache()
        out.append(SPARKPLUG_METRICS, metric_rows(rows, datetime.now(UTC)))
        presence.extend((r["device_id"], r["online"]) for r in rows.where("kind = 'presence'").collect())
        rows.unpersist()
        fail_once.after_writes()

    def run_query() -> None:
        run_available_now(spark, broker, "spBv1.0/#", store, write, tmp_path / "checkpoint", sparkplug_rows)

    def table() -> list[dict]:
        return store.read_arrow(SPARKPLUG_METRICS).to_pylist()

    try:
        node = edge_node(broker.port)
        loop.run(node.start())
        loop.call(node.publish_data)
        loop.call(node.publish_data)
        wait_for_log(broker, "spBv1.0/plant1/DDATA/gw1/pump8", 2)
        run_query()
        first = table()
        assert len(first) == BIRTH_ROWS + 2 * DATA_ROWS
        data = [r for r in first if r["message_type"] == "DDATA"]
        assert {(r["metric"], r["datatype"]) for r in data} == set(DEVICE_METRICS)  # names from the births
        assert [r["alias"] is not None for r in data] == [True] * len(data)

        loop.call(node.go_offline)  # no DISCONNECT: the broker publishes the NDEATH will
        wait_for_log(broker, "spBv1.0/plant1/NDEATH/gw1", 1)
        broker.stop()
        broker.start()  # same ports, same log directory
        loop.run(node.start())  # back with bdSeq 1: births again
        loop.call(node.publish_data)
        host = PahoClient(broker.port, "scada")
        host.publish("spBv1.0/plant1/NCMD/gw1", rebirth_request(int(time.time() * 1000)), 0)
        wait_for_log(broker, "spBv1.0/plant1/NBIRTH/gw1", 3)  # the rebirth landed
        loop.call(node.publish_data)
        wait_for_log(broker, "spBv1.0/plant1/DDATA/gw1/pump8", 4)
        host.close()

        fail_once.armed = True
        with pytest.raises(Exception, match="simulated"):
            run_query()
        run_query()  # from the checkpoint: the failed batch again, same id: its append is not repeated
        run_query()  # nothing new: nothing written
        rows = table()
        assert len(rows) == len(first) + 2 * BIRTH_ROWS + 2 * DATA_ROWS
        keys = {(r["broker"], r["topic"], r["offset"], r["metric_index"]) for r in rows}
        assert len(keys) == len(rows)  # not one row twice
        assert not any(r["seq_gap"] for r in rows)  # each rebirth restarts the sequence at 0
        bdseqs = sorted(r["value_long"] for r in rows if r["metric"] == "bdSeq")
        assert bdseqs == [0, 1, 1]  # the first connection's birth, the second's and its rebirth
        assert (None, False) in presence and ("pump7", False) in presence  # the death took both offline
        assert presence[-1] in ((None, True), ("pump7", True), ("pump8", True))
    finally:
        loop.run(node.stop())
        loop.close()
        broker.stop()
