"""Tables another tool wrote (delta-rs' ``write_deltalake``) with columns of their own: some declared ones
missing, others of a narrower type, one more than the notebook's catalog declares. Both read paths give the
frame of the declared schema, so the notebook draws them as the pipelines' own."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from pipelines.views import queries
from pipelines.views.location import open_tables, table_catalog
from sinks import open_table_store
from tests.e2e.notebooks.notebook_harness import run_notebook

NOW = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def write_foreign_tables(root: Path) -> None:
    write_deltalake(
        str(root / "devices"), pa.table({"device_id": ["d1", "d2"], "firmware_version": ["1.0", "2.0"]})
    )
    minute = {"device_id": ["d1"], "minute": pa.array([NOW], pa.timestamp("us", tz="UTC"))}
    values = {"temperature_min": [20.0], "temperature_max": [22.0], "temperature_avg": [21.0]}
    write_deltalake(
        str(root / "device_minute"), pa.table(minute | {"count": pa.array([2], pa.int32())} | values)
    )
    readings = {
        "device_id": ["d1", "d1"],
        "event_time": pa.array([NOW, NOW.replace(second=30)], pa.timestamp("ms", tz="UTC")),
        "temperature": pa.array([20.0, 22.0], pa.float32()),
        "pressure": [1013.0, 1012.0],  # a payload field the notebook's catalog does not declare
    }
    write_deltalake(str(root / "silver_telemetry"), pa.table(readings))


def test_the_telemetry_notebook_draws_tables_with_columns_of_their_own(tmp_path, monkeypatch):
    root = tmp_path / "lake"
    write_foreign_tables(root)
    for name in ("TIMESTONE_DEVICE_ID", "TIMESTONE_PIPELINE_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TIMESTONE_TABLES", str(root))
    run = run_notebook("telemetry.ipynb", tmp_path, tmp_path)
    fleet = run.charts["fleet_chart"]
    assert fleet.title == "Fleet: 2 devices by firmware version and group" and fleet.bars == 2
    device = run.charts["device_chart"]
    assert device.title == "d1: temperature, 2 readings in 1 minute"
    assert (device.points, device.bars, device.segments) == (2, 1, 1)


@pytest.mark.spark
def test_both_read_paths_give_the_declared_columns_of_a_foreign_table(spark, tmp_path):
    write_foreign_tables(tmp_path)
    catalog = table_catalog({}, start=Path(__file__))
    local = open_tables(None, str(tmp_path))
    with_spark = open_table_store(spark, str(tmp_path), backend="delta-rs", catalog=catalog)
    for name in ("devices", "device_minute", "silver_telemetry"):
        arrow = queries.read_frame(local, name)
        through_spark = queries.read_frame(with_spark, name)
        assert list(arrow.columns) == catalog.spec(name).arrow_schema.names
        pd.testing.assert_frame_equal(arrow, through_spark)
    assert queries.read_frame(local, "devices")["group"].isna().all()
