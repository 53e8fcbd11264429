"""Appends of Spark DataFrames whose data files are written by the Spark tasks and committed by the driver.

Real local Spark, real delta-rs tables in tmp_path. The lost commit races are made deterministic by running
a real conflicting commit between the store's file writing (its own step, wrapped here) and its commit.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql.types import LongType, StringType, TimestampType

import sinks.delta_rs
from sinks.arrow_conform import SchemaMismatch
from sinks.delta_rs import AppendReport, DeltaRsTableStore
from sinks.parquet_files import write_files
from sinks.tables import TableCatalog, TableSpec, column, struct
from tests.e2e.sinks.conftest import T0, arrow_rows, bronze_row, expected, spark_rows

BRONZE = "bronze_telemetry"
EXECUTOR_FILE = re.compile(r"^part-(\d{5})-([0-9a-f-]{36})-\d+-c\d{3}\.snappy\.parquet$")
DELTA_RS_FILE = re.compile(r"^part-\d{5}-[0-9a-f-]{36}-c000\.snappy\.parquet$")

SITES = TableSpec(
    name="site_readings",
    schema=struct(
        column("site", StringType()),
        column("reading", LongType(), False),
        column("at", TimestampType()),
    ),
    description="readings partitioned by a nullable string",
    partition_by=("site",),
)


def files_on_disk(location: str) -> set[str]:
    """Every data file under the table directory, relative to it."""
    root = Path(location)
    return {str(p.relative_to(root)) for p in root.rglob("*.parquet")}


def committed_files(location: str) -> set[str]:
    """The live files of the current snapshot, relative to the table directory, as on disk."""
    return {unquote(p) for p in DeltaTable(location).get_add_actions().column("path").to_pylist()}


def log_adds(location: str, version: int) -> list[dict]:
    """The add actions of one commit, as written in its log file."""
    lines = (Path(location) / "_delta_log" / f"{version:020d}.json").read_text().splitlines()
    return [action["add"] for action in map(json.loads, lines) if "add" in action]


def delta_rs_rows(location: str, sort_by: str) -> list[dict]:
    return pa.table(DeltaTable(location).to_pyarrow_table()).sort_by(sort_by).to_pylist()


class CommitBetween:
    """Wraps the store's file writing: after the real tasks wrote the files, runs ``commit`` (once)."""

    def __init__(self, commit) -> None:
        self.commit = commit
        self.calls = 0

    def __call__(self, frame, writer):
        self.calls += 1
        written = write_files(frame, writer)
        if self.calls == 1:
            self.commit()
        return written


@pytest.fixture
def lake(spark, tmp_path) -> DeltaRsTableStore:
    return DeltaRsTableStore(spark, str(tmp_path / "lake"))


def test_a_partitioned_append_is_written_by_the_tasks_in_one_commit(spark, lake):
    rows = [bronze_row(offset, day=1 + offset % 2) for offset in range(12)]
    reports: list[AppendReport] = []
    lake.on_append = reports.append
    frame = spark_rows(spark, BRONZE, rows).repartition(3)
    assert lake.append(BRONZE, frame, "q", 0) is True

    location = lake.location(BRONZE)
    assert lake.version(BRONZE) == 1, "table creation, then exactly one commit"
    adds = log_adds(location, 1)
    names = [EXECUTOR_FILE.match(unquote(a["path"]).split("/")[-1]) for a in adds]
    assert all(names), [a["path"] for a in adds]
    assert {m.group(1) for m in names} == {"00000", "00001", "00002"}, "one or more files per task"
    assert len({m.group(2) for m in names}) == 1, "one write id for the whole append"
    assert {a["path"].split("/")[0] for a in adds} == {"ingest_date=2026-03-01", "ingest_date=2026-03-02"}
    assert sorted({a["partitionValues"]["ingest_date"] for a in adds}) == ["2026-03-01", "2026-03-02"]
    assert sum(json.loads(a["stats"])["numRecords"] for a in adds) == 12
    assert files_on_disk(location) == committed_files(location)
    assert reports == [AppendReport(BRONZE, True, 12, len(adds), reports[0].spark_s, reports[0].driver_s)]
    stored = pq.read_table(Path(location) / unquote(adds[0]["path"]))
    assert "ingest_date" not in stored.column_names, "partition values live in the path"

    want = arrow_rows(BRONZE, rows)
    assert lake.read_arrow(BRONZE).sort_by("offset").equals(want), "read back with delta-rs"
    assert_df_equality(lake.read(BRONZE).orderBy("offset"), expected(spark, BRONZE, rows).orderBy("offset"))
    assert lake.committed_batch(BRONZE, "q") == 0


