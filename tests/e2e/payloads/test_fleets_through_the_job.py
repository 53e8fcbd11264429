"""A CBOR fleet, a Protobuf fleet and a Sparkplug B edge node through ``timestone pipeline telemetry``.

The job runs as users run it, from its command line with a configuration file written by hand
(``payload.formats``: CBOR on the default template, Protobuf on a template of its own from a descriptor set
file, the Sparkplug B group ``plant1``), with ``--available-now`` twice: before and after the edge node is
dropped (its NDEATH fires), the broker restarts, the node comes back, and a host asks it for a rebirth.
Every reading and metric the broker's log holds is in silver or ``sparkplug_metrics`` once; a payload cut
short and a data message of a node with no birth are quarantined with where and why, and counted in the
metrics the job serves; the births and deaths keep ``devices`` online state and last birth.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import urllib.request
from datetime import UTC, datetime

import cbor2
import pytest

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess, free_port
from pipelines.fleet.background import BackgroundFleet, LoopThread
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import FleetSpec
from pipelines.fleet.sparkplug_node import DEVICE_METRICS, NODE_METRICS
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, example_descriptor_set
from pipelines.payloads.sparkplug.encode import MetricOut, encode, rebirth_request
from pipelines.runner import pipeline_main
from pipelines.telemetry.config import load_telemetry_config_file
from pipelines.telemetry.job import open_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.payloads.test_sparkplug_broker import edge_node

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]  # two runs of the job, each a first start

BIRTH_ROWS = 2 + len(NODE_METRICS) + 2 * len(DEVICE_METRICS)  # bdSeq, Node Control/Rebirth; two devices
DATA_ROWS = 2 * len(DEVICE_METRICS)  # one DDATA per device
TOPICS = {"cbor": "devices/{device_id}/telemetry", "protobuf": "pb/{device_id}/telemetry"}

CONFIG = """\
telemetry:
  source:
    brokers: ["edge1={offsets_url}"]
  tables:
    root: {root}/tables
    maintenance: {{enabled: false}}
  stream:
    checkpoint: {root}/checkpoint
  payload:
    formats:
      - {{topic_template: "devices/{{device_id}}/telemetry", format: cbor}}
      - topic_template: "pb/{{device_id}}/telemetry"
        format: protobuf
        protobuf: {{descriptor_set: {root}/telemetry.desc, message: {message}}}
      - {{topic_template: "spBv1.0/plant1", format: sparkplug_b}}
  quality:
    gx: {{schedule: never}}
