"""What the documented commands write in the repository is ignored by git: run from the repository root, the
broker of conf/broker.yaml (or of the embedded defaults) keeps its logs in ./timestone-data, which showed in
`git status` as a directory to commit after the walkthroughs of docs/telemetry-pipeline.md and
docs/notebooks.md."""

from __future__ import annotations

from pathlib import Path

import yaml

from broker_edge.settings.broker import BrokerStorageConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_brokers_default_data_directory_is_ignored() -> None:
    ignored = {line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()}
    in_conf = yaml.safe_load((ROOT / "conf" / "broker.yaml").read_text())["storage"]["directory"]
    for directory in {BrokerStorageConfig().directory, in_conf}:
        assert f"/{directory}/" in ignored, directory
