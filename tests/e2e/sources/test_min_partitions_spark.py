"""``minPartitions`` under Spark over a real broker: how a batch is cut into tasks, and that no row is lost.

Each test reads with a ``foreachBatch`` sink that notes, per batch, which Spark partition every record came
from (``spark_partition_id()``), so the tests see the tasks Spark really ran.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.sources.test_timestone_source_spark import (
    expected,
    run_available_now,
    run_until_caught_up,
    stream,
)

pytestmark = pytest.mark.spark

Layout = dict[int, list[tuple[str, int, int, int]]]  # partition -> [(topic, first, last, count)]


class PartitionRecorder:
    """Keeps each batch's rows and its layout: per Spark partition, the offset range read of each topic."""

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.rows: dict[int, list[tuple[str, str, int]]] = {}
        self.layouts: dict[int, Layout] = {}
        self.failed_layout: Layout | None = None
        self._fail_on_batch = fail_on_batch

    def __call__(self, frame: DataFrame, batch_id: int) -> None:
        rows = frame.select("broker", "topic", "offset", F.spark_partition_id().alias("part")).collect()
        ranges: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for row in rows:
            ranges[row.part][row.topic].append(row.offset)
        layout = {
            part: sorted((topic, min(o), max(o), len(o)) for topic, o in topics.items())
            for part, topics in ranges.items()
        }
        if batch_id == self._fail_on_batch and self.failed_layout is None:
            self.failed_layout = layout
            raise RuntimeError("sink failure (simulated)")
        self.layouts[batch_id] = layout
        self.rows[batch_id] = [(row.broker, row.topic, row.offset) for row in rows]

    def keys(self) -> list[tuple[str, str, int]]:
        return sorted(key for rows in self.rows.values() for key in rows)


def test_min_partitions_cuts_a_batch_into_that_many_tasks_with_contiguous_ranges(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    edge.fill("plant/0/temp", 5_000)
    for number in (1, 2, 3):
        edge.fill(f"plant/{number}/temp", 1_000)
    sink = PartitionRecorder()
    frame = stream(timestone_spark, {"e": edge}, startingOffsets="earliest", minPartitions="4")
    run_available_now(frame, tmp_path / "checkpoint", sink)

    # 8,000 records, at least 4 tasks: pieces of 2,000; the big topic is split, small ranges are packed.
    assert sorted(sink.layouts[0].values()) == [
        [("plant/0/temp", 0, 1_999, 2_000)],
        [("plant/0/temp", 2_000, 3_999, 2_000)],
        [("plant/0/temp", 4_000, 4_999, 1_000), ("plant/1/temp", 0, 999, 1_000)],
        [("plant/2/temp", 0, 999, 1_000), ("plant/3/temp", 0, 999, 1_000)],
    ]
    assert sink.keys() == sorted(
        expected("e", "plant/0/temp", range(5_000))
        + [key for n in (1, 2, 3) for key in expected("e", f"plant/{n}/temp", range(1_000))]
    )


def test_without_the_option_a_batch_uses_the_sessions_parallelism(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    parallelism = timestone_spark.sparkContext.defaultParallelism
    assert parallelism > 1  # local[2]: the option's default must differ from the old single task
    edge.fill("plant/0/temp", 2_000 * parallelism)
    sink = PartitionRecorder()
    run_available_now(
        stream(timestone_spark, {"e": edge}, startingOffsets="earliest"), tmp_path / "checkpoint", sink
    )
    assert sorted(sink.layouts[0].values()) == [
        [("plant/0/temp", 2_000 * n, 2_000 * n + 1_999, 2_000)] for n in range(parallelism)
    ]
    assert sink.keys() == expected("e", "plant/0/temp", range(2_000 * parallelism))


def test_batches_replayed_after_a_failure_are_cut_the_same_way_and_nothing_is_lost_or_repeated(
    timestone_spark: SparkSession, edge: EdgeBroker, tmp_path: Path
) -> None:
    for number in range(5):
        edge.fill(f"plant/{number}/temp", 1_200 + 700 * number)  # 13,000 records
    checkpoint = tmp_path / "checkpoint"
    options = {"startingOffsets": "earliest", "maxRecordsPerTrigger": "6000", "minPartitions": "3"}

    failing = PartitionRecorder(fail_on_batch=1)
    with pytest.raises(StreamingQueryException, match="simulated"):
        run_until_caught_up(stream(timestone_spark, {"e": edge}, **options), checkpoint, failing)
    assert failing.failed_layout is not None and len(failing.failed_layout) >= 3

    resumed = PartitionRecorder()
    run_until_caught_up(stream(timestone_spark, {"e": edge}, **options), checkpoint, resumed)
    assert resumed.layouts[1] == failing.failed_layout
    sizes = [
        (len(layout), sum(r[3] for rs in layout.values() for r in rs)) for layout in resumed.layouts.values()
    ]
    assert sorted(rows for _, rows in sizes) == [1_000, 6_000]
    assert all(parts >= 3 if rows == 6_000 else parts == 1 for parts, rows in sizes)  # no tiny tasks
    assert len(failing.layouts[0]) >= 3
    everything = failing.keys() + resumed.keys()
    assert len(everything) == len(set(everything))
    assert sorted(everything) == sorted(
        key for n in range(5) for key in expected("e", f"plant/{n}/temp", range(1_200 + 700 * n))
    )
