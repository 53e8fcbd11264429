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
