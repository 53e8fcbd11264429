"""What the end-to-end payload tests share: a broker's log read with ``availableNow`` into a table writer."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from broker_edge.runtime.launcher import BrokerProcess
from sinks import BatchWriter, TableStore, exactly_once


class FailOnce:
    """Armed, the next micro-batch raises after its writes, as a driver dying there would leave it."""

    def __init__(self) -> None:
        self.armed = False

    def after_writes(self) -> None:
        if self.armed:
            self.armed = False
            raise RuntimeError("the batch fails after its append (simulated)")


def run_available_now(
    spark: SparkSession,
    broker: BrokerProcess,
    topics: str,
    store: TableStore,
    write: Callable[[DataFrame, BatchWriter], None],
    checkpoint: Path,
    transform: Callable[[DataFrame], DataFrame] = lambda records: records,
) -> None:
    """Read ``topics`` of ``broker`` from the earliest offset (or the checkpoint) to what it holds now,
    each micro-batch through ``transform`` into ``write`` with the tables' exactly-once writer."""
    records = (
        spark.readStream.format("timestone")
        .option("brokers", f"edge1={broker.offsets_url}")
        .option("topics", topics)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        transform(records)
        .writeStream.foreachBatch(exactly_once(store, write, persist=False))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    finally:
        query.stop()
