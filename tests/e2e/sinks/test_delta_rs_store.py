"""The embedded delta-rs store against real Delta tables on disk, read back through the shared session."""

from __future__ import annotations

import subprocess
import sys
from datetime import date

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from chispa import assert_df_equality
from deltalake import DeltaTable, write_deltalake
from pyspark.sql.types import StringType, StructField

from sinks.arrow_conform import SchemaMismatch, with_offsets
from sinks.delta_rs import DeltaRsTableStore
from sinks.store import TableStoreError
from sinks.tables import DEFAULT_CATALOG, build_catalog
from tests.e2e.sinks.conftest import arrow_rows, bronze_row, execution_row, expected, spark_rows


def test_ensure_creates_the_declared_table_once(lake):
    lake.ensure("bronze_telemetry")
    table = DeltaTable(lake.location("bronze_telemetry"))
    metadata = table.metadata()
    assert metadata.partition_columns == ["ingest_date"]
    assert metadata.configuration["delta.enableChangeDataFeed"] == "true"
    assert metadata.name == "bronze_telemetry"
    assert pa.schema(table.schema().to_arrow()).names == DEFAULT_CATALOG["bronze_telemetry"].column_names
    lake.ensure("bronze_telemetry")
    assert lake.version("bronze_telemetry") == 0


def test_an_empty_table_reads_as_an_empty_frame_with_the_schema(lake):
    lake.ensure("devices")
    frame = lake.read("devices")
    assert frame.count() == 0
    assert frame.schema == DEFAULT_CATALOG["devices"].read_schema
    assert lake.read_arrow("devices").schema.names == DEFAULT_CATALOG["devices"].column_names


def test_a_spark_batch_appends_and_reads_back_equal(spark, lake):
    rows = [bronze_row(offset, day=1 + offset % 2) for offset in range(6)]
    assert lake.append("bronze_telemetry", spark_rows(spark, "bronze_telemetry", rows), "q", 0) is True
    assert_df_equality(
        lake.read("bronze_telemetry").orderBy("offset"),
        expected(spark, "bronze_telemetry", rows).orderBy("offset"),
    )


def test_a_spark_batch_of_rows_without_properties_appends_to_its_partitions(spark, lake):
    """pyspark 4.0 hands over the empty maps without their keys' and values' offsets; delta-rs, splitting
    the rows by partition, panicked on them (the Arrow is rebuilt before the write, sinks.arrow_conform)."""
    rows = [{**bronze_row(offset, day=1 + offset % 2), "properties": []} for offset in range(6)]
    batch = spark_rows(spark, "bronze_telemetry", rows).repartition(3)
    assert lake.append("bronze_telemetry", batch, "q", 0) is True
    stored = lake.read_arrow("bronze_telemetry").sort_by("offset")
    assert stored.column("offset").to_pylist() == list(range(6))
    assert stored.column("properties").to_pylist() == [[]] * 6


def test_arrays_without_offsets_are_rebuilt_and_no_other(lake):
    def without_offsets() -> pa.Array:
        return pa.Array.from_buffers(pa.string(), 0, [None, pa.py_buffer(b""), pa.py_buffer(b"")])

    kind = pa.map_(pa.field("key", pa.string(), nullable=False), pa.field("value", pa.string()))
    empty_maps = pa.MapArray.from_arrays(
        pa.array([0, 0, 0], pa.int32()), without_offsets(), without_offsets(), type=kind
    )
    assert empty_maps.buffers()[4].size == 0  # the keys' offsets: none, where one is due
    rebuilt = with_offsets(pa.chunked_array([empty_maps, empty_maps]))
    assert [chunk.buffers()[4].size for chunk in rebuilt.chunks] == [4, 4]
    assert rebuilt.to_pylist() == [[]] * 4
    whole = pa.chunked_array([pa.array(["a", None, "bc"])])
    assert with_offsets(whole) is whole


