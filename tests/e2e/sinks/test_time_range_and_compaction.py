"""Reads narrowed to a time range open only the files that may hold it; compaction keeps every row."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks.delta_rs import DeltaRsTableStore
from sinks.store import TimeRange
from sinks.tables import DEFAULT_CATALOG

START = datetime(2026, 3, 1, 23, 59, 50, tzinfo=UTC)


def micros(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def silver_file(second: int, rows: int = 3) -> pa.Table:
    """``rows`` silver rows, the last one 999,999 µs into second ``second`` after START (Delta keeps
    timestamp statistics to the millisecond, truncated, so that row lies above its file's recorded max)."""
    times = [
        START + timedelta(seconds=second, microseconds=999_999 * i // max(rows - 1, 1)) for i in range(rows)
    ]
    return pa.Table.from_pylist(
        [
            {
                "device_id": f"d{i}",
                "event_time": moment,
                "event_date": moment.date(),
                "topic": f"devices/d{i}/telemetry",
                "broker": "b1",
                "offset": second * 100 + i,
                "ingested_at": moment,
                "temperature": 20.0 + i,
            }
            for i, moment in enumerate(times)
        ],
        schema=DEFAULT_CATALOG["silver_telemetry"].arrow_schema,
    )


@pytest.fixture
def silver(lake: DeltaRsTableStore) -> DeltaRsTableStore:
    """Silver with one file per second for 20 seconds across midnight (two event_date partitions)."""
    lake.ensure("silver_telemetry")
    for second in range(20):
        assert lake.append("silver_telemetry", silver_file(second), "q", second)
    return lake


def files_read(frame) -> int:
    return len(frame.inputFiles())


def offsets(frame) -> list[int]:
    return sorted(row["offset"] for row in frame.select("offset").collect())


def test_a_read_within_a_range_opens_only_the_files_that_may_hold_it(silver):
    within = TimeRange(
        "event_time", micros(START + timedelta(seconds=5)), micros(START + timedelta(seconds=7))
    )
    frame = silver.read("silver_telemetry", within)
    assert files_read(frame) == 3  # seconds 5, 6 and 7 (of 20)
    assert offsets(frame) == [500, 501, 502, 600, 601, 602, 700]  # 7 s exactly: only the file's first row
    everything = silver.read("silver_telemetry")
    assert files_read(everything) == 20
    assert offsets(frame) == offsets(within.rows(everything))


def test_a_row_above_its_files_truncated_maximum_is_still_read(silver):
    last_row = START + timedelta(seconds=12, microseconds=999_999)  # the file's recorded max is .999 s
    within = TimeRange("event_time", micros(last_row), micros(last_row))
    assert offsets(silver.read("silver_telemetry", within)) == [1202]


def test_a_range_across_midnight_reads_both_partitions(silver):
    within = TimeRange(
        "event_time", micros(START + timedelta(seconds=9)), micros(START + timedelta(seconds=10))
    )
    frame = silver.read("silver_telemetry", within)
    assert {row["event_date"].day for row in frame.collect()} == {1, 2}
    assert offsets(frame) == [900, 901, 902, 1000]


def test_an_empty_range_is_refused():
    with pytest.raises(ValueError, match="empty time range"):
        TimeRange("event_time", 2, 1)


def test_compaction_keeps_every_row_and_a_snapshot_read_before_it(silver):
    before = silver.read("silver_telemetry")
    version = silver.version("silver_telemetry")
    removed = silver.compact("silver_telemetry", target_bytes=16 << 20)
    assert removed == 20
    table = DeltaTable(silver.location("silver_telemetry"))
    assert len(table.get_add_actions().column("path").to_pylist()) == 2  # one file per event_date
    assert silver.version("silver_telemetry") == version + 2  # one commit per crowded partition (two dates)
    assert silver.committed_batch("silver_telemetry", "q") == 19  # its batches stay recorded
    assert offsets(silver.read("silver_telemetry")) == offsets(before)  # the old files are still on disk
    within = TimeRange(
        "event_time", micros(START + timedelta(seconds=5)), micros(START + timedelta(seconds=7))
    )
    assert offsets(silver.read("silver_telemetry", within)) == [500, 501, 502, 600, 601, 602, 700]
    assert silver.compact("silver_telemetry", target_bytes=16 << 20) == 0, "nothing left to compact"


def test_compaction_leaves_files_of_the_target_size_alone(silver):
    largest = max(
        DeltaTable(silver.location("silver_telemetry")).get_add_actions().column("size_bytes").to_pylist()
    )
    assert silver.compact("silver_telemetry", target_bytes=largest) == 0
