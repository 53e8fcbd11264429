"""Tables in an S3 bucket (moto's server on loopback): the Spark tasks upload the data files with pyarrow,
the driver commits them with delta-rs, with the table's storage options on both sides."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote

import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable

from pipelines.actions.engine_tables import EXECUTIONS
from sinks.delta_rs import AppendReport, DeltaRsTableStore
from sinks.object_store import FileLocation, UnsupportedLocation, s3_file_system
from sinks.store import TableStoreError
from tests.e2e.sinks.conftest import arrow_rows, bronze_row, spark_rows
from tests.e2e.sinks.test_executions_layout import History, action_ids, read_back
from tests.s3_server import S3Endpoint

pytestmark = pytest.mark.spark

BRONZE = "bronze_telemetry"
EXECUTOR_FILE = re.compile(r"^part-\d{5}-[0-9a-f-]{36}-\d+-c\d{3}\.snappy\.parquet$")


@pytest.fixture
def bucket(s3: S3Endpoint) -> str:
    return s3.new_bucket()


@pytest.fixture
def lake(spark, s3: S3Endpoint, bucket: str) -> DeltaRsTableStore:
    return DeltaRsTableStore(spark, f"s3://{bucket}/tables", storage_options=s3.storage_options())


def data_keys(s3: S3Endpoint, bucket: str, table: str) -> set[str]:
    """The data files of ``table`` in the bucket, relative to the table (the log left out)."""
    prefix = f"tables/{table}/"
    return {k.removeprefix(prefix) for k in s3.keys(bucket, prefix) if "/_delta_log/" not in f"/{k}"}


def test_the_tasks_upload_the_files_and_the_driver_commits_them_once(spark, s3, bucket, lake):
    reports: list[AppendReport] = []
    lake.on_append = reports.append
    rows = [bronze_row(offset, day=1 + offset % 2) for offset in range(10)]
    frame = spark_rows(spark, BRONZE, rows).repartition(2)

    assert lake.append(BRONZE, frame, "q", 0) is True
    table = DeltaTable(lake.location(BRONZE), storage_options=s3.storage_options())
    assert table.version() == 1, "table creation, then one commit"
    paths = {unquote(p) for p in table.get_add_actions().column("path").to_pylist()}
    assert all(EXECUTOR_FILE.match(p.split("/")[-1]) for p in paths), paths
    assert {p.split("/")[0] for p in paths} == {"ingest_date=2026-03-01", "ingest_date=2026-03-02"}
    assert data_keys(s3, bucket, BRONZE) == paths, "every uploaded file is committed, nothing else"
    assert [(r.on_executors, r.rows) for r in reports] == [(True, 10)]
    assert lake.read_arrow(BRONZE).sort_by("offset").equals(arrow_rows(BRONZE, rows))
    assert table.transaction_version("q") == 0

    assert lake.append(BRONZE, frame, "q", 0) is False, "a replayed batch"
    assert data_keys(s3, bucket, BRONZE) == paths, "a replay uploads nothing"
    assert lake.version(BRONZE) == 1


def test_a_merge_and_an_arrow_append_reach_the_bucket_too(spark, s3, lake):
    devices = spark.createDataFrame(
        [("d1", "1.0.0", "blue"), ("d2", "1.0.0", None)],
        "device_id string, firmware_version string, group string",
    )
    assert lake.merge("devices", devices, "q", 0) is True
    later = spark.createDataFrame(
        [("d2", "2.0.0", "red")], "device_id string, firmware_version string, group string"
    )
    assert lake.merge("devices", later, "q", 1) is True
    assert lake.merge("devices", later, "q", 1) is False
    stored = sorted(
        (r["device_id"], r["firmware_version"], r["group"]) for r in lake.read_arrow("devices").to_pylist()
    )
    assert stored == [("d1", "1.0.0", "blue"), ("d2", "2.0.0", "red")]
    assert lake.append(BRONZE, arrow_rows(BRONZE, [bronze_row(0)]), "q", 0) is True
    assert lake.read_arrow(BRONZE).num_rows == 1


def test_storage_options_become_pyarrows_s3_settings(s3, bucket):
    filesystem = s3_file_system(
        {"aws_endpoint_url": s3.url, **{k.lower(): v for k, v in s3.storage_options().items()}}
    )
    with filesystem.open_output_stream(f"{bucket}/probe") as stream:
        stream.write(b"written by pyarrow with delta-rs style options")
    assert s3.keys(bucket) == {"probe"}
    location = FileLocation(f"s3://{bucket}/tables/t", s3.storage_options())
    opened, path = location.open()
    assert isinstance(opened, pafs.S3FileSystem) and path == f"{bucket}/tables/t"
    assert json.loads(json.dumps(location.storage_options)) == s3.storage_options(), (
        "plain strings: picklable"
    )


def test_a_location_the_tasks_cannot_write_is_refused_by_name(spark, tmp_path):
    with pytest.raises(
        UnsupportedLocation, match=r"abfss://c@a/t: the Spark tasks write data files to local"
    ):
        FileLocation("abfss://c@a/t")
    store = DeltaRsTableStore(spark, "gs://bucket/tables")
    with pytest.raises(
        TableStoreError, match=r"^bronze_telemetry: gs://bucket/tables/bronze_telemetry: the Spark"
    ):
        store.file_location(BRONZE)


def test_a_clustered_table_in_the_bucket_is_read_by_action_from_its_files_alone(s3, bucket, lake):
    history = History(lake)
    actions = action_ids(6)
    history.run(actions)
    assert lake.compact(EXECUTIONS, 16 << 20, min_files=2) >= 1  # the report merges' files split by action
    wanted = actions[2]
    files = DeltaTable(lake.location(EXECUTIONS), storage_options=s3.storage_options()).get_add_actions(
        flatten=True
    )
    filesystem = s3_file_system(s3.storage_options())
    stats = zip(
        *(files.column(c).to_pylist() for c in ("path", "min.action_id", "max.action_id")), strict=True
    )
    ruled_out = [path for path, low, high in stats if not low <= wanted <= high]
    assert ruled_out
    for path in ruled_out:  # a read that opened one of these would fail
        filesystem.delete_file(f"{bucket}/tables/{EXECUTIONS}/{unquote(path)}")
    assert read_back(lake, wanted) == history.expected[wanted]