def test_replaying_an_append_batch_writes_nothing(spark, lake):
    batch = spark_rows(spark, "bronze_telemetry", [bronze_row(0), bronze_row(1)])
    assert lake.append("bronze_telemetry", batch, "q", 7) is True
    version = lake.version("bronze_telemetry")
    assert lake.append("bronze_telemetry", batch, "q", 7) is False
    assert lake.append("bronze_telemetry", batch, "q", 3) is False, "an older batch id is also a replay"
    assert lake.version("bronze_telemetry") == version
    assert lake.read("bronze_telemetry").count() == 2
    assert lake.committed_batch("bronze_telemetry", "q") == 7
    assert lake.append("bronze_telemetry", arrow_rows("bronze_telemetry", [bronze_row(2)]), "q", 8) is True
    assert lake.append("bronze_telemetry", batch, "other-query", 7) is True, "batch ids are per app id"
    assert lake.read("bronze_telemetry").count() == 5


def test_bronze_is_partitioned_by_ingest_date_on_disk(lake, tmp_path):
    rows = [bronze_row(0, day=1), bronze_row(1, day=1), bronze_row(2, day=2)]
    lake.append("bronze_telemetry", arrow_rows("bronze_telemetry", rows), "q", 0)
    root = tmp_path / "lake" / "bronze_telemetry"
    partitions = sorted(p.name for p in root.iterdir() if p.is_dir() and p.name != "_delta_log")
    assert partitions == ["ingest_date=2026-03-01", "ingest_date=2026-03-02"]
    day_two = list((root / "ingest_date=2026-03-02").glob("*.parquet"))
    assert len(day_two) == 1
    stored = pq.ParquetFile(day_two[0]).read()  # the file alone: no partition read from its path
    assert "ingest_date" not in stored.column_names, "partition values live in the path, not the file"
    assert stored.column("offset").to_pylist() == [2]


def test_merge_upserts_and_a_replayed_merge_writes_nothing(spark, lake):
    first = [execution_row("d1", "QUEUED", 1), execution_row("d2", "QUEUED", 1)]
    assert lake.merge("action_executions", spark_rows(spark, "action_executions", first), "fanout", 0)
    second = spark_rows(
        spark, "action_executions", [execution_row("d1", "IN_PROGRESS", 2), execution_row("d3", "QUEUED", 1)]
    )
    assert lake.merge("action_executions", second, "fanout", 1) is True
    version = lake.version("action_executions")
    assert lake.merge("action_executions", second, "fanout", 1) is False
    assert lake.version("action_executions") == version
    want = [
        execution_row("d1", "IN_PROGRESS", 2),
        execution_row("d2", "QUEUED", 1),
        execution_row("d3", "QUEUED", 1),
    ]
    assert_df_equality(
        lake.read("action_executions").orderBy("device_id"),
        expected(spark, "action_executions", want).orderBy("device_id"),
    )


def test_merge_with_a_version_predicate_never_moves_a_row_backwards(lake):
    newer = "s.version > t.version"
    lake.merge(
        "action_executions", arrow_rows("action_executions", [execution_row("d1", "QUEUED", 1)]), "a", 0
    )
    lake.merge(
        "action_executions", arrow_rows("action_executions", [execution_row("d1", "SUCCEEDED", 4)]), "b", 0
    )
    late = [execution_row("d1", "IN_PROGRESS", 3), execution_row("d2", "QUEUED", 1)]
    assert lake.merge("action_executions", arrow_rows("action_executions", late), "a", 1, update_when=newer)
    rows = {r["device_id"]: r for r in lake.read_arrow("action_executions").to_pylist()}
    assert (rows["d1"]["state"], rows["d1"]["version"]) == ("SUCCEEDED", 4)
    assert (rows["d2"]["state"], rows["d2"]["version"]) == ("QUEUED", 1), "unmatched rows are still inserted"
    equal = [execution_row("d1", "FAILED", 4)]
    lake.merge("action_executions", arrow_rows("action_executions", equal), "a", 2, update_when=newer)
    assert {r["device_id"]: r["state"] for r in lake.read_arrow("action_executions").to_pylist()}[
        "d1"
    ] == "SUCCEEDED"


