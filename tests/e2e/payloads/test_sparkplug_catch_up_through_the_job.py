"""``timestone pipeline telemetry`` catching up on an edge node's messages, with a record limit per batch.

``source.max_records_per_trigger`` shares a micro-batch's records among the logs it reads in proportion to
their backlog. A broker of several storage partitions (a cluster's member: 16 by default) keeps an edge
node's topics in several logs, so a log with few of its records (here the NBIRTHs') was read ahead of a busy
one (the NDATA's): a rebirth giving alias 1 another meaning was in force before the data sent under the
birth before it were read.
"""

from __future__ import annotations

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.payloads.sparkplug.encode import MetricOut, bdseq_metric, encode
from pipelines.telemetry.config import load_telemetry_config_file
from pipelines.telemetry.job import open_store
from tests.e2e.broker_clients import PahoClient
from tests.e2e.payloads.test_fleets_through_the_job import run_job, wait_for_log
from tests.e2e.payloads.test_sparkplug_vendors_through_the_job import CONFIG

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

NODE = "spBv1.0/plant5/{}/gw1"
#: The NDATA sent under the first birth: each batch of 4 records reads 3 of them, and an NBIRTH.
BEFORE = 20


def birth(name: str, at_ms: int) -> bytes:
    return encode([bdseq_metric(0), MetricOut(0.0, "Double", name=name, alias=1)], timestamp_ms=at_ms, seq=0)


def data(seq: int, at_ms: int) -> bytes:
    return encode(
        [MetricOut(float(seq), "Double", alias=1, with_datatype=False)], timestamp_ms=at_ms, seq=seq
    )


def test_a_rebirth_is_read_after_the_data_sent_before_it_whatever_the_record_limit(spark, tmp_path):
    sent = [(NODE.format("NBIRTH"), birth("Level", 0))]
    sent += [(NODE.format("NDATA"), data(seq, seq)) for seq in range(1, BEFORE + 1)]
    sent.append((NODE.format("NBIRTH"), birth("Pressure", 100)))  # alias 1 another metric from now on
    sent += [(NODE.format("NDATA"), data(seq, 100 + seq)) for seq in (1, 2)]
    config = tmp_path / "pipeline.yaml"
    broker = BrokerProcess(tmp_path / "broker", storage={"partitions": 4}).start()  # NBIRTH p1, NDATA p0
    try:
        limited = CONFIG.replace("  source:\n", "  source:\n    max_records_per_trigger: 4\n")
        config.write_text(limited.format(offsets_url=broker.offsets_url, root=tmp_path))
        client = PahoClient(broker.port, "gw1")
        for topic, message in sent:
            client.publish(topic, message, 1)
        client.close()
        wait_for_log(broker, NODE.format("NDATA"), BEFORE + 2)
        counters = run_job(str(config))
    finally:
        broker.stop()
    assert counters['timestone_pipeline_sparkplug_seq_gaps_total{pipeline="telemetry"}'] == 0

    store = open_store(None, load_telemetry_config_file(config))
    rows = store.read_arrow("sparkplug_metrics").to_pylist()
    read = sorted((r["metric_time"], r["metric"], r["value_double"]) for r in rows if r["metric"] != "bdSeq")
    assert [(name, value) for _, name, value in read] == [
        ("Level", 0.0),
        *[("Level", float(seq)) for seq in range(1, BEFORE + 1)],
        ("Pressure", 0.0),
        ("Pressure", 1.0),
        ("Pressure", 2.0),
    ]
