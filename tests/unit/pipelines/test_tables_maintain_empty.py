"""``timestone tables maintain`` where a pipeline has written no table yet says so, where it printed
nothing at all and exited 0, as if it had maintained them."""

from __future__ import annotations

from pathlib import Path

import yaml

from pipelines.maintenance.cli import tables_main


def test_a_pipeline_without_tables_yet_is_said_to_have_nothing_to_maintain(tmp_path: Path, capsys) -> None:
    root = tmp_path / "tables"
    document = tmp_path / "pipeline.yaml"
    section = {
        "source": {"brokers": ["edge1=http://127.0.0.1:9"]},
        "tables": {"root": str(root), "backend": "delta-rs"},
        "stream": {"checkpoint": str(tmp_path / "checkpoint")},
    }
    document.write_text(yaml.safe_dump({"telemetry": section}))
    assert tables_main(["maintain", "telemetry", "--config", str(document)]) == 0
    assert capsys.readouterr().out == f"telemetry: no table of it under {root} yet: nothing to maintain\n"


def test_a_root_delta_rs_cannot_address_is_a_configuration_error(tmp_path: Path, capsys) -> None:
    """A URL escape ('%41') in the tables root: exit 2 with one line naming the pipeline and the root,
    not a traceback."""
    root = tmp_path / "100%41 lake" / "tables"
    status = tables_main(["maintain", "telemetry", "--set", f"telemetry.tables.root={root}"])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"timestone tables maintain telemetry: telemetry.tables.root: table root '{root}' holds a '%'"
    )  # the key, checked with the configuration's other locations
    assert err.rstrip().endswith("(from --set telemetry.tables.root)")
    assert "Traceback" not in err
