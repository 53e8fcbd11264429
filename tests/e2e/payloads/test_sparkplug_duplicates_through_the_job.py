"""An edge node's messages delivered twice, through a broker and ``timestone pipeline telemetry``.

Its MQTT client sends a DDATA again, and a late copy of its NBIRTH reaches the broker after its
devices' births (as a bridge passing messages on twice delivers it): bronze keeps every copy, and each
metric lands once in ``sparkplug_metrics``, with no sequence gap and nothing quarantined.
"""

from __future__ import annotations

import re

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.payloads.sparkplug.encode import MetricOut, bdseq_metric, encode
from pipelines.telemetry.config import load_telemetry_config_file
from pipelines.telemetry.job import open_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.payloads.test_fleets_through_the_job import run_job, wait_for_log
from tests.e2e.payloads.test_sparkplug_vendors_through_the_job import CONFIG

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

NODE = "spBv1.0/plant4/{}/gw1"
PUMP = "spBv1.0/plant4/{}/gw1/pump"


def pump_data(seq: int) -> bytes:
    return encode([MetricOut(float(seq), "Float", alias=10, with_datatype=False)], timestamp_ms=seq, seq=seq)


def test_a_message_delivered_twice_lands_once_and_breaks_no_sequence(spark, tmp_path, caplog):
    birth = encode([bdseq_metric(0), MetricOut(1.5, "Double", name="Level", alias=1)], timestamp_ms=0, seq=0)
    device_birth = encode([MetricOut(20.0, "Float", name="Temperature", alias=10)], timestamp_ms=1, seq=1)
    sent = [
        (NODE.format("NBIRTH"), birth),
        (PUMP.format("DBIRTH"), device_birth),
        (PUMP.format("DDATA"), pump_data(2)),
        (PUMP.format("DDATA"), pump_data(2)),  # sent again by the node's client
        (NODE.format("NBIRTH"), birth),  # a late copy: the pump's birth stays in force
        (PUMP.format("DDATA"), pump_data(3)),
    ]
    config = tmp_path / "pipeline.yaml"
    broker = BrokerProcess(tmp_path / "broker").start()
    try:
        config.write_text(CONFIG.format(offsets_url=broker.offsets_url, root=tmp_path))
        client = PahoClient(broker.port, "gw1")
        for topic, message in sent:  # QoS 1: every copy in the log before the client closes
            client.publish(topic, message, 1)
        client.close()
        wait_for_log(broker, PUMP.format("DDATA"), 3)
        counters = run_job(str(config))
    finally:
        broker.stop()
    assert counters['timestone_pipeline_sparkplug_seq_gaps_total{pipeline="telemetry"}'] == 0
    assert not any(name.startswith("timestone_pipeline_quarantined_total") for name in counters)
    reports = [r.getMessage() for r in caplog.records if r.name == "pipelines.telemetry.sparkplug"]
    assert sum(int(n) for report in reports for n in re.findall(r"duplicates=(\d+)", report)) == 2

    store = open_store(None, load_telemetry_config_file(config))
    landed = sorted(
        (r["seq"], r["device_id"] or "", r["metric"], r["seq_gap"])
        for r in store.read_arrow("sparkplug_metrics").to_pylist()
    )
    assert landed == [
        (0, "", "Level", False),
        (0, "", "bdSeq", False),
        (1, "pump", "Temperature", False),
        (2, "pump", "Temperature", False),
        (3, "pump", "Temperature", False),
    ]
    assert store.read_arrow("telemetry_quarantine").num_rows == 0
    bronze = store.read_arrow("bronze_telemetry").column("topic").to_pylist()
    assert sorted(bronze) == sorted(topic for topic, _ in sent)
    devices = {r["device_id"]: r["online"] for r in store.read_arrow("devices").to_pylist()}
    assert devices == {"plant4/gw1": True, "plant4/gw1/pump": True}
