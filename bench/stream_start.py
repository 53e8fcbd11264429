"""What starting a streaming query costs Spark itself, whatever the source does: a Python data source that
plans one tiny batch, read with ``availableNow`` into ``noop``.

Spark starts every streaming query on a Python data source by launching a fresh Python process for the
source's offsets (not one forked from its worker daemon), then plans the first batch. The seconds from
``start()`` to the first batch's trigger are that start; the telemetry bench reads the job's own start
against them, and its catch-up rate with and without it.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Offsets of the probe's one batch.
_END = 3


class _OneBatchReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Three rows, in one batch."""

    def initialOffset(self) -> dict:
        return {"n": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """Nothing to fix: the end is known."""

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        return {"n": _END}

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        return [InputPartition(0)] if end["n"] > start["n"] else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        yield pa.RecordBatch.from_pydict({"n": list(range(_END))})

    def commit(self, end: dict) -> None:
        """Nothing to release."""


class StartProbeSource(DataSource):
    """The probe's source, registered as ``timestone_start_probe``."""

    @classmethod
    def name(cls) -> str:
        return "timestone_start_probe"

    def schema(self) -> str:
        return "n long"

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _OneBatchReader()


def first_trigger_s(progress: list[dict[str, Any]], started_at: float) -> float:
    """Seconds from ``started_at`` (epoch seconds, just before ``start()``) to the first batch's trigger."""
    first = datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    return max(0.0, first - started_at)


def stream_start_s(spark: SparkSession, runs: int = 3) -> float:
    """The median seconds from ``start()`` to the first batch's trigger of the probe's query."""
    spark.dataSource.register(StartProbeSource)
    starts = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="timestone-start-probe-") as checkpoint:
            started_at = time.time()
            query = (
                spark.readStream.format(StartProbeSource.name())
                .load()
                .writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            progress = [json.loads(p.json) for p in query.recentProgress]
            starts.append(first_trigger_s(progress, started_at))
    return statistics.median(starts)
