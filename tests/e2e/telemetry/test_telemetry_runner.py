"""``timestone pipeline``: argument parsing, config overrides, errors before Spark, and a real run."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from broker_edge.config.loader import ConfigError
from pipelines.cli import main
from pipelines.runner import PIPELINES, apply_override, load_config_document, parse_args
from pipelines.telemetry.config import load_telemetry_config
from pipelines.telemetry.job import open_store
from tests.e2e.sources.conftest import EdgeBroker
from tests.e2e.telemetry.telemetry_harness import Fleet, LogAppendPublisher

REPO = Path(__file__).resolve().parents[3]


def test_arguments_and_registry():
    args = parse_args(["telemetry", "--available-now", "--set", "telemetry.tables.root=/x", "--set", "a.b=1"])
    assert (args.name, args.available_now, args.config, args.spark_master) == ("telemetry", True, None, None)
    assert args.overrides == ["telemetry.tables.root=/x", "a.b=1"]
    assert PIPELINES["telemetry"].module == "pipelines.telemetry.job"
    with pytest.raises(SystemExit):
        parse_args(["nonsense"])


def test_overrides_set_nested_keys_with_yaml_values():
    document = {"telemetry": {"source": {"brokers": ["a=http://a:1"]}}, "flat": 1}
    apply_override(document, 'telemetry.source.brokers=["e1=http://h:8081", "e2=http://k:8081"]')
    apply_override(document, "telemetry.tables.root=/lake")
    apply_override(document, "telemetry.stream.trigger_interval=5 seconds")
    apply_override(document, "telemetry.source.max_records_per_trigger=10")
    config = load_telemetry_config(document["telemetry"])
    assert config.source.brokers == ["e1=http://h:8081", "e2=http://k:8081"]
    assert (config.tables.root, config.stream.trigger_interval) == ("/lake", "5 seconds")
    assert config.source.max_records_per_trigger == 10
    with pytest.raises(ConfigError, match="flat"):
        apply_override(document, "flat.x=1")
    with pytest.raises(ConfigError):
        apply_override(document, "no equals sign")


def test_default_file_is_used_when_present(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    assert "telemetry" in load_config_document(None, "conf/pipeline.yaml", [])
    monkeypatch.chdir(tmp_path)
    assert load_config_document(None, "conf/pipeline.yaml", ["telemetry.tables.root=t"]) == {
        "telemetry": {"tables": {"root": "t"}}
    }


def test_a_bad_key_is_reported_by_its_path_before_spark_starts(tmp_path, capsys):
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"telemetry": {"quality": {"gx": {"shedule": "every_batch"}}}}))
    assert main(["pipeline", "telemetry", "--config", str(config)]) == 2
    assert "telemetry.quality.gx.shedule: unknown key" in capsys.readouterr().err


@pytest.mark.spark
def test_timestone_pipeline_telemetry_available_now_runs_the_pipeline(spark, tmp_path):
    broker = EdgeBroker(tmp_path / "edge")
    try:
        sent = Fleet([LogAppendPublisher("edge1", broker)], devices=3).send(rounds=4)
        overrides = [
            f"telemetry.source.brokers=[edge1={broker.url}]",
            f"telemetry.tables.root={tmp_path / 'tables'}",
            f"telemetry.stream.checkpoint={tmp_path / 'checkpoint'}",
        ]
        argv = ["pipeline", "telemetry", "--config", str(REPO / "conf" / "pipeline.yaml"), "--available-now"]
        for override in overrides:
            argv += ["--set", override]
        assert main(argv) == 0
    finally:
        broker.close()
    document = load_config_document(str(REPO / "conf" / "pipeline.yaml"), "", overrides)
    store = open_store(spark, load_telemetry_config(document["telemetry"]))
    assert store.read("bronze_telemetry").count() == sent
    assert store.read("silver_telemetry").count() == sent
    assert store.read("devices").count() == 3


@pytest.mark.spark
def test_a_run_resumes_from_its_checkpoint_and_refuses_it_once_damaged(spark, tmp_path, capsys):
    """What Spark wrote passes the checkpoint check and the second run resumes from it; the same checkpoint
    with its newest offsets cut short is refused before Spark starts (exit 2, naming the file) instead of a
    query failing on a parse error naming no file, restarted from it for ever."""
    broker = EdgeBroker(tmp_path / "edge")
    checkpoint = tmp_path / "checkpoint"
    argv = ["pipeline", "telemetry", "--config", str(REPO / "conf" / "pipeline.yaml"), "--available-now"]
    argv += ["--set", f"telemetry.source.brokers=[edge1={broker.url}]"]
    argv += ["--set", f"telemetry.tables.root={tmp_path / 'tables'}"]
    argv += ["--set", f"telemetry.stream.checkpoint={checkpoint}"]
    try:
        fleet = Fleet([LogAppendPublisher("edge1", broker)], devices=2)
        fleet.send(rounds=2)
        assert main(argv) == 0
        fleet.send(rounds=1)
        assert main(argv) == 0
        newest = max((checkpoint / "offsets").glob("[0-9]*"), key=lambda f: int(f.name))
        newest.write_text(newest.read_text()[:-5])
        capsys.readouterr()
        assert main(argv) == 2
    finally:
        broker.close()
    err = capsys.readouterr().err
    assert err.startswith(f"timestone pipeline telemetry: telemetry.stream.checkpoint: {newest} is damaged")
    document = load_config_document(str(REPO / "conf" / "pipeline.yaml"), "", argv[6::2])
    store = open_store(spark, load_telemetry_config(document["telemetry"]))
    assert store.read("silver_telemetry").count() == 6