def test_merge_delete_insert_only_and_column_updates(lake):
    start = [execution_row("d1", "QUEUED", 1), execution_row("d2", "QUEUED", 1)]
    lake.merge("action_executions", arrow_rows("action_executions", start), "a", 0)
    change = [
        execution_row("d1", "CANCELED", 2),
        execution_row("d2", "IN_PROGRESS", 2),
        execution_row("d3", "QUEUED", 1),
    ]
    lake.merge(
        "action_executions",
        arrow_rows("action_executions", change),
        "a",
        1,
        delete_when="s.state = 'CANCELED'",
        insert_when="s.state <> 'QUEUED'",
    )
    rows = {r["device_id"]: r["state"] for r in lake.read_arrow("action_executions").to_pylist()}
    assert rows == {"d2": "IN_PROGRESS"}

    lake.merge(
        "action_executions",
        arrow_rows("action_executions", [execution_row("d2", "FAILED", 3)]),
        "a",
        2,
        update=False,
    )
    assert lake.read_arrow("action_executions").column("state").to_pylist() == ["IN_PROGRESS"], (
        "insert-only merge"
    )

    patch = execution_row("d2", "FAILED", 3) | {"status_details": None}
    lake.merge(
        "action_executions",
        arrow_rows("action_executions", [patch]),
        "a",
        3,
        update_set={
            "state": "s.state",
            "version": "s.version",
            "status_details": "coalesce(s.status_details, t.status_details)",
        },
    )
    (row,) = lake.read_arrow("action_executions").to_pylist()
    assert (row["state"], row["version"], row["status_details"]) == ("FAILED", 3, "IN_PROGRESS v2")


def test_devices_merge_keeps_stored_attributes_the_batch_lacks(lake):
    def device(group, firmware):
        return {"device_id": "d1", "group": group, "firmware_version": firmware, "tags": [("site", "x")]}

    lake.merge("devices", arrow_rows("devices", [device("north", "1.0")]), "a", 0)
    keep = {c: f"coalesce(s.`{c}`, t.`{c}`)" for c in ("group", "firmware_version")}
    lake.merge("devices", arrow_rows("devices", [device(None, "1.1")]), "a", 1, update_set=keep)
    (row,) = lake.read_arrow("devices").to_pylist()
    assert (row["group"], row["firmware_version"], row["tags"]) == ("north", "1.1", [("site", "x")])


def test_read_returns_only_the_live_files_after_merge_and_overwrite(spark, lake):
    lake.merge(
        "action_executions", arrow_rows("action_executions", [execution_row("d1", "QUEUED", 1)]), "a", 0
    )
    lake.merge(
        "action_executions", arrow_rows("action_executions", [execution_row("d1", "IN_PROGRESS", 2)]), "a", 1
    )
    directory = lake.location("action_executions")
    assert spark.read.parquet(directory).count() == 2, "the directory still holds the file the merge replaced"
    assert [r.state for r in lake.read("action_executions").collect()] == ["IN_PROGRESS"]

    write_deltalake(
        directory, arrow_rows("action_executions", [execution_row("d9", "QUEUED", 1)]), mode="overwrite"
    )
    assert spark.read.parquet(directory).count() == 3
    assert [r.device_id for r in lake.read("action_executions").collect()] == ["d9"]


def test_change_data_feed_arrow_is_accepted_as_input(lake):
    """CDF output (string_view columns, extra change columns) goes back in once the extras are dropped."""
    lake.merge(
        "action_executions", arrow_rows("action_executions", [execution_row("d1", "QUEUED", 1)]), "a", 0
    )
    changes = pa.table(DeltaTable(lake.location("action_executions")).load_cdf(0))
    assert pa.types.is_string_view(changes.schema.field("device_id").type)
    changes = changes.drop_columns(["_change_type", "_commit_version", "_commit_timestamp"])
    target = DeltaRsTableStore(None, lake.root + "_copy")
    assert target.append("action_executions", changes, "copy", 0)
    assert target.read_arrow("action_executions").equals(lake.read_arrow("action_executions"))


def test_mismatched_data_is_refused_naming_the_column(lake):
    bad = arrow_rows("bronze_telemetry", [bronze_row(0)]).append_column("offest", pa.array([1]))
    with pytest.raises(SchemaMismatch, match=r"bronze_telemetry: columns not in the table: \['offest'\]"):
        lake.append("bronze_telemetry", bad, "q", 0)
    keyless = pa.table({"device_id": pa.array([None], pa.string())})
    with pytest.raises(SchemaMismatch, match=r"devices\.device_id: 1 null value"):
        lake.merge("devices", keyless, "q", 0)
    with pytest.raises(SchemaMismatch, match=r"action_executions\.state: column missing"):
        lake.append("action_executions", pa.table({"action_id": ["a"], "device_id": ["d"]}), "q", 0)
    assert lake.version("bronze_telemetry") == 0


