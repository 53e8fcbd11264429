"""What ``timestone pipeline ...`` prints for the notebooks leads to the tables it writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelines.cli import main
from pipelines.views.location import TABLES_ENV, open_tables, tables_root
from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.telemetry.telemetry_harness import Fleet, LogAppendPublisher

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.spark
def test_pipeline_prints_the_setting_that_points_the_notebooks_at_its_tables(spark, tmp_path, capsys):
    broker = EdgeBroker(tmp_path / "edge")
    try:
        Fleet([LogAppendPublisher("edge1", broker)], devices=2).send(rounds=2)
        argv = ["pipeline", "telemetry", "--config", str(REPO / "conf" / "pipeline.yaml"), "--available-now"]
        for override in (
            f"telemetry.source.brokers=[edge1={broker.url}]",
            "telemetry.tables.root=lake",  # relative, as in conf/pipeline.yaml: printed as an absolute path
            f"telemetry.stream.checkpoint={tmp_path / 'checkpoint'}",
        ):
            argv += ["--set", override]
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(tmp_path)
            assert main(argv) == 0
    finally:
        broker.close()
    printed = re.search(rf"{TABLES_ENV}=(\S+)", capsys.readouterr().out)
    assert printed, "no notebook setting printed"
    assert printed.group(1) == str(tmp_path / "lake")
    root = tables_root({TABLES_ENV: printed.group(1)}, start=REPO)
    assert open_tables(None, root).read_arrow("devices").num_rows == 2
