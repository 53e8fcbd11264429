"""The ``delta_cdf`` streaming source over real Delta tables written by the delta-rs store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from sinks.delta_rs import DeltaRsTableStore
from sinks.tables import DEFAULT_CATALOG
from sources.delta_cdf import DeltaCdfStreamReader, VersionRange, cdf_schema, read_changes, register
from sources.stream_api import ReadAllAvailable, ReadMaxFiles

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def execution(device_id: str, state: str, version: int) -> dict:
    return {
        "action_id": "a1",
        "device_id": device_id,
        "state": state,
        "version": version,
        "report_seq": 0,
        "queued_at": T0,
        "updated_at": T0 + timedelta(seconds=version),
    }


def executions(*rows: dict) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=DEFAULT_CATALOG["action_executions"].arrow_schema)


@pytest.fixture
def store(tmp_path) -> DeltaRsTableStore:
    store = DeltaRsTableStore(None, str(tmp_path / "lake"))
    store.ensure("action_executions")
    return store


class ChangeSink:
    """A foreachBatch sink remembering (batch id, row) pairs across runs of one query."""

    def __init__(self) -> None:
        self.batches: dict[int, list[tuple]] = {}

    def __call__(self, frame, batch_id: int) -> None:
        rows = frame.select("device_id", "state", "_change_type", "_commit_version").collect()
        self.batches[batch_id] = [tuple(r) for r in rows]

    @property
    def rows(self) -> list[tuple]:
        return [row for batch in self.batches.values() for row in batch]


def run_stream(
    spark, path: str, checkpoint: str, sink: ChangeSink, available_now: bool = True, **options: str
) -> None:
    """An availableNow run, or (``available_now=False``) a processing-time query stopped once it has read
    everything: its batches are bounded by ``maxVersionsPerTrigger`` on every supported Spark (an
    availableNow run is one batch on Spark 4.0 and 4.1)."""
    register(spark)
    reader = spark.readStream.format("delta_cdf").option("path", path)
    for key, value in options.items():
        reader = reader.option(key, value)
    writer = reader.load().writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
    if available_now:
        writer.trigger(availableNow=True).start().awaitTermination()
        return
    query = writer.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def test_the_schema_is_the_tables_columns_then_the_change_columns(spark, store):
    register(spark)
    frame = spark.readStream.format("delta_cdf").option("path", store.location("action_executions")).load()
    table_columns = DEFAULT_CATALOG["action_executions"].column_names
    assert frame.columns == [*table_columns, "_change_type", "_commit_version", "_commit_timestamp"]
    types = dict(frame.dtypes)
    assert (types["_change_type"], types["_commit_version"], types["_commit_timestamp"]) == (
        "string",
        "bigint",
        "timestamp",
    )
    assert types["state"] == "string" and types["version"] == "bigint"


def test_a_column_mapped_table_is_refused_when_the_query_is_made_saying_why(spark, tmp_path):
    """delta-rs reads no change feed of a column-mapped table: every batch failed with ChangesUnavailable,
    blaming retention ('a stream must not lag further behind'), and the query was restarted for ever."""
    path = str(tmp_path / "mapped")
    schema = pa.schema([("id", pa.string()), ("v", pa.int64())])
    properties = {"delta.columnMapping.mode": "name", "delta.enableChangeDataFeed": "true"}
    DeltaTable.create(path, schema, configuration=properties)
    register(spark)
    with pytest.raises(
        Exception, match=r"TableStoreError: delta_cdf: the table at .*mapped uses column mapping"
    ):
        spark.readStream.format("delta_cdf").option("path", path).load()


def test_every_insert_and_update_is_seen_exactly_once_across_two_runs(spark, store, tmp_path):
    path, checkpoint, sink = store.location("action_executions"), str(tmp_path / "cp"), ChangeSink()
    store.merge(
        "action_executions", executions(execution("d1", "QUEUED", 1), execution("d2", "QUEUED", 1)), "f", 0
    )

    run_stream(spark, path, checkpoint, sink, startingVersion="earliest")
    assert sorted(sink.rows) == [("d1", "QUEUED", "insert", 1), ("d2", "QUEUED", "insert", 1)]

    store.merge(
        "action_executions",
        executions(execution("d1", "IN_PROGRESS", 2), execution("d3", "QUEUED", 1)),
        "f",
        1,
    )
    store.merge("action_executions", executions(execution("d2", "FAILED", 2)), "f", 2)
    first_run_batches = set(sink.batches)
    run_stream(spark, path, checkpoint, sink, startingVersion="earliest")

    second_run = [
        row for batch, rows in sink.batches.items() if batch not in first_run_batches for row in rows
    ]
    assert sorted(second_run) == sorted(
        [
            ("d1", "QUEUED", "update_preimage", 2),
            ("d1", "IN_PROGRESS", "update_postimage", 2),
            ("d2", "QUEUED", "update_preimage", 3),
            ("d2", "FAILED", "update_postimage", 3),
            ("d3", "QUEUED", "insert", 2),
        ]
    )
    new_states = [(d, s) for d, s, change, _ in sink.rows if change in ("insert", "update_postimage")]
    assert len(new_states) == len(set(new_states)) == 5
    current = {(r["device_id"], r["state"]) for r in store.read_arrow("action_executions").to_pylist()}
    assert current <= set(new_states)


def test_by_default_the_stream_starts_after_the_version_current_at_its_first_run(spark, store, tmp_path):
    path, checkpoint, sink = store.location("action_executions"), str(tmp_path / "cp"), ChangeSink()
    store.merge("action_executions", executions(execution("d1", "QUEUED", 1)), "f", 0)
    run_stream(spark, path, checkpoint, sink)
    assert sink.rows == []
    store.merge("action_executions", executions(execution("d2", "QUEUED", 1)), "f", 1)
    run_stream(spark, path, checkpoint, sink)
    assert sink.rows == [("d2", "QUEUED", "insert", 2)]


def test_max_versions_per_trigger_bounds_each_micro_batch(spark, store, tmp_path):
    for batch, device in enumerate(["d1", "d2", "d3"]):
        store.merge("action_executions", executions(execution(device, "QUEUED", 1)), "f", batch)
    sink = ChangeSink()
    run_stream(
        spark,
        store.location("action_executions"),
        str(tmp_path / "cp"),
        sink,
        available_now=False,
        startingVersion="1",
        maxVersionsPerTrigger="2",
    )
    versions = {batch: sorted({row[3] for row in rows}) for batch, rows in sink.batches.items() if rows}
    assert sorted(versions.values()) == [[1, 2], [3]]


def test_a_partitioned_table_with_maps_and_binary_streams_with_its_types(spark, tmp_path):
    lake = DeltaRsTableStore(None, str(tmp_path / "lake"))
    spec = DEFAULT_CATALOG["bronze_telemetry"]
    row = {
        "broker": "b1",
        "topic": "devices/d1/telemetry",
        "offset": 7,
        "timestamp": T0,
        "qos": 1,
        "properties": [("k", "v")],
        "payload": b"\x00\xff",
        "ingest_date": T0.date(),
        "ingested_at": T0,
    }
    lake.append("bronze_telemetry", pa.Table.from_pylist([row], schema=spec.arrow_schema), "q", 0)
    register(spark)
    query = (
        spark.readStream.format("delta_cdf")
        .option("path", lake.location("bronze_telemetry"))
        .option("startingVersion", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("bronze_changes")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    (got,) = spark.table("bronze_changes").collect()
    assert (got.offset, got.payload, got.properties, got.ingest_date) == (
        7,
        bytearray(b"\x00\xff"),
        {"k": "v"},
        T0.date(),
    )
    assert got.timestamp == T0.replace(tzinfo=None), "session time zone is UTC"
    assert (got._change_type, got._commit_version) == ("insert", 1)


def test_read_changes_casts_delta_rs_types_and_orders_by_version(store):
    store.merge("action_executions", executions(execution("d1", "QUEUED", 1)), "f", 0)
    store.merge("action_executions", executions(execution("d1", "IN_PROGRESS", 2)), "f", 1)
    schema = pa.schema(
        [
            *DEFAULT_CATALOG["action_executions"].arrow_schema,
            pa.field("_change_type", pa.string(), False),
            pa.field("_commit_version", pa.int64(), False),
            pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC"), False),
        ]
    )
    changes = read_changes(store.location("action_executions"), 0, 2, schema)
    assert changes.schema == schema
    assert changes.column("_commit_version").to_pylist() == [1, 2, 2]
    assert changes.column("_change_type").to_pylist()[0] == "insert"


def test_offsets_and_partitions_are_version_ranges(store):
    path = store.location("action_executions")
    for batch in range(4):
        store.merge("action_executions", executions(execution("d1", "QUEUED", batch + 1)), "f", batch)
    assert cdf_schema(path).names[-3:] == ["_change_type", "_commit_version", "_commit_timestamp"]

    def reader(**options: str) -> DeltaCdfStreamReader:
        return DeltaCdfStreamReader(cdf_schema(path), {"path": path, **options})

    assert reader().initialOffset() == {"version": 5}
    assert reader(startingVersion="earliest").initialOffset() == {"version": 0}
    assert reader(startingVersion="3").initialOffset() == {"version": 3}
    with pytest.raises(ValueError, match="startingVersion must be"):
        reader(startingVersion="yesterday").initialOffset()

    limited = reader(maxVersionsPerTrigger="2", versionsPerPartition="1")
    assert limited.getDefaultReadLimit() == ReadMaxFiles(2)
    assert limited.latestOffset({"version": 1}, ReadMaxFiles(2)) == {"version": 3}
    assert limited.latestOffset({"version": 1}, ReadAllAvailable()) == {"version": 5}
    assert limited.latestOffset({"version": 5}, ReadMaxFiles(2)) == {"version": 5}, "nothing new: no batch"
    assert limited.partitions({"version": 1}, {"version": 3}) == [
        VersionRange(path, 1, 1),
        VersionRange(path, 2, 2),
    ]
    assert reader(versionsPerPartition="3").partitions({"version": 0}, {"version": 5}) == [
        VersionRange(path, 0, 2),
        VersionRange(path, 3, 4),
    ]

    # Spark 4.0 and 4.1 pass no start or limit: the reader starts where it began, then where it stopped
    older_spark = reader(startingVersion="1", maxVersionsPerTrigger="2")
    assert older_spark.latestOffset() == {"version": 3}
    assert older_spark.latestOffset() == {"version": 5}
    assert older_spark.latestOffset() == {"version": 5}, "nothing new: no batch"
    restarted = reader(startingVersion="1", maxVersionsPerTrigger="2")
    assert restarted.partitions({"version": 1}, {"version": 3})  # a restart replays its last batch first
    assert restarted.latestOffset() == {"version": 5}

    available_now = reader()
    available_now.prepareForTriggerAvailableNow()
    store.merge("action_executions", executions(execution("d1", "IN_PROGRESS", 9)), "f", 9)
    assert available_now.latestOffset({"version": 0}, ReadAllAvailable()) == {"version": 5}, (
        "later commits wait"
    )


CDF_SCHEMA = pa.schema(
    [
        *DEFAULT_CATALOG["action_executions"].arrow_schema,
        pa.field("_change_type", pa.string(), False),
        pa.field("_commit_version", pa.int64(), False),
        pa.field("_commit_timestamp", pa.timestamp("us", tz="UTC"), False),
    ]
)


def test_a_stream_lagging_behind_a_vacuum_fails_naming_the_table_and_the_retention(spark, store, tmp_path):
    """Versions whose files a vacuum deleted: the query fails saying which table, which versions and which
    retention setting, where it failed with an Arrow 'Object at location ... not found'."""
    for batch in range(3):
        store.merge("action_executions", executions(execution("d1", "QUEUED", batch + 1)), "f", batch)
    store.vacuum("action_executions", 0)  # the files the merges replaced, at once
    path = store.location("action_executions")
    with pytest.raises(Exception, match=r"delta\.deletedFileRetentionDuration") as failure:
        run_stream(spark, path, str(tmp_path / "checkpoint"), ChangeSink(), startingVersion="earliest")
    assert path in str(failure.value) and "retention_hours" in str(failure.value)


def test_versions_whose_log_was_cleaned_up_fail_naming_the_table_and_the_log_retention(store):
    for batch in range(3):
        store.merge("action_executions", executions(execution("d1", "QUEUED", batch + 1)), "f", batch)
    store.set_properties("action_executions", {"delta.logRetentionDuration": "interval 0 seconds"})
    assert store.tidy_log("action_executions")
    path = store.location("action_executions")
    with pytest.raises(ValueError, match=r"versions 0\.\.3 .*delta\.logRetentionDuration") as failure:
        read_changes(path, 0, 3, CDF_SCHEMA)
    assert path in str(failure.value) and "log_retention_hours" in str(failure.value)
