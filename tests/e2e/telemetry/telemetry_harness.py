"""Building blocks for the telemetry pipeline tests: source-shaped records and readings.

Records have exactly the ``timestone`` source's schema, so a transformation tested on them sees what it
sees in the job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from pyspark.sql import DataFrame, SparkSession

from broker_edge.storage import AppendRecord
from pipelines.telemetry.config import TelemetryConfig
from pipelines.telemetry.job import TelemetryBatch, open_store, start_query, telemetry_rows
from sinks import BatchWriter
from tests.e2e.sources.conftest import EdgeBroker

SOURCE_DDL = (
    "broker string, topic string, offset bigint, timestamp timestamp, client_id string, qos int, "
    "retain boolean, properties map<string,string>, payload binary"
)

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A UTC moment ``seconds`` after T0 (naive-free: Spark reads it in the session's UTC time zone)."""
    return T0 + timedelta(seconds=seconds)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def reading(device: str = "dev-1", seq: int | None = 1, seconds: float = 0.0, **fields: Any) -> bytes:
    """A telemetry payload as the simulated fleet sends it (docs/device-protocol.md)."""
    body = {
        "ts": ms(at(seconds)),
        "seq": seq,
        "temperature": 21.5,
        "humidity": 40.0,
        "battery": 80.0,
        "firmware": "1.0.0",
        "group": "blue",
    }
    body.update(fields)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


def record(
    topic: str,
    offset: int,
    payload: bytes | None,
    broker: str = "edge1",
    seconds: float = 0.0,
    client_id: str = "c",
) -> tuple:
    """One source row; ``seconds`` after T0 is the broker's append time."""
    return (broker, topic, offset, at(seconds), client_id, 1, False, {}, payload)


def records(spark: SparkSession, rows: list[tuple]) -> DataFrame:
    return spark.createDataFrame(rows, SOURCE_DDL)


def telemetry(
    device: str, offset: int, seq: int | None, seconds: float = 0.0, broker: str = "edge1", **fields
) -> tuple:
    """A source row on ``devices/<device>/telemetry`` whose event time is ``seconds`` after T0."""
    return record(
        f"devices/{device}/telemetry", offset, reading(device, seq, seconds, **fields), broker, seconds
    )


def checkpoint_query_id(checkpoint: str | Path) -> str:
    """The streaming query id a checkpoint keeps: the app id of every table write of its query."""
    return json.loads((Path(checkpoint) / "metadata").read_text().splitlines()[0])["id"]


def write_records(batch: TelemetryBatch) -> Callable[[DataFrame, BatchWriter], None]:
    """``batch`` as a ``foreachBatch`` step on source records: the query's streaming part (parse, flags)
    run as a batch query on them first, so duplicates are flagged within the records only."""

    def write(rows: DataFrame, out: BatchWriter) -> None:
        batch(telemetry_rows(rows, batch.config, batch.conditions), out)

    return write


# -- end to end: devices publishing into real broker logs ------------------------------------------------


class Publisher(Protocol):
    """How a test gets device messages into a broker's commitlog.

    ``LogAppendPublisher`` appends straight into a ``LogStore``; an MQTT publisher (QoS 1, waiting for each
    PUBACK, which the broker sends once the record is durable) can take its place without changing a test.
    """

    name: str

    def publish(self, topic: str, payload: bytes, timestamp_ms: int | None = None) -> None: ...

    def flush(self) -> None:
        """Return once everything published is durable and served by the offsets API."""


class LogAppendPublisher:
    """Publishes by appending to an edge broker's log (no MQTT yet); batches appends until ``flush``."""

    def __init__(self, name: str, broker: EdgeBroker) -> None:
        self.name = name
        self.broker = broker
        self._pending: dict[str, list[AppendRecord]] = {}

    def publish(self, topic: str, payload: bytes, timestamp_ms: int | None = None) -> None:
        record = AppendRecord(
            payload=payload, qos=1, client_id=topic.split("/")[1], timestamp_ms=timestamp_ms
        )
        self._pending.setdefault(topic, []).append(record)

    def flush(self) -> None:
        for topic, records_ in self._pending.items():
            self.broker.append(topic, records_)
        self._pending.clear()


class Fleet:
    """Simulated devices spread over brokers: device ``i`` publishes to broker ``i % len(publishers)``."""

    def __init__(self, publishers: list[Publisher], devices: int) -> None:
        self.publishers = publishers
        self.devices = [f"dev-{i:03d}" for i in range(devices)]
        self.sequence = dict.fromkeys(self.devices, 0)
        self.published = 0

    def publisher_of(self, device: str) -> Publisher:
        return self.publishers[self.devices.index(device) % len(self.publishers)]

    def send(self, rounds: int, **fields: Any) -> int:
        """Every device sends ``rounds`` readings; returns how many messages that was."""
        for _ in range(rounds):
            for device in self.devices:
                self.sequence[device] += 1
                seq = self.sequence[device]
                payload = reading(device, seq, seconds=seq, **fields)
                self.publisher_of(device).publish(f"devices/{device}/telemetry", payload, ms(at(seq)))
                self.published += 1
        for publisher in self.publishers:
            publisher.flush()
        return rounds * len(self.devices)


class MqttPublisher:
    """Publishes like a device: MQTT 5, QoS 1 through a real broker; ``flush`` waits for every PUBACK.

    The broker acknowledges a QoS 1 publish once its log holds it durably, so after ``flush`` the offsets
    API serves every message (what ``LogAppendPublisher.flush`` guarantees by appending directly).
    """

    def __init__(self, name: str, port: int, client_id: str = "fleet") -> None:
        import paho.mqtt.client as mqtt

        self.name = name
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        self._pending: list[Any] = []

    def publish(self, topic: str, payload: bytes, timestamp_ms: int | None = None) -> None:
        self._pending.append(self.client.publish(topic, payload, qos=1))  # the broker stamps the time

    def flush(self) -> None:
        for info in self._pending:
            info.wait_for_publish(timeout=30)
            assert info.is_published(), f"no PUBACK for message {info.mid}"
        self._pending.clear()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def run_available_now(spark: SparkSession, config: TelemetryConfig, timeout_s: int) -> TelemetryBatch:
    """Run the telemetry job over what the brokers hold (``availableNow``) to the end; its batch, closed."""
    batch = TelemetryBatch(config, open_store(spark, config))
    batch.ensure_tables()
    query = start_query(spark, config, batch, available_now=True)
    try:
        assert query.awaitTermination(timeout_s), "the query did not finish"
        assert query.exception() is None
    finally:
        batch.close()
    return batch