def test_missing_nullable_columns_are_written_as_nulls(lake):
    lake.append("devices", pa.table({"device_id": ["d1"], "broker": ["b1"]}), "q", 0)
    (row,) = lake.read_arrow("devices").to_pylist()
    assert row["broker"] == "b1" and row["tags"] is None and row["group"] is None


def test_ensure_adds_configured_columns_to_an_existing_table(spark, tmp_path):
    root = str(tmp_path / "lake")
    old = DeltaRsTableStore(spark, root)
    old.append("silver_telemetry", pa.table(_silver_row() | {"humidity": [40.0]}), "q", 0)
    wider = build_catalog({"temperature": "double", "co2": "int"})
    new = DeltaRsTableStore(spark, root, wider)
    new.ensure("silver_telemetry")
    new.append("silver_telemetry", pa.table(_silver_row(offset=1) | {"co2": [415]}), "q", 1)
    rows = {r.offset: r for r in new.read("silver_telemetry").collect()}
    assert rows[0].co2 is None and rows[1].co2 == 415
    # a table is read as written: a column the new catalog no longer declares is read with its data
    assert rows[0].humidity == 40.0 and rows[1].humidity is None
    assert new.read_arrow("silver_telemetry").sort_by("offset").column("humidity").to_pylist() == [40.0, None]
    assert "co2" in old.read("silver_telemetry").columns  # and a store of the old catalog reads the new one


def test_a_store_reads_a_table_in_the_tables_schema_not_its_catalogs(spark, tmp_path):
    """Silver written with the pipeline's payload, read through a store opened with another catalog: the
    columns and data are the table's, none made up as nulls and none left out."""
    root = str(tmp_path / "lake")
    writer = DeltaRsTableStore(spark, root, build_catalog({"temperature": "double", "battery": "double"}))
    writer.append("silver_telemetry", pa.table(_silver_row() | {"battery": [87.5]}), "q", 0)
    reader = DeltaRsTableStore(spark, root, build_catalog({"temperature": "double", "battery_pct": "double"}))
    arrow = reader.read_arrow("silver_telemetry")
    assert arrow.column_names[-2:] == ["temperature", "battery"] and "battery_pct" not in arrow.column_names
    assert arrow.column("battery").to_pylist() == [87.5]
    row = reader.read("silver_telemetry").select("battery").first()
    assert row is not None and row[0] == 87.5


def test_a_column_whose_type_changed_is_refused(spark, tmp_path):
    root = str(tmp_path / "lake")
    DeltaRsTableStore(spark, root).ensure("silver_telemetry")
    retyped = DEFAULT_CATALOG["silver_telemetry"].schema
    catalog = DEFAULT_CATALOG.replace(
        DEFAULT_CATALOG["silver_telemetry"].__class__(
            name="silver_telemetry",
            schema=retyped.__class__(
                [
                    StructField(f.name, StringType(), f.nullable) if f.name == "temperature" else f
                    for f in retyped
                ]
            ),
            description="",
            partition_by=("event_date",),
            merge_keys=("broker", "topic", "offset"),
        )
    )
    with pytest.raises(
        SchemaMismatch, match=r"silver_telemetry\.temperature: table has double, spec says string"
    ):
        DeltaRsTableStore(spark, root, catalog).ensure("silver_telemetry")


def test_reading_a_table_that_does_not_exist_says_where_it_looked(lake):
    with pytest.raises(TableStoreError, match=r"dq_results: no Delta table at .*/lake/dq_results"):
        lake.read("dq_results")


def test_batch_keys_are_validated(lake):
    with pytest.raises(ValueError, match="app_id"):
        lake.append("devices", pa.table({"device_id": ["d"]}), "", 0)
    with pytest.raises(ValueError, match="batch_id"):
        lake.append("devices", pa.table({"device_id": ["d"]}), "q", -1)


def _silver_row(offset: int = 0) -> dict:
    from tests.e2e.sinks.conftest import T0

    return {
        "device_id": ["d1"],
        "event_time": [T0],
        "event_date": [date(2026, 3, 1)],
        "topic": ["devices/d1/telemetry"],
        "broker": ["b1"],
        "offset": [offset],
        "ingested_at": [T0],
        "temperature": [21.5],
    }


