"""Tables the jobs write that another tool made first (delta-rs here) with rules for their writers: a Spark
batch appended by the store keeps them, evaluated by Spark in the tasks that write its files (the rows never
reach the driver), as delta-rs's own writer keeps them."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from sinks.arrow_conform import SchemaMismatch
from sinks.delta_rs import AppendReport, DeltaRsTableStore
from sinks.store import TableStoreError
from sinks.tables import DEFAULT_CATALOG
from tests.e2e.sinks.conftest import T0, bronze_row, spark_rows

pytestmark = pytest.mark.spark


def made_by_hand(lake: DeltaRsTableStore, schema: pa.Schema) -> str:
    path = lake.location("bronze_telemetry")
    DeltaTable.create(path, schema, partition_by=list(DEFAULT_CATALOG["bronze_telemetry"].partition_by))
    return path


def appends(lake: DeltaRsTableStore) -> list[AppendReport]:
    reports: list[AppendReport] = []
    lake.on_append = reports.append
    return reports


def test_a_check_constraint_of_a_table_made_by_hand_is_kept_by_a_spark_batch(spark, lake) -> None:
    """The tasks' files were committed whatever the constraint said: rows breaking it landed. A null the
    expression cannot judge passes, as in delta-rs."""
    path = made_by_hand(lake, DEFAULT_CATALOG["bronze_telemetry"].arrow_schema)
    DeltaTable(path).alter.add_constraint({"offset_small": "offset < 3"})
    reports = appends(lake)
    breaking = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(6)])
    with pytest.raises(Exception, match=r"rows failed validation check of its CHECK constraint offset_small"):
        lake.append("bronze_telemetry", breaking, "q", 0)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0
    keeping = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(3)])
    assert lake.append("bronze_telemetry", keeping, "q", 1) is True
    assert sorted(DeltaTable(path).to_pyarrow_table().column("offset").to_pylist()) == [0, 1, 2]
    assert [(r.on_executors, r.rows) for r in reports] == [(True, 3)], "written by the tasks"


def test_an_invariant_of_a_table_made_by_hand_is_kept_by_a_spark_batch(spark, lake) -> None:
    schema = DEFAULT_CATALOG["bronze_telemetry"].arrow_schema
    index = schema.get_field_index("offset")
    invariant = {"delta.invariants": json.dumps({"expression": {"expression": "offset >= 2"}})}
    path = made_by_hand(lake, schema.set(index, schema.field(index).with_metadata(invariant)))
    rows = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(4)])
    with pytest.raises(Exception, match=r"2 rows failed validation check of its invariant of offset"):
        lake.append("bronze_telemetry", rows, "q", 0)
    assert DeltaTable(path).to_pyarrow_table().num_rows == 0


def test_a_generated_column_of_a_table_made_by_hand_is_computed_for_a_spark_batch(spark, lake) -> None:
    """The tasks wrote the column the job does not know as nulls."""
    generated = pa.field("next_offset", pa.int64(), metadata={"delta.generationExpression": "offset + 1"})
    path = made_by_hand(lake, DEFAULT_CATALOG["bronze_telemetry"].arrow_schema.append(generated))
    reports = appends(lake)
    rows = spark_rows(spark, "bronze_telemetry", [bronze_row(offset) for offset in range(3)])
    assert lake.append("bronze_telemetry", rows, "q", 0) is True
    stored = DeltaTable(path).to_pyarrow_table().sort_by("offset")
    assert stored.column("next_offset").to_pylist() == [1, 2, 3]
    assert [(r.on_executors, r.rows) for r in reports] == [(True, 3)]


def test_a_table_made_with_column_mapping_is_refused_naming_it_and_written_nothing(spark, lake) -> None:
    """delta-rs wrote the job's rows under physical column names that its own reads took for nulls (a
    NOT NULL device_id read back as null), and the tasks' files under logical ones that a column-mapping
    reader takes for nulls: the data was wrong, silently. The store now refuses the table."""
    spec = DEFAULT_CATALOG["devices"]
    path = lake.location("devices")
    DeltaTable.create(path, spec.arrow_schema, configuration={"delta.columnMapping.mode": "name"})
    row = {"device_id": "d1", "broker": "b1", "group": "g", "tags": [("site", "s1")]}
    rows = pa.Table.from_pylist([row], schema=spec.arrow_schema)
    refusal = r"devices: .*column mapping \(delta\.columnMapping\.mode=name\)"
    with pytest.raises(TableStoreError, match=refusal):
        lake.merge("devices", rows, "q", 0)
    with pytest.raises(TableStoreError, match=refusal):
        lake.append("devices", spark.createDataFrame(rows), "q", 1)
    assert DeltaTable(path).version() == 0, "nothing committed"


@pytest.mark.parametrize("name", ["bronze_telemetry", "telemetry_quarantine"])
def test_a_table_asking_its_writers_for_features_the_store_lacks_is_refused_at_once(
    spark, lake, name
) -> None:
    """Spark made the table with an identity column (writer feature identityColumns): the job's first write
    (bronze: setting its change feed property; quarantine: the tasks' files' commit) failed with delta-rs'
    'Unsupported table features required' taken for a lost commit race, retried 12 times, and ended as a
    CommitFailedError naming no table, which the job restarted for ever."""
    spec = DEFAULT_CATALOG[name]
    path = lake.location(name)
    schema = json.loads(spec.schema.json())
    identity = {
        "delta.identity.start": 1,
        "delta.identity.step": 1,
        "delta.identity.allowExplicitInsert": False,
    }
    schema["fields"].append({"name": "row_id", "type": "long", "nullable": True, "metadata": identity})
    protocol = {"minReaderVersion": 1, "minWriterVersion": 7, "writerFeatures": ["identityColumns"]}
    write_log(path, protocol, schema, list(spec.partition_by))
    if name == "bronze_telemetry":
        rows = spark_rows(spark, name, [bronze_row(offset) for offset in range(3)])
    else:
        quarantined = {"reason": "unparseable_payload", "quarantine_date": T0.date(), "quarantined_at": T0}
        rows = spark_rows(spark, name, [{"broker": "b1", "topic": "t", "offset": 1, **quarantined}])
    with pytest.raises(TableStoreError, match=rf"{name}: .*asks its writers for features .*IdentityColumns"):
        lake.append(name, rows, "q", 0)
    assert DeltaTable(path).version() == 0
    assert not list(Path(path).rglob("*.parquet")), "the tasks' files were removed"


def write_log(path: str, protocol: dict, schema: dict, partition_by: list[str]) -> None:
    """A table's first commit as another engine (Spark with Delta) writes it."""
    log_dir = Path(path) / "_delta_log"
    log_dir.mkdir(parents=True)
    metadata = {
        "id": str(uuid.uuid4()),
        "format": {"provider": "parquet", "options": {}},
        "schemaString": json.dumps(schema),
        "partitionColumns": partition_by,
        "configuration": {},
        "createdTime": 1_700_000_000_000,
    }
    info = {"timestamp": 1_700_000_000_000, "operation": "CREATE TABLE", "engineInfo": "Apache-Spark/3.5.0"}
    actions = [{"commitInfo": info}, {"protocol": protocol}, {"metaData": metadata}]
    (log_dir / "00000000000000000000.json").write_text("".join(json.dumps(a) + "\n" for a in actions))


