"""A CBOR fleet and a Protobuf fleet into silver's shape, exactly once, through a broker restart.

The simulated fleet sends its readings in the format; a real broker process persists them; the
``timestone`` source reads the log and the executors decode the payloads into the declared fields
(``spark_fields.decoded_struct``, as the telemetry job's parse step takes ``from_json``'s struct); each
micro-batch appends the rows to a ``silver_telemetry`` table through the tables' exactly-once writer. The
broker restarts between two runs of the query, and one micro-batch fails after its append and is replayed.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from pyspark.sql import functions as F

from broker_edge.offsets_api.client import OffsetsClient
from broker_edge.runtime.launcher import BrokerProcess
from pipelines.fleet.background import BackgroundFleet
from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import FleetSpec
from pipelines.payloads.formats import FieldFormat
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, example_descriptor_set
from pipelines.payloads.spark_fields import decoded_struct
from pipelines.telemetry.config import PayloadConfig
from sinks import BatchWriter, TableCatalog, open_table_store
from sinks.tables import parse_fields, silver_telemetry
from tests.e2e.payloads.stream_runs import FailOnce, run_available_now

pytestmark = pytest.mark.spark

PAYLOAD = PayloadConfig()
FORMATS = {
    "cbor": FieldFormat("cbor"),
    "protobuf": FieldFormat("protobuf", example_descriptor_set(), EXAMPLE_MESSAGE),
}


def run_fleet(broker: BrokerProcess, payload_format: str, first_index: int) -> None:
    """Three devices sending readings every 0.1 s for about a second, then disconnecting cleanly."""
    spec = FleetSpec(brokers=[broker.address], count=3, first_index=first_index, fleet_size=6)
    behaviour = DeviceBehaviour(telemetry_interval_s=0.1, payload_format=payload_format)
    with BackgroundFleet(spec, behaviour) as fleet:
        fleet.run(asyncio.sleep(1.0))


def sent(broker: BrokerProcess) -> int:
    return sum(log.end_offset for log in OffsetsClient(broker.offsets_url).list_logs("devices/+/telemetry"))


@pytest.mark.parametrize("payload_format", ["cbor", "protobuf"])
def test_a_fleet_into_silver_exactly_once_through_a_broker_restart(spark, tmp_path, payload_format):
    from sources import register_sources

    register_sources(spark)
    spec = silver_telemetry(parse_fields(PAYLOAD.silver_fields, "payload.fields"))
    store = open_table_store(None, str(tmp_path / "tables"), "delta-rs", TableCatalog([spec]))
    store.ensure("silver_telemetry")
    broker = BrokerProcess(tmp_path / "broker").start()
    fail_once = FailOnce()
    errors: list[str] = []

    def write(batch, out: BatchWriter) -> None:
        parsed = batch.withColumn(
            "_json", decoded_struct(F.col("payload"), FORMATS[payload_format], PAYLOAD.fields)
        ).cache()
        errors.extend(
            r[0]
            for r in parsed.where("_json.decode_error IS NOT NULL").select("_json.decode_error").collect()
        )
        event_time = F.timestamp_millis(F.col("_json.ts"))
        rows = parsed.where("_json.decode_error IS NULL").select(
            F.regexp_extract("topic", PAYLOAD.template.regex, 1).alias("device_id"),
            event_time.alias("event_time"),
            F.to_date(event_time).alias("event_date"),
            "topic",
            "broker",
            "offset",
            F.lit(datetime.now(UTC)).cast("timestamp").alias("ingested_at"),
            *[F.col(f"_json.{name}").alias(name) for name in PAYLOAD.silver_fields],
        )
        out.append("silver_telemetry", rows)
        parsed.unpersist()
        fail_once.after_writes()

    def run_query() -> None:
        run_available_now(spark, broker, PAYLOAD.template.topic_filter, store, write, tmp_path / "checkpoint")

    try:
        run_fleet(broker, payload_format, 0)
        run_query()
        first = store.read_arrow("silver_telemetry").num_rows
        assert first == sent(broker) > 0
        broker.stop()
        broker.start()  # same ports, same log directory
        run_fleet(broker, payload_format, 3)  # three more devices
        fail_once.armed = True
        with pytest.raises(Exception, match="simulated"):
            run_query()
        run_query()  # the failed batch again, same id: its append is not repeated
        rows = store.read_arrow("silver_telemetry").to_pylist()
        assert len(rows) == sent(broker) > first
        assert len({(r["broker"], r["topic"], r["offset"]) for r in rows}) == len(rows)
        assert len({r["device_id"] for r in rows}) == 6
        assert all(isinstance(r["temperature"], float) and r["firmware"] == "1.0.0" for r in rows)
        assert errors == []
    finally:
        broker.stop()