def test_null_and_escaped_partition_values_read_back(spark, tmp_path):
    store = DeltaRsTableStore(spark, str(tmp_path / "lake"), TableCatalog([SITES]))
    sites = ["north", "a b", "x/y:z=1%", None, "", "é"]
    rows = [{"site": s, "reading": i, "at": T0 + timedelta(seconds=i)} for i, s in enumerate(sites)]
    frame = spark.createDataFrame(pa.Table.from_pylist(rows, schema=SITES.arrow_schema)).repartition(2)
    assert store.append("site_readings", frame, "q", 0) is True

    location = store.location("site_readings")
    directories = {path.split("/")[0] for path in files_on_disk(location)}
    assert directories == {
        "site=north",
        "site=a b",
        "site=x%2Fy%3Az%3D1%25",
        "site=__HIVE_DEFAULT_PARTITION__",
        "site=é",
    }
    values = {a["partitionValues"]["site"] for a in log_adds(location, 1)}
    assert values == {"north", "a b", "x/y:z=1%", None, "é"}, "an empty string is a null partition"
    want = [r | {"site": r["site"] or None} for r in rows]
    assert delta_rs_rows(location, "reading") == want
    assert [(r.site, r.reading) for r in store.read("site_readings").orderBy("reading").collect()] == [
        (r["site"], r["reading"]) for r in want
    ]


def test_a_replayed_batch_writes_no_files(spark, lake):
    frame = spark_rows(spark, BRONZE, [bronze_row(0), bronze_row(1)])
    assert lake.append(BRONZE, frame, "q", 7) is True
    location = lake.location(BRONZE)
    files, version = files_on_disk(location), lake.version(BRONZE)
    assert lake.append(BRONZE, frame, "q", 7) is False
    assert lake.append(BRONZE, frame, "q", 6) is False
    assert (files_on_disk(location), lake.version(BRONZE)) == (files, version)
    assert lake.read_arrow(BRONZE).num_rows == 2


def test_losing_the_race_to_another_attempt_of_the_batch_deletes_this_attempts_files(
    spark, lake, monkeypatch
):
    theirs = [bronze_row(100), bronze_row(101)]
    other = DeltaRsTableStore(None, lake.root)
    between = CommitBetween(lambda: other.append(BRONZE, arrow_rows(BRONZE, theirs), "q", 5))
    monkeypatch.setattr(sinks.delta_rs, "write_files", between)
    mine = spark_rows(spark, BRONZE, [bronze_row(0), bronze_row(1), bronze_row(2)])

    assert lake.append(BRONZE, mine, "q", 5) is False
    location = lake.location(BRONZE)
    assert between.calls == 1
    assert [r["offset"] for r in delta_rs_rows(location, "offset")] == [100, 101]
    assert files_on_disk(location) == committed_files(location), "this attempt's files are gone"
    assert lake.version(BRONZE) == 1


def test_a_lost_commit_is_retried_with_the_same_files(spark, lake, monkeypatch):
    location = lake.location(BRONZE)
    lake.append(BRONZE, arrow_rows(BRONZE, [bronze_row(0)]), "q", 0)
    other = DeltaRsTableStore(None, lake.root)
    between = CommitBetween(lambda: other.append(BRONZE, arrow_rows(BRONZE, [bronze_row(1)]), "q", 1))
    monkeypatch.setattr(sinks.delta_rs, "write_files", between)
    before = files_on_disk(location)
    mine = spark_rows(spark, BRONZE, [bronze_row(2, day=1), bronze_row(3, day=2)])

    assert lake.append(BRONZE, mine, "q", 2) is True, "the conflicting commit was an older batch"
    assert between.calls == 1, "files are written once"
    assert lake.version(BRONZE) == 3
    ours = {unquote(a["path"]) for a in log_adds(location, 3)}
    written = files_on_disk(location) - before - {unquote(a["path"]) for a in log_adds(location, 2)}
    assert ours == written and len(ours) == 2
    assert [r["offset"] for r in delta_rs_rows(location, "offset")] == [0, 1, 2, 3]
    assert lake.committed_batch(BRONZE, "q") == 2


