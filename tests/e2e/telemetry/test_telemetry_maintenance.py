"""``timestone tables maintain telemetry`` on the tables a real run of the job wrote: every table keeps its
rows (chispa) and its batch markers, its replaced files are gone, and the job carries on exactly once."""

from __future__ import annotations

from urllib.parse import unquote

import pytest
import yaml
from deltalake import DeltaTable

from pipelines.maintenance.cli import tables_main
from pipelines.telemetry.job import TABLES, open_store
from sinks import TableStore
from tests.e2e.sinks.test_maintenance import files_on_disk, same_rows
from tests.e2e.telemetry.telemetry_harness import Fleet, LogAppendPublisher, checkpoint_query_id
from tests.e2e.telemetry.test_telemetry_stream import keys, pipeline_config, run_available_now, total_of

pytestmark = pytest.mark.spark


def live_files(store: TableStore, name: str) -> set[str]:
    table = DeltaTable(store.location(name))
    return {unquote(uri) for uri in table.file_uris()}


def test_maintaining_every_table_keeps_its_rows_and_markers_and_the_job_goes_on(spark, tmp_path, brokers):
    fleet = Fleet([LogAppendPublisher(name, broker) for name, broker in brokers.items()], devices=6)
    sent = fleet.send(rounds=6)
    sent += fleet.send(rounds=1, temperature=999.0)  # quarantined
    config = pipeline_config(tmp_path, brokers, max_records_per_trigger=10)
    run_available_now(spark, config)
    store = open_store(spark, config)
    query_id = checkpoint_query_id(config.stream.checkpoint)
    before = {name: store.read(name).collect() for name in TABLES}
    markers = {name: store.committed_batch(name, query_id) for name in TABLES}
    assert all(marker is not None for marker in markers.values()), markers
    files = {name: store.data_files(name) for name in TABLES}
    assert files["bronze_telemetry"] >= 5 and files["silver_telemetry"] >= 4, files

    document = tmp_path / "pipeline.yaml"
    section = {
        "source": {"brokers": [f"{name}={broker.url}" for name, broker in brokers.items()]},
        "tables": {"root": str(tmp_path / "tables"), "maintenance": {"min_files": 2}},
        "stream": {"checkpoint": str(tmp_path / "checkpoint")},
    }
    document.write_text(yaml.safe_dump({"telemetry": section}))
    argv = ["maintain", "telemetry", "--config", str(document), "--retention-hours", "0"]
    assert tables_main(argv) == 0

    for name in TABLES:
        same_rows(spark, before[name], store.read(name))
        assert store.committed_batch(name, query_id) == markers[name], name
        assert store.data_files(name) < files[name] or files[name] == 1, name
        assert files_on_disk(store, name) == len(live_files(store, name)), f"{name}: replaced files are gone"

    more = fleet.send(rounds=3)
    run_available_now(spark, config)
    bronze = keys(store, "bronze_telemetry")
    assert len(bronze) == len(set(bronze)) == sent + more
    assert total_of(store.read("device_minute"), "count") == sent + more - 6
