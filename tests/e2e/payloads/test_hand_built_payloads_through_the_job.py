"""Payloads written by hand, as other tools send them, through a broker and ``timestone pipeline telemetry``.

Values at the edges of their types (64-bit integers, NaN, a UInt64 no ``bigint`` holds) reach the Delta
tables exactly, and payloads that cannot be used (strings that are not UTF-8, a sequence number out of
range, a Protobuf message cut short) land in quarantine with their reason, beside them in the same
micro-batch: neither fails the batch nor the query.
"""

from __future__ import annotations

import datetime
import math

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.payloads.descriptors import message_class
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, example_descriptor_set
from pipelines.payloads.sparkplug.encode import MetricOut, bdseq_metric, encode
from pipelines.telemetry.config import load_telemetry_config_file
from pipelines.telemetry.job import open_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.payloads.test_fleets_through_the_job import run_job, wait_for_log

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

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
      - topic_template: "pb/{{device_id}}/telemetry"
        format: protobuf
        protobuf: {{descriptor_set: {root}/telemetry.desc, message: {message}}}
      - {{topic_template: "spBv1.0/{{group_id}}", format: sparkplug_b}}
  quality:
    gx: {{schedule: never}}
"""
NODE = "spBv1.0/plant9/{}/gw1"
WIDE = 2**62 + 1


def sparkplug_messages() -> list[tuple[str, bytes]]:
    birth = [
        bdseq_metric(0),
        MetricOut(WIDE, "Int64", name="Counter", alias=1),
        MetricOut(2**64 - 1, "UInt64", name="Mask", alias=2),
        MetricOut(float("nan"), "Float", name="Flow", alias=3),
        MetricOut(True, "Boolean", name="Running", alias=4),
        MetricOut("idle", "String", name="Mode", alias=5),
    ]
    data = [MetricOut(WIDE + 2, "Int64", alias=1, with_datatype=False), MetricOut(False, "Boolean", alias=4)]
    mode = encode([MetricOut("runs", "String", alias=5, with_datatype=False)], timestamp_ms=4, seq=2)
    return [
        (NODE.format("NBIRTH"), encode(birth, timestamp_ms=1, seq=0)),
        (NODE.format("NDATA"), encode(data, timestamp_ms=2, seq=1)),
        (NODE.format("NDATA"), mode.replace(b"runs", b"r\xffns")),  # not UTF-8
        (NODE.format("NDATA"), encode(data, timestamp_ms=5, seq=2**64 - 1)),  # no sequence number
        (NODE.format("NDATA"), encode(data[:1], timestamp_ms=6, seq=3)),
    ]


def protobuf_messages() -> list[tuple[str, bytes]]:
    telemetry = message_class(example_descriptor_set(), EXAMPLE_MESSAGE)
    wide = telemetry(ts=1_796_000_000_000, seq=WIDE, temperature=float("nan"), firmware="abcd")
    good = wide.SerializeToString()
    newer = good + b"\x41" + bytes(8)  # a field 8 (a double) a newer schema added
    clockless = telemetry(seq=7, temperature=20.5).SerializeToString()  # ts not sent: reads as 0 in proto3
    return [
        ("pb/wide/telemetry", good),
        ("pb/cut/telemetry", good[:-2]),
        ("pb/newer/telemetry", newer),
        ("pb/latin1/telemetry", good.replace(b"abcd", b"ab\xe9d")),
        ("pb/clockless/telemetry", clockless),
        ("pb/empty/telemetry", b""),
    ]


def test_values_at_the_edges_land_exactly_beside_payloads_quarantined_in_the_same_batch(spark, tmp_path):
    (tmp_path / "telemetry.desc").write_bytes(example_descriptor_set())
    config = tmp_path / "pipeline.yaml"
    started = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=1)
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        text = CONFIG.format(offsets_url=broker.offsets_url, root=tmp_path, message=EXAMPLE_MESSAGE)
        config.write_text(text)
        client = PahoClient(broker.port, "other-tools")
        for topic, payload in [*sparkplug_messages(), *protobuf_messages()]:
            client.publish(topic, payload, 1)
        client.close()
        wait_for_log(broker, NODE.format("NDATA"), 4)
        wait_for_log(broker, "pb/latin1/telemetry", 1)
        counters = run_job(str(config))
    finally:
        broker.stop()
    quarantined = 'timestone_pipeline_quarantined_total{{pipeline="telemetry",reason="{}"}}'
    assert counters[quarantined.format("unparseable_payload")] == 5

    store = open_store(None, load_telemetry_config_file(config))
    metrics = store.read_arrow("sparkplug_metrics").to_pylist()
    values = [(r["seq"], r["metric"], r["value_long"], r["value_string"], r["seq_gap"]) for r in metrics]
    assert sorted(values, key=lambda v: (v[0], v[1])) == [
        (0, "Counter", WIDE, None, False),
        (0, "Flow", None, None, False),
        (0, "Mask", None, str(2**64 - 1), False),
        (0, "Mode", None, "idle", False),
        (0, "Running", None, None, False),
        (0, "bdSeq", 0, None, False),
        (1, "Counter", WIDE + 2, None, False),
        (1, "Running", None, None, False),
        (3, "Counter", WIDE + 2, None, False),
    ]
    [flow] = [r for r in metrics if r["metric"] == "Flow"]
    assert math.isnan(flow["value_double"]) and flow["is_null"] is False

    silver = {r["device_id"]: r for r in store.read_arrow("silver_telemetry").to_pylist()}
    assert set(silver) == {"wide", "newer", "clockless"}
    clockless = silver.pop("clockless")  # the broker's time, where its ts read as 0 made it 1970's
    assert (clockless["seq"], clockless["temperature"]) == (7, 20.5)
    assert clockless["event_time"] >= started and clockless["event_date"] >= started.date()
    assert all(r["seq"] == WIDE and math.isnan(r["temperature"]) for r in silver.values())

    at = protobuf_messages()[0][1].index(b"\x32\x04abcd")  # field 6 (firmware): its tag
    quarantine = {(r["topic"], r["detail"]) for r in store.read_arrow("telemetry_quarantine").to_pylist()}
    assert quarantine == {
        (NODE.format("NDATA"), "sparkplug_b: metric 0 (alias 5): a String that is not UTF-8"),
        (NODE.format("NDATA"), f"sparkplug_b: seq: {2**64 - 1} is not a sequence number (0 to 255)"),
        (
            "pb/cut/telemetry",
            f"protobuf: byte {at}: field firmware (6): its length runs past the end of the payload",
        ),
        ("pb/latin1/telemetry", f"protobuf: byte {at}: field firmware (6): not UTF-8"),
        ("pb/empty/telemetry", f"protobuf: an empty payload sets no field of {EXAMPLE_MESSAGE}"),
    }
