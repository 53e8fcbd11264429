"""Compaction, vacuum and log clean-up keep a table's rows and its batch markers, and bound its files.

Tables written the way the jobs write them: a partitioned table appended to once per batch across two
partitions (bronze), and an unpartitioned one merged into once per batch (action_executions, where every
merge replaces files). Each is maintained, then compared with what it held before (chispa), its batch
markers read back, and a replayed batch written again: it must still be skipped.
"""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql.types import MapType

from sinks import TableStore
from sinks.delta_rs import DeltaRsTableStore
from sinks.maintenance import LOG_RETENTION, RetentionPolicy, Upkeep, maintenance_pass
from sinks.tables import DEFAULT_CATALOG
from tests.e2e.sinks.conftest import bronze_row, execution_row

pytestmark = pytest.mark.spark

#: Removed files and log entries are deleted at once: nothing else reads these tables meanwhile.
AT_ONCE = RetentionPolicy(
    target_bytes=16 << 20, min_files=2, retention_hours=0, log_retention_hours=1, settle_seconds=0
)


def rows(name: str, batch: list[dict]) -> pa.Table:
    return pa.Table.from_pylist(batch, schema=DEFAULT_CATALOG[name].arrow_schema)


@pytest.fixture
def bronze(lake: DeltaRsTableStore) -> DeltaRsTableStore:
    """Bronze after 12 batches, each appending 3 rows to day 1 and 3 to day 2 (24 files)."""
    for batch in range(12):
        offsets = range(6 * batch, 6 * batch + 6)
        data = [bronze_row(offset, day=1 + offset % 2) for offset in offsets]
        assert lake.append("bronze_telemetry", rows("bronze_telemetry", data), "query", batch)
    return lake


@pytest.fixture
def executions(lake: DeltaRsTableStore) -> DeltaRsTableStore:
    """action_executions after 12 merges, each moving 4 of 10 devices' rows to a new version."""
    lake.ensure("action_executions")
    for batch in range(12):
        data = [execution_row(f"d{(batch * 4 + i) % 10}", "IN_PROGRESS", batch + 1) for i in range(4)]
        assert lake.merge(
            "action_executions",
            rows("action_executions", data),
            "query",
            batch,
            update_when="s.version > t.version",
        )
    return lake


FIXTURES = {"bronze_telemetry": "bronze", "action_executions": "executions"}


def files_on_disk(store: TableStore, name: str) -> int:
    location = store.location(name)
    return sum(
        1
        for folder, _, names in os.walk(location)
        if "_delta_log" not in folder
        for n in names
        if n.endswith(".parquet")
    )


def same_rows(spark, expected: list, actual: DataFrame) -> None:
    """chispa's comparison of two tables' rows, ordered by every column Spark can sort (not maps)."""
    key = [f.name for f in actual.schema.fields if not isinstance(f.dataType, MapType)]
    expected_frame = spark.createDataFrame(expected, actual.schema)
    assert_df_equality(expected_frame.orderBy(*key), actual.orderBy(*key))


def next_batch(name: str) -> pa.Table:
    if name == "bronze_telemetry":
        return rows(name, [bronze_row(1000)])
    return rows(name, [execution_row("d1", "SUCCEEDED", 100)])


def replayed_batch(name: str) -> pa.Table:
    if name == "bronze_telemetry":
        return rows(name, [bronze_row(0)])
    return rows(name, [execution_row("d0", "FAILED", 99)])


@pytest.mark.parametrize("name", ["bronze_telemetry", "action_executions"])
def test_maintenance_keeps_the_rows_and_the_batch_markers_and_deletes_replaced_files(request, spark, name):
    store: DeltaRsTableStore = request.getfixturevalue(FIXTURES[name])
    before = store.read(name).collect()
    live_before = store.data_files(name)
    assert files_on_disk(store, name) >= 12  # a file per append, or the files each merge replaced

    done = maintenance_pass(store, [name], AT_ONCE, vacuum=False)

    assert not [u for u in done if u.error], done
    compacted = live_before if live_before >= AT_ONCE.min_files else 0  # a merge rewrites small tables whole
    assert next(u.count for u in done if u.operation == "compact") == compacted
    same_rows(spark, before, store.read(name))
    partitions = 2 if name == "bronze_telemetry" else 1
    assert store.data_files(name) == partitions  # one file per partition
    assert store.committed_batch(name, "query") == 11
    write = store.append if name == "bronze_telemetry" else store.merge
    assert write(name, replayed_batch(name), "query", 11) is False  # a replayed batch is still recognised
    same_rows(spark, before, store.read(name))

    assert write(name, next_batch(name), "query", 12)  # the job goes on
    vacuumed = maintenance_pass(store, [name], AT_ONCE, retention=False, compact=False)
    assert next(u.count or 0 for u in vacuumed if u.operation == "vacuum") >= 12
    assert files_on_disk(store, name) == store.data_files(name)  # what was replaced is gone
    assert store.committed_batch(name, "query") == 12


def test_a_partition_is_compacted_once_it_holds_min_files_small_files(bronze):
    assert bronze.compact("bronze_telemetry", 16 << 20, min_files=13) == 0  # 12 files in each day
    assert bronze.compact("bronze_telemetry", 16 << 20, min_files=12) == 24
    assert bronze.compact("bronze_telemetry", 16 << 20, min_files=2) == 0  # one file a day is left