def test_file_stats_are_read_by_delta_rs_and_bound_the_data(spark, lake):
    base = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    rows = [
        bronze_row(offset)
        | {"timestamp": base + timedelta(microseconds=1_000_250 * offset + 7), "client_id": None}
        for offset in range(10)
    ]
    rows[3]["client_id"] = "d3"
    lake.append(BRONZE, spark_rows(spark, BRONZE, rows).coalesce(1), "q", 0)

    table = DeltaTable(lake.location(BRONZE))
    (stats,) = pa.table(table.get_add_actions(flatten=True)).to_pylist()
    assert stats["num_records"] == 10
    assert (stats["min.offset"], stats["max.offset"]) == (0, 9)
    assert (stats["null_count.client_id"], stats["null_count.offset"]) == (9, 0)
    low, high = rows[0]["timestamp"], rows[9]["timestamp"]
    assert low - timedelta(milliseconds=1) < stats["min.timestamp"] <= low
    assert high <= stats["max.timestamp"] < high + timedelta(milliseconds=1)
    assert stats.get("min.topic") is None, "no bounds for strings"

    dataset = table.to_pyarrow_dataset()
    at = pc.field("timestamp")
    ts = pa.timestamp("us", tz="UTC")
    assert dataset.to_table(filter=at >= pa.scalar(high, ts)).column("offset").to_pylist() == [9]
    assert dataset.to_table(filter=at <= pa.scalar(low, ts)).column("offset").to_pylist() == [0]
    assert dataset.to_table(filter=pc.field("offset") > 9).num_rows == 0
    assert sorted(pa.table(table.to_pyarrow_table(filters=[("offset", ">=", 8)]))["offset"].to_pylist()) == [
        8,
        9,
    ]


def test_an_empty_frame_commits_nothing(spark, lake):
    assert lake.append(BRONZE, spark_rows(spark, BRONZE, []), "q", 0) is True
    assert lake.version(BRONZE) == 0
    assert files_on_disk(lake.location(BRONZE)) == set()
    assert lake.committed_batch(BRONZE, "q") is None


def test_a_failure_after_the_files_are_written_removes_them(spark, lake, monkeypatch):
    def fail():
        raise RuntimeError("driver lost before the commit")

    monkeypatch.setattr(sinks.delta_rs, "write_files", CommitBetween(fail))
    frame = spark_rows(spark, BRONZE, [bronze_row(0, day=1), bronze_row(1, day=2)]).repartition(2)
    with pytest.raises(RuntimeError, match="driver lost"):
        lake.append(BRONZE, frame, "q", 0)
    assert files_on_disk(lake.location(BRONZE)) == set()
    assert lake.version(BRONZE) == 0
    monkeypatch.undo()
    assert lake.append(BRONZE, frame, "q", 0) is True
    assert lake.read_arrow(BRONZE).num_rows == 2


def test_schema_errors_are_raised_before_or_by_the_tasks(spark, lake):
    misspelt = spark_rows(spark, BRONZE, [bronze_row(0)]).withColumnRenamed("offset", "offest")
    with pytest.raises(SchemaMismatch, match=r"bronze_telemetry: columns not in the table: \['offest'\]"):
        lake.append(BRONZE, misspelt, "q", 0)

    schema = pa.schema([f.with_nullable(True) for f in arrow_rows(BRONZE, []).schema])
    rows = [bronze_row(i) for i in range(4)] + [bronze_row(4) | {"offset": None}]
    frame = spark.createDataFrame(pa.Table.from_pylist(rows, schema=schema)).coalesce(1)
    previous = spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "2")  # a file is open when it fails
    try:
        with pytest.raises(Exception, match=r"bronze_telemetry\.offset: 1 null value"):
            lake.append(BRONZE, frame, "q", 0)
    finally:
        spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", previous)
    assert files_on_disk(lake.location(BRONZE)) == set()
    assert lake.version(BRONZE) == 0


def test_arrow_input_is_written_by_the_driver_and_a_dataframe_by_the_tasks(spark, lake):
    reports: list[AppendReport] = []
    lake.on_append = reports.append
    assert lake.append(BRONZE, arrow_rows(BRONZE, [bronze_row(0)]), "q", 0) is True
    (name,) = [Path(p).name for p in files_on_disk(lake.location(BRONZE))]
    assert DELTA_RS_FILE.match(name), name
    assert lake.append(BRONZE, spark_rows(spark, BRONZE, [bronze_row(1)]), "q", 1) is True
    assert [(r.on_executors, r.rows, r.files) for r in reports] == [(False, 1, None), (True, 1, 1)]
    assert reports[0].spark_s == 0.0 and reports[1].spark_s > 0.0, "only the DataFrame ran a Spark job"


def test_a_file_uri_root_is_written_by_the_tasks(spark, tmp_path):
    store = DeltaRsTableStore(spark, f"file://{tmp_path}/lake")
    rows = [bronze_row(offset) for offset in range(3)]
    assert store.append(BRONZE, spark_rows(spark, BRONZE, rows), "q", 0) is True
    names = [Path(p).name for p in files_on_disk(str(tmp_path / "lake" / BRONZE))]
    assert names and all(EXECUTOR_FILE.match(n) for n in names)
    assert store.read(BRONZE).count() == 3
