"""docs/tables.md lists exactly the declared columns, types, nullability and partitioning of every table."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sinks.tables import DEFAULT_CATALOG

DOC = Path(__file__).resolve().parents[3] / "docs" / "tables.md"
ROW = re.compile(r"^\| `([^`]+)` \| `([^`]+)` \| (yes|no) \|")


def documented_tables() -> dict[str, str]:
    """Table name -> its section of the page (up to the next heading)."""
    sections = re.split(r"^### `([a-z_]+)`\s*$", DOC.read_text(encoding="utf-8"), flags=re.MULTILINE)
    return {
        sections[i]: re.split(r"^##", sections[i + 1], flags=re.MULTILINE)[0]
        for i in range(1, len(sections) - 1, 2)
    }


def test_every_declared_table_is_documented():
    assert set(documented_tables()) == set(DEFAULT_CATALOG)


@pytest.mark.parametrize("name", sorted(DEFAULT_CATALOG))
def test_documented_columns_match_the_declaration(name):
    section = documented_tables()[name]
    rows = [m.groups() for line in section.splitlines() if (m := ROW.match(line))]
    spec = DEFAULT_CATALOG[name]
    declared = [
        (f.name, f.dataType.simpleString(), "yes" if f.nullable else "no") for f in spec.schema.fields
    ]
    assert rows == declared
    if spec.partition_by:
        assert "Partitioned by " + ", ".join(f"`{c}`" for c in spec.partition_by) in section
    else:
        assert "Not partitioned" in section
    if spec.cluster_by:
        assert f"clustered by `{spec.cluster_by}`" in section
    for key, value in spec.properties.items():
        assert f"`{key}={value}`" in section


def test_the_sparkplug_metrics_columns_are_documented_as_declared():
    """``sparkplug_metrics`` is no table of the default catalog (a ``sparkplug_b`` template writes it): its
    section lists its columns all the same."""
    from pipelines.payloads.sparkplug_tables import sparkplug_metrics

    text = DOC.read_text(encoding="utf-8")
    section = text.split("### `sparkplug_metrics` (with a `sparkplug_b` topic template)", 1)[1].split(
        "\n## ", 1
    )[0]
    rows = [m.groups() for line in section.splitlines() if (m := ROW.match(line))]
    spec = sparkplug_metrics()
    assert rows == [
        (f.name, f.dataType.simpleString(), "yes" if f.nullable else "no") for f in spec.schema.fields
    ]
    keys = ", ".join(f"`{key}`" for key in spec.merge_keys)
    assert f"Partitioned by `event_date`; merge keys {keys};" in section


def test_the_default_catalog_is_what_the_default_pipeline_writes():
    """The documented (default) catalog is the telemetry pipeline's with its shipped config and its
    built-in defaults: a read in docs/tables.md names the columns the pipeline writes."""
    from pipelines.telemetry.config import load_telemetry_config, load_telemetry_config_file
    from pipelines.telemetry.job import telemetry_catalog

    shipped = telemetry_catalog(load_telemetry_config_file(DOC.parents[1] / "conf" / "pipeline.yaml"))
    built_in = telemetry_catalog(load_telemetry_config({}))
    for name, spec in DEFAULT_CATALOG.items():
        assert shipped[name].schema == spec.schema, name
        assert built_in[name].schema == spec.schema, name


def test_the_documented_columns_are_those_of_the_tables_the_demo_wrote(demo_run):
    """The demo runs the default pipelines: every table it wrote has exactly the documented columns."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from pipelines.views.location import DEMO_TABLES
    from sinks.spark_arrow import to_spark

    root = demo_run.repository / DEMO_TABLES
    written = sorted(path.name for path in root.iterdir() if (path / "_delta_log").is_dir())
    assert set(written) == set(DEFAULT_CATALOG)
    for name in written:
        table = DeltaTable(str(root / name))
        schema = to_spark(pa.schema(table.schema().to_arrow()))
        columns = [(f.name, f.dataType.simpleString(), "yes" if f.nullable else "no") for f in schema.fields]
        section = documented_tables()[name]
        assert [m.groups() for line in section.splitlines() if (m := ROW.match(line))] == columns, name


def _reading_example() -> str:
    section = DOC.read_text(encoding="utf-8").split("## Reading the tables", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_documented_reads_return_data_in_every_column(demo_run, spark):
    """The reading example of docs/tables.md, as written, against the demo's tables."""
    from pipelines.views.location import DEMO_TABLES

    namespace = {"root": str(demo_run.repository / DEMO_TABLES), "spark": spark}
    exec(_reading_example(), namespace)
    silver = namespace["silver"]
    assert silver.num_rows > 0
    assert silver.column_names == DEFAULT_CATALOG["silver_telemetry"].column_names
    assert {name: silver[name].null_count < silver.num_rows for name in silver.column_names} == dict.fromkeys(
        silver.column_names, True
    )
    weak = namespace["weak"]
    assert list(weak.columns) == DEFAULT_CATALOG["device_minute"].column_names
    readings = namespace["readings"].toPandas()
    assert len(readings) == silver.num_rows and readings.notna().all().all()
    fleet = namespace["fleet"].toPandas()
    assert set(fleet["group"]) == {"canary", "fleet"} and fleet["firmware_version"].notna().all()
    assert fleet["count"].sum() == len(set(silver["device_id"].to_pylist()))
