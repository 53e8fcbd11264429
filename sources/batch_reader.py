"""``spark.read.format("timestone")``: what the brokers hold now, read once (a backfill, a notebook's look).

The batch is planned and read by the stream reader's own code: from ``startingOffsets`` (``earliest`` when
not given, as Kafka's batch source starts) to the end each log has when the batch is planned, in one go
(``maxRecordsPerTrigger`` is a stream's). A broker that does not answer fails the read: a stream goes on
without it and reads it once it is back, a batch would lack its records without a word.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol

from pyspark.sql.datasource import DataSourceReader, InputPartition

from .stream_api import ReadAllAvailable, ReadLimit

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa

__all__ = ["PlannedStream", "TimestoneBatchReader"]


class PlannedStream(Protocol):
    """What a batch read uses of the stream reader (``timestone_source.TimestoneStreamReader``)."""

    @property
    def brokers_down(self) -> set[str]: ...

    def initialOffset(self) -> dict: ...

    def latestOffset(self, start: dict | None = None, limit: ReadLimit | None = None) -> dict: ...

    def partitions(self, start: dict, end: dict) -> list[InputPartition]: ...

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]: ...

    def stop(self) -> None: ...


class TimestoneBatchReader(DataSourceReader):
    """One batch read: its partitions planned on the driver, each read on an executor."""

    def __init__(self, stream: PlannedStream) -> None:
        self.stream = stream

    def partitions(self) -> list[InputPartition]:
        stream = self.stream
        try:
            start = json.loads(json.dumps(stream.initialOffset()))  # (as Spark hands offsets back)
            end = json.loads(json.dumps(stream.latestOffset(start, ReadAllAvailable())))
            down = stream.brokers_down
            if down:
                names = ", ".join(sorted(down))
                raise RuntimeError(
                    f"timestone source: a batch read reads every broker, and {names} did not answer (its "
                    "error is in the log above); read again once it is back, or leave it out of the option "
                    "brokers"
                )
            return stream.partitions(start, end)
        finally:
            stream.stop()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if getattr(partition, "plan", None) is None:  # Spark's stand-in when there is nothing to read
            return iter(())  # (``InputPartition(None)``; Spark 4.0 hands ``None``)
        return self.stream.read(partition)
