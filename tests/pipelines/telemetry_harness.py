"""Building blocks for the telemetry pipeline tests: source-shaped records and readings.

Records have exactly the ``timestone`` source's schema, so a transformation tested on them sees what it
sees in the job.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql import DataFrame, SparkSession

SOURCE_DDL = (
    "broker string, topic string, offset bigint, timestamp timestamp, client_id string, qos tinyint, "
    "retain boolean, properties map<string,string>, payload binary"
)

T0 = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    """A UTC moment ``seconds`` after T0 (naive-free: Spark reads it in the session's UTC time zone)."""
    return T0 + timedelta(seconds=seconds)


def ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def reading(device: str = "dev-1", seq: int = 1, seconds: float = 0.0, **fields: Any) -> bytes:
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
    device: str, offset: int, seq: int, seconds: float = 0.0, broker: str = "edge1", **fields
) -> tuple:
    """A source row on ``devices/<device>/telemetry`` whose event time is ``seconds`` after T0."""
    return record(
        f"devices/{device}/telemetry", offset, reading(device, seq, seconds, **fields), broker, seconds
    )
