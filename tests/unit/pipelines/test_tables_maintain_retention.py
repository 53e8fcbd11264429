"""``timestone tables maintain --retention-hours`` overrides the retention of that one vacuum: the tables'
retention property keeps the configured period, which other engines (a Databricks ``VACUUM``) honour."""

from __future__ import annotations

from pathlib import Path

import yaml
from deltalake import DeltaTable

from pipelines.maintenance.cli import tables_main
from sinks.delta_rs import DeltaRsTableStore
from sinks.store import DELETED_FILE_RETENTION
from tests.e2e.sinks.conftest import arrow_rows, bronze_row


def test_a_part_of_an_hour_given_on_the_command_line_is_not_left_on_the_table(tmp_path: Path, capsys) -> None:
    root = tmp_path / "tables"
    store = DeltaRsTableStore(None, str(root))
    for batch in range(3):
        data = arrow_rows("bronze_telemetry", [bronze_row(batch)])
        assert store.append("bronze_telemetry", data, "q", batch)
    document = tmp_path / "pipeline.yaml"
    section = {
        "source": {"brokers": ["edge1=http://127.0.0.1:9"]},
        "tables": {"root": str(root), "backend": "delta-rs", "maintenance": {"retention_hours": 72}},
        "stream": {"checkpoint": str(tmp_path / "checkpoint")},
    }
    document.write_text(yaml.safe_dump({"telemetry": section}))
    argv = ["maintain", "telemetry", "--config", str(document), "--retention-hours", "0.5"]
    assert tables_main(argv) == 0
    configuration = DeltaTable(store.location("bronze_telemetry")).metadata().configuration
    assert configuration[DELETED_FILE_RETENTION] == "interval 259200 seconds"  # 72 h, as configured
    out = capsys.readouterr().out
    assert "FAILED" not in out and "vacuum" in out


def test_a_retention_that_is_not_a_finite_number_is_refused_at_once(capsys) -> None:
    """--retention-hours nan or inf: exit 2 naming the option, where each table's vacuum then FAILED; past a
    hundred years delta-rs panicked (1e15: a Rust panic and a traceback) or its vacuum FAILED (1e20)."""
    for value in ("nan", "inf", "-1", "1e15", "1e20", "876000.5"):
        assert tables_main(["maintain", "telemetry", "--retention-hours", value]) == 2
        err = capsys.readouterr().err
        assert err == (
            "timestone tables maintain: --retention-hours must be a number from 0 to 876000 "
            "(a hundred years)\n"
        )