def test_an_append_only_table_the_job_merges_into_is_refused_naming_it(lake) -> None:
    """devices made with delta.appendOnly=true: the first merge inserted, the next one's update failed with
    delta-rs' CommitFailedError taken for a lost race, retried 12 times and naming no table."""
    spec = DEFAULT_CATALOG["devices"]
    path = lake.location("devices")
    DeltaTable.create(path, spec.arrow_schema, configuration={"delta.appendOnly": "true"})
    row = {"device_id": "d1", "broker": "b1", "group": "g", "last_seen": T0}
    assert lake.merge("devices", pa.Table.from_pylist([row], schema=spec.arrow_schema), "q", 0) is True
    seen_again = {**row, "last_seen": T0.replace(minute=1)}
    with pytest.raises(TableStoreError, match=r"devices: .*append-only \(delta\.appendOnly=true\)"):
        lake.merge("devices", pa.Table.from_pylist([seen_again], schema=spec.arrow_schema), "q", 1)
    assert DeltaTable(path).version() == 1


def test_a_column_named_in_other_letters_is_refused_naming_both(lake) -> None:
    """Spark SQL made devices with a column Group: ensure() added the declared group beside it, which
    delta-rs refused with 'Duplicate field name (case-insensitive)', naming no table."""
    spec = DEFAULT_CATALOG["devices"]
    schema = pa.schema([f.with_name("Group") if f.name == "group" else f for f in spec.arrow_schema])
    DeltaTable.create(lake.location("devices"), schema)
    with pytest.raises(SchemaMismatch, match=r"devices\.group: the table has it as 'Group'"):
        lake.ensure("devices")