"""


def run_fleets(broker: BrokerProcess, first_index: int) -> None:
    """Three devices in each format sending readings every 0.1 s for about a second, then leaving."""
    for payload_format, topic in TOPICS.items():
        spec = FleetSpec(brokers=[broker.address], count=3, first_index=first_index, fleet_size=20)
        behaviour = DeviceBehaviour(
            telemetry_interval_s=0.1, payload_format=payload_format, telemetry_topic=topic
        )
        with BackgroundFleet(spec, behaviour) as fleet:
            fleet.run(asyncio.sleep(1.0))
        first_index += 10


def logged(broker: BrokerProcess, topic_filter: str) -> dict[str, int]:
    return {log.topic: log.end_offset for log in OffsetsClient(broker.offsets_url).list_logs(topic_filter)}


def wait_for_log(broker: BrokerProcess, topic: str, records: int) -> None:
    deadline = time.monotonic() + 20
    while logged(broker, "#").get(topic, 0) < records:
        assert time.monotonic() < deadline, f"{topic} never held {records} records"
        time.sleep(0.05)


def run_job(config_file: str) -> dict[str, float]:
    """``timestone pipeline telemetry --available-now`` in this process (on the tests' Spark session, its
    logging and signal handlers set back after); the counters its metrics endpoint shows after."""
    port = free_port()
    argv = ["telemetry", "--config", config_file, "--available-now", "--spark-master", "local[2]"]
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    signals = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        assert pipeline_main([*argv, "--metrics-port", str(port)]) == 0
    finally:
        root.handlers[:], root.level = handlers, level
        for signum, handler in signals.items():
            signal.signal(signum, handler)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    counters = {}
    for line in text.splitlines():
        if line.startswith(("timestone_pipeline_quarantined_total", "timestone_pipeline_sparkplug_seq")):
            name, value = line.rsplit(" ", 1)
            counters[name] = float(value)
    return counters


def test_cbor_protobuf_and_sparkplug_fleets_through_the_job_exactly_once_across_a_broker_restart(
    spark, tmp_path
):
    (tmp_path / "telemetry.desc").write_bytes(example_descriptor_set())
    broker = BrokerProcess(tmp_path / "broker").start()
    config = tmp_path / "pipeline.yaml"
    text = CONFIG.format(offsets_url=broker.offsets_url, root=tmp_path, message=EXAMPLE_MESSAGE)
    config.write_text(text)
    loop = LoopThread("edge-node")
    loop.start()
    node = edge_node(broker.port)
    try:
        run_fleets(broker, 0)
        loop.run(node.start())
        loop.call(node.publish_data)
        node.seq += 2  # two messages lost on the way: the next one's sequence number does not follow
        loop.call(node.publish_data)
        wait_for_log(broker, "spBv1.0/plant1/DDATA/gw1/pump8", 2)
        stranger = PahoClient(broker.port, "stranger")
        ghost = encode([MetricOut(1.5, "Double", alias=7, with_datatype=False)], timestamp_ms=1, seq=0)
        stranger.publish("spBv1.0/plant1/DDATA/ghost/d1", ghost, 1)  # no NBIRTH: its alias means nothing
        cut = cbor2.dumps({"ts": 1, "seq": 1, "temperature": 20.5, "firmware": "1.0.0"})[:-3]
        stranger.publish("devices/bad-1/telemetry", cut, 1)
        stranger.close()
        wait_for_log(broker, "devices/bad-1/telemetry", 1)

        first = run_job(str(config))
        quarantined = 'timestone_pipeline_quarantined_total{{pipeline="telemetry",reason="{}"}}'
        assert first[quarantined.format("sparkplug_unknown_alias")] == 1
        assert first[quarantined.format("unparseable_payload")] == 1
        assert first['timestone_pipeline_sparkplug_seq_gaps_total{pipeline="telemetry"}'] == 1

        loop.call(node.go_offline)  # no DISCONNECT: the broker publishes the NDEATH will
        wait_for_log(broker, "spBv1.0/plant1/NDEATH/gw1", 1)
        broker.stop()
        broker.start()  # same ports, same log directory
        run_fleets(broker, 3)
        loop.run(node.start())  # back with bdSeq 1: births again
        loop.call(node.publish_data)
        asked_at = datetime.now(UTC)
        host = PahoClient(broker.port, "scada")
        host.publish("spBv1.0/plant1/NCMD/gw1", rebirth_request(int(time.time() * 1000)), 0)
        wait_for_log(broker, "spBv1.0/plant1/NBIRTH/gw1", 3)  # the rebirth landed
        host.close()
        reborn_by = datetime.now(UTC)
        loop.call(node.publish_data)
        wait_for_log(broker, "spBv1.0/plant1/DDATA/gw1/pump8", 4)
        second = run_job(str(config))
        assert quarantined.format("sparkplug_unknown_alias") not in second  # nothing new to quarantine
        readings = sum(logged(broker, "devices/+/telemetry").values()) + sum(
            logged(broker, "pb/+/telemetry").values()
        )
        sparkplug_records = sum(logged(broker, "spBv1.0/#").values())
    finally:
        loop.run(node.stop())
        loop.close()
        broker.stop()

    store = open_store(None, load_telemetry_config_file(config))
    silver = store.read_arrow("silver_telemetry").to_pylist()  # every reading but the one cut short
    assert len(silver) == readings - 1 and len({(r["topic"], r["offset"]) for r in silver}) == len(silver)
    assert len({r["device_id"] for r in silver}) == 12  # six CBOR devices, six Protobuf ones
    assert all(isinstance(r["temperature"], float) and r["firmware"] == "1.0.0" for r in silver)

    metrics = store.read_arrow("sparkplug_metrics").to_pylist()
    assert len(metrics) == 3 * BIRTH_ROWS + 4 * DATA_ROWS  # three births (one a rebirth), four data rounds
    assert len({(r["topic"], r["offset"], r["metric_index"]) for r in metrics}) == len(metrics)
    data = [r for r in metrics if r["message_type"] == "DDATA"]
    assert {(r["metric"], r["datatype"]) for r in data} == set(DEVICE_METRICS)  # names from the births
    assert sum(r["seq_gap"] for r in metrics) == len(DEVICE_METRICS)  # the lost messages, flagged once

    quarantine = {r["topic"]: r for r in store.read_arrow("telemetry_quarantine").to_pylist()}
    assert set(quarantine) == {"spBv1.0/plant1/DDATA/ghost/d1", "devices/bad-1/telemetry"}
    ghost_row = quarantine["spBv1.0/plant1/DDATA/ghost/d1"]
    assert ghost_row["reason"] == "sparkplug_unknown_alias" and ghost_row["payload"] == ghost
    assert ghost_row["detail"] == "DDATA: edge node plant1/ghost has no NBIRTH in force"
    bad = quarantine["devices/bad-1/telemetry"]
    assert bad["reason"] == "unparseable_payload" and bad["detail"].startswith(f"cbor: byte {len(cut)}: ")

    devices = {r["device_id"]: r for r in store.read_arrow("devices").to_pylist()}
    for sparkplug_id in ("plant1/gw1", "plant1/gw1/pump7", "plant1/gw1/pump8"):
        assert devices[sparkplug_id]["online"] is True  # born again after the death
        birth = devices[sparkplug_id]["last_birth"].timestamp()
        assert asked_at.timestamp() - 0.001 <= birth <= reborn_by.timestamp()  # the rebirth's
    assert devices["dev-00000"]["online"] is None  # not a Sparkplug device: no online state

    bronze = store.read_arrow("bronze_telemetry").column("topic").to_pylist()
    assert sum(t.startswith("spBv1.0/") for t in bronze) == sparkplug_records