def test_a_retention_of_part_of_an_hour_is_kept_to_the_second(bronze):
    bronze.compact("bronze_telemetry", 16 << 20)
    assert bronze.append("bronze_telemetry", rows("bronze_telemetry", [bronze_row(1000)]), "query", 12)
    assert bronze.vacuum("bronze_telemetry", retention_hours=0.5) == 0  # replaced a moment ago: kept
    configuration = DeltaTable(bronze.location("bronze_telemetry")).metadata().configuration
    assert configuration["delta.deletedFileRetentionDuration"] == "interval 1800 seconds"
    time.sleep(2.5)
    assert bronze.vacuum("bronze_telemetry", retention_hours=2 / 3600) == 24


def test_vacuum_keeps_files_younger_than_the_retention(bronze):
    bronze.compact("bronze_telemetry", 16 << 20)
    assert bronze.vacuum("bronze_telemetry", retention_hours=1) == 0  # replaced a moment ago: kept
    assert files_on_disk(bronze, "bronze_telemetry") == 26
    assert bronze.read("bronze_telemetry").count() == 72
    assert bronze.append("bronze_telemetry", rows("bronze_telemetry", [bronze_row(1000)]), "query", 12)
    assert bronze.vacuum("bronze_telemetry", retention_hours=0) == 24


def test_a_file_no_commit_references_is_vacuumed(bronze):
    orphan = os.path.join(
        bronze.location("bronze_telemetry"), "ingest_date=2026-03-01", "part-orphan.parquet"
    )
    with open(orphan, "wb") as handle:  # what a write that died before its commit leaves behind
        handle.write(b"PAR1")
    assert bronze.vacuum("bronze_telemetry", retention_hours=0) == 1
    assert not os.path.exists(orphan)
    assert bronze.read("bronze_telemetry").count() == 72


def test_the_log_is_checkpointed_and_its_old_entries_deleted_keeping_the_markers(spark, bronze):
    before = bronze.read("bronze_telemetry").collect()
    assert bronze.set_properties("bronze_telemetry", {LOG_RETENTION: "interval 0 hours"})
    assert not bronze.set_properties("bronze_telemetry", {LOG_RETENTION: "interval 0 hours"})
    removed = bronze.tidy_log("bronze_telemetry")
    assert removed is not None and removed >= 12
    log = os.listdir(os.path.join(bronze.location("bronze_telemetry"), "_delta_log"))
    assert any(n.endswith(".checkpoint.parquet") for n in log)
    reopened = DeltaTable(bronze.location("bronze_telemetry"))
    assert reopened.transaction_version("query") == 11
    same_rows(spark, before, bronze.read("bronze_telemetry"))
    assert not bronze.append("bronze_telemetry", rows("bronze_telemetry", [bronze_row(0)]), "query", 5)
    assert bronze.append("bronze_telemetry", rows("bronze_telemetry", [bronze_row(999)]), "query", 12)
    assert bronze.read("bronze_telemetry").count() == 73


def test_retention_properties_are_set_on_the_table(bronze):
    policy = RetentionPolicy(retention_hours=72, log_retention_hours=24)
    done = maintenance_pass(bronze, ["bronze_telemetry"], policy, compact=False, vacuum=False)
    assert [(u.operation, u.count) for u in done] == [("retention", 1)]
    configuration = DeltaTable(bronze.location("bronze_telemetry")).metadata().configuration
    assert configuration["delta.deletedFileRetentionDuration"] == "interval 259200 seconds"  # 72 h
    assert configuration["delta.logRetentionDuration"] == "interval 86400 seconds"  # 24 h
    assert configuration["delta.enableChangeDataFeed"] == "true"  # the declared properties stay


def test_tidying_a_log_with_nothing_old_enough_reports_no_entry_deleted(bronze):
    """The checkpoint it writes is not a deleted entry: 0, where it reported -1."""
    assert bronze.tidy_log("bronze_telemetry") == 0  # the log retention (30 days by default) keeps all
    assert bronze.tidy_log("bronze_telemetry") == 0


def set_retention_at_once(root: str, name: str, policy: RetentionPolicy) -> list[Upkeep]:
    """Two stores of the table, each setting the policy's retention properties at the same moment."""
    start = threading.Barrier(2)
    done: list[Upkeep] = []

    def maintain() -> None:
        store = DeltaRsTableStore(None, root)
        store.ensure(name)
        start.wait()
        done.extend(maintenance_pass(store, [name], policy, compact=False, vacuum=False))

    threads = [threading.Thread(target=maintain) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return done


def test_two_maintainers_setting_the_retention_at_once_both_succeed(lake):
    """The job's scheduler and a `timestone tables maintain` cron: the one whose property commit lost
    ("Metadata changed since last commit") reloads and finds nothing left to set, where it FAILED."""
    policy = RetentionPolicy(retention_hours=72, log_retention_hours=24)
    for trial in range(8):
        name = "bronze_telemetry" if trial % 2 else "silver_telemetry"
        lake.ensure(name)
        lake.set_properties(name, {LOG_RETENTION: f"interval {trial} seconds"})
        assert [u.error for u in set_retention_at_once(lake.root, name, policy)] == [None, None]
        configuration = DeltaTable(lake.location(name)).metadata().configuration
        assert configuration[LOG_RETENTION] == "interval 86400 seconds"
