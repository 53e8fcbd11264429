"""An edge node whose encoder is another vendor's, through a broker and ``timestone pipeline telemetry``.

Its payloads are built field by field as a proto3 copy of the schema writes them (a sequence number or
an NBIRTH's 0 left out), with a DataSet of signed cells, packed arrays (one cut short), a transient metric,
data of a device before its DBIRTH, a rebirth that gives alias 1 another meaning, and a death, beside a
host application's retained STATE (read by neither query): every metric
lands once in ``sparkplug_metrics`` under the name its birth in force gave it, the messages it cannot use
are quarantined with their reason, and the node is offline at the end.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.payloads.sparkplug.schema import DATATYPE_NUMBERS
from pipelines.telemetry.config import load_telemetry_config_file
from pipelines.telemetry.job import open_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.payloads.test_fleets_through_the_job import run_job, wait_for_log
from tests.sparkplug_messages import metric, payload

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
      - {{topic_template: "spBv1.0/{{group_id}}", format: sparkplug_b}}
  quality:
    gx: {{schedule: never}}
"""
NODE = "spBv1.0/plant3/{}/gw1"
PUMP = "spBv1.0/plant3/{}/gw1/pump"


def first_birth() -> Any:
    birth = payload(1_000, 0)
    metric(birth, "bdSeq", None, "Int64").long_value = 4
    metric(birth, "Level", 1, "Int32").int_value = 7
    setpoint = metric(birth, "Setpoint", 2, "Double")
    setpoint.double_value, setpoint.is_transient = 40.5, True
    runs = metric(birth, "Runs", 3, "DataSet").dataset_value
    runs.num_of_columns = 2
    runs.columns.extend(["trim", "count"])
    runs.types.extend([DATATYPE_NUMBERS["Int16"], DATATYPE_NUMBERS["UInt32"]])
    row = runs.rows.add()
    row.elements.add().int_value = 2**32 - 3
    row.elements.add().int_value = 9
    metric(birth, "Trims", 4, "Int16Array").bytes_value = b"\xff\xff\x02\x00"
    return birth


def messages() -> list[tuple[str, Any]]:
    data = payload(1_001, 1)
    metric(data, None, 1).int_value = 2**32 - 4  # -4
    transient = metric(data, None, 2)
    transient.double_value, transient.is_transient = 41.0, True
    early = payload(1_002, 2)  # the device's data before its DBIRTH
    metric(early, None, 10).float_value = 1.0
    device_birth = payload(1_003, 3)
    metric(device_birth, "Temperature", 10, "Float").float_value = 20.5
    device_data = payload(1_004, 4)
    metric(device_data, None, 10).float_value = 21.5
    cut = payload(1_005, 5)
    metric(cut, None, 4).bytes_value = b"\x01\x00\x02"  # an Int16Array cut short
    rebirth = payload(2_000, 0)
    metric(rebirth, "bdSeq", None, "Int64").long_value = 4
    metric(rebirth, "Pressure", 1, "Double").double_value = 1.5  # alias 1 means another metric now
    after = payload(2_001, 1)
    metric(after, None, 1).double_value = 2.5
    stale = payload(2_002, 2)  # the device has not been born again since the rebirth
    metric(stale, None, 10).float_value = 22.5
    death = payload(3_000, None)
    metric(death, "bdSeq", None, "Int64").long_value = 4
    return [
        (NODE.format("NBIRTH"), first_birth()),
        (NODE.format("NDATA"), data),
        (PUMP.format("DDATA"), early),
        (PUMP.format("DBIRTH"), device_birth),
        (PUMP.format("DDATA"), device_data),
        (NODE.format("NDATA"), cut),
        (NODE.format("NBIRTH"), rebirth),
        (NODE.format("NDATA"), after),
        (PUMP.format("DDATA"), stale),
        (NODE.format("NDEATH"), death),
    ]


def milliseconds(time: datetime) -> int:
    return (time.replace(tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def test_another_vendors_edge_node_lands_once_under_the_birth_in_force(spark, tmp_path):
    config = tmp_path / "pipeline.yaml"
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        config.write_text(CONFIG.format(offsets_url=broker.offsets_url, root=tmp_path))
        client = PahoClient(broker.port, "vendor-gw1")
        state = {"online": True, "timestamp": 500}  # a host application's STATE: no edge node's
        client.publish("spBv1.0/STATE/scada", json.dumps(state).encode(), 1, retain=True)
        for topic, message in messages():
            client.publish(topic, message.SerializeToString(), 1)
        client.close()
        wait_for_log(broker, NODE.format("NDEATH"), 1)
        counters = run_job(str(config))
    finally:
        broker.stop()
    quarantined = 'timestone_pipeline_quarantined_total{{pipeline="telemetry",reason="{}"}}'
    assert counters[quarantined.format("unparseable_payload")] == 1
    assert counters[quarantined.format("sparkplug_unknown_alias")] == 2
    assert counters['timestone_pipeline_sparkplug_seq_gaps_total{pipeline="telemetry"}'] == 0

    store = open_store(None, load_telemetry_config_file(config))
    rows = store.read_arrow("sparkplug_metrics").to_pylist()
    landed = sorted(
        (milliseconds(r["metric_time"]), r["device_id"], r["metric"], r["seq"], r["is_transient"])
        for r in rows
    )
    assert landed == [
        (1000, None, "Level", 0, False),
        (1000, None, "Runs", 0, False),
        (1000, None, "Setpoint", 0, True),
        (1000, None, "Trims", 0, False),
        (1000, None, "bdSeq", 0, False),
        (1001, None, "Level", 1, False),
        (1001, None, "Setpoint", 1, True),
        (1003, "pump", "Temperature", 3, False),
        (1004, "pump", "Temperature", 4, False),
        (2000, None, "Pressure", 0, False),
        (2000, None, "bdSeq", 0, False),
        (2001, None, "Pressure", 1, False),
    ]
    by_name = {(r["metric"], r["seq"]): r for r in rows}
    assert by_name["Level", 1]["value_long"] == -4
    assert by_name["Pressure", 1]["value_double"] == 2.5
    assert json.loads(by_name["Runs", 0]["value_string"])["rows"][0]["elements"] == [
        {"intValue": -3},
        {"intValue": 9},
    ]
    assert by_name["Trims", 0]["value_bytes"] == b"\xff\xff\x02\x00"

    quarantine = sorted(
        (r["topic"], r["reason"]) for r in store.read_arrow("telemetry_quarantine").to_pylist()
    )
    assert quarantine == [
        (PUMP.format("DDATA"), "sparkplug_unknown_alias"),
        (PUMP.format("DDATA"), "sparkplug_unknown_alias"),
        (NODE.format("NDATA"), "unparseable_payload"),
    ]
    devices = {r["device_id"]: r["online"] for r in store.read_arrow("devices").to_pylist()}
    assert devices == {"plant3/gw1": False, "plant3/gw1/pump": False}