def test_a_column_mapped_table_spark_wrote_is_not_read_as_nulls(lake) -> None:
    """Databricks writes a column-mapped table's files under physical names ('col-...', with field ids);
    delta-rs read every value of them as null, and read_arrow returned those nulls as the table's rows."""
    path = Path(lake.location("devices"))
    mapped = {name: f"col-{name}-0f3a" for name in ("device_id", "broker")}
    fields = [
        {"name": name, "type": "string", "nullable": True, "metadata": mapping_of(index, physical)}
        for index, (name, physical) in enumerate(mapped.items(), start=1)
    ]
    file_schema = pa.schema(
        pa.field(physical, pa.string(), metadata={b"PARQUET:field_id": str(index).encode()})
        for index, physical in enumerate(mapped.values(), start=1)
    )
    write_log(
        str(path), {"minReaderVersion": 2, "minWriterVersion": 5}, {"type": "struct", "fields": fields}, []
    )
    pq.write_table(pa.table([["d1"], ["b1"]], schema=file_schema), path / "part-0.parquet")
    log = path / "_delta_log" / "00000000000000000000.json"
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    lines[2]["metaData"]["configuration"] = {"delta.columnMapping.mode": "name"}
    size = (path / "part-0.parquet").stat().st_size
    add = {
        "path": "part-0.parquet",
        "partitionValues": {},
        "size": size,
        "modificationTime": 0,
        "dataChange": True,
    }
    log.write_text("".join(json.dumps(line) + "\n" for line in [*lines, {"add": add}]))
    assert DeltaTable(str(path)).to_pyarrow_table().column("device_id").to_pylist() == [None], (
        "delta-rs' read"
    )
    with pytest.raises(
        TableStoreError, match=r"devices: uses column mapping \(delta\.columnMapping\.mode=name\)"
    ):
        lake.read_arrow("devices")
    with pytest.raises(TableStoreError, match=r"devices: uses column mapping"):
        list(lake.scan_arrow("devices"))


def mapping_of(index: int, physical: str) -> dict:
    return {"delta.columnMapping.id": index, "delta.columnMapping.physicalName": physical}


def test_a_directory_of_another_tools_files_is_not_made_a_table_whose_vacuum_deletes_them(lake) -> None:
    """A table's directory holding Parquet files another tool wrote, but no Delta log: ensure() made an empty
    Delta table over them, and its vacuum (a maintenance pass past the retention, or ``timestone tables
    maintain --retention-hours 0``) deleted them, as files no commit references. It is refused, naming the
    directory, and the files are left as they were; an empty directory becomes the table."""
    path = Path(lake.location("devices"))
    path.mkdir(parents=True)
    pq.write_table(pa.table({"device_id": ["d1"], "note": ["kept"]}), path / "part-0.parquet")
    with pytest.raises(TableStoreError, match=r"^devices: .*/devices holds files but no Delta table"):
        lake.ensure("devices")
    assert sorted(entry.name for entry in path.iterdir()) == ["part-0.parquet"]
    empty = Path(lake.location("dq_results"))
    empty.mkdir()
    lake.ensure("dq_results")
    assert DeltaTable(str(empty)).version() == 0