def test_a_table_root_with_a_space_reads_back(spark, tmp_path):
    lake = DeltaRsTableStore(spark, str(tmp_path / "my lake"))
    rows = [bronze_row(offset) for offset in range(3)]
    assert lake.append("bronze_telemetry", spark_rows(spark, "bronze_telemetry", rows), "q", 0) is True
    assert lake.read("bronze_telemetry").count() == 3


def test_read_arrow_returns_the_snapshot_with_partition_values_and_only_live_files(tmp_path):
    """Arrow reads of a local table (its files read by Arrow, not through delta-rs' file handler) return
    what delta-rs' own read returns: partition values from the directories, the rows a merge replaced gone,
    under a root whose name needs escaping."""
    lake = DeltaRsTableStore(None, str(tmp_path / "a lake%"))
    rows = [bronze_row(0, day=1), bronze_row(1, day=1), bronze_row(2, day=2)]
    lake.append("bronze_telemetry", arrow_rows("bronze_telemetry", rows), "q", 0)
    got = lake.read_arrow("bronze_telemetry").sort_by("offset")
    assert got.column("ingest_date").to_pylist() == [date(2026, 3, 1), date(2026, 3, 1), date(2026, 3, 2)]
    own = pa.table(DeltaTable(lake.location("bronze_telemetry")).to_pyarrow_table())
    assert got.select(own.column_names).cast(own.schema).equals(own.sort_by("offset"))

    for state, version in (("QUEUED", 1), ("IN_PROGRESS", 2)):
        lake.merge(
            "action_executions",
            arrow_rows("action_executions", [execution_row("d1", state, version)]),
            "a",
            version,
        )
    assert lake.read_arrow("action_executions").column("state").to_pylist() == ["IN_PROGRESS"]
    lake.ensure("devices")
    empty = lake.read_arrow("devices")  # no file yet: no rows, the declared schema
    assert (empty.num_rows, empty.schema.names) == (0, DEFAULT_CATALOG["devices"].column_names)


def test_a_process_that_read_a_table_as_arrow_exits_cleanly(tmp_path):
    """`timestone ota status` reads the summaries as Arrow and exits: 20 such processes in a row all exit 0
    (after delta-rs' own Arrow read, some aborted at exit)."""
    lake = DeltaRsTableStore(None, str(tmp_path / "lake"))
    lake.append("bronze_telemetry", arrow_rows("bronze_telemetry", [bronze_row(0)]), "q", 0)
    script = (
        "import sys; from sinks.delta_rs import DeltaRsTableStore; "
        "print(DeltaRsTableStore(None, sys.argv[1]).read_arrow('bronze_telemetry').num_rows)"
    )
    for _ in range(20):
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "lake")], capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stdout.strip()) == (0, "1"), done.stderr[-500:]


@pytest.mark.parametrize("folder", ["my lake é", "pct%20lake"])
def test_a_root_with_spaces_and_unicode_works_and_one_with_a_url_escape_is_refused(spark, tmp_path, folder):
    """delta-rs reads '%20' in a local path as a URL escape ('pct%20lake' becomes 'pct lake') and fails
    on its own log; such a root is refused at once, naming it. Spaces and unicode are maintained as usual."""
    root = str(tmp_path / folder)
    if "%" in folder:
        with pytest.raises(ValueError, match=r"table root .*pct%20lake.* '%' and two hex digits"):
            DeltaRsTableStore(spark, root)
        with pytest.raises(ValueError, match="table root"):
            DeltaRsTableStore(spark, "file://" + str(tmp_path / "100%2525 lake"))
        return
    store = DeltaRsTableStore(spark, root)
    for batch in range(3):
        data = arrow_rows("bronze_telemetry", [bronze_row(batch * 2 + i, day=1 + i) for i in range(2)])
        assert store.append("bronze_telemetry", data, "q", batch)
    spark_batch = spark_rows(spark, "bronze_telemetry", [bronze_row(100 + i, day=1 + i) for i in range(2)])
    assert store.append("bronze_telemetry", spark_batch, "q", 3)
    assert store.compact("bronze_telemetry", 16 << 20, 2) == 8
    assert store.vacuum("bronze_telemetry", 0) == 8
    assert store.tidy_log("bronze_telemetry") is not None
    assert store.read("bronze_telemetry").count() == 8
    assert store.read_arrow("bronze_telemetry").num_rows == 8
