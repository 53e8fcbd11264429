"""``timestone ota`` writes exactly one row per action, cancels by flag, and reads summaries."""

from __future__ import annotations

import pyarrow.compute as pc

from pipelines.cli import main
from sinks import open_table_store


def actions(root: str) -> list[dict]:
    return open_table_store(None, root, backend="delta-rs").read_arrow("actions").to_pylist()


def test_create_is_idempotent_per_action_id(tmp_path, capsys):
    root = str(tmp_path / "tables")
    argv = [
        "ota",
        "--tables-root",
        root,
        "create",
        "--id",
        "fw-2",
        "--group",
        "canary",
        "--version",
        "2.0.0",
        "--url",
        "https://example.invalid/fw.bin",
        "--sha256",
        "0" * 64,
        "--max-per-minute",
        "30",
        "--abort-failure-pct",
        "20",
    ]
    assert main(argv) == 0
    assert main(argv) == 0
    rows = actions(root)
    assert len(rows) == 1
    row = rows[0]
    assert row["id"] == "fw-2" and row["target"]["group"] == "canary" and row["payload"]["version"] == "2.0.0"
    assert row["rollout"] == {"max_per_minute": 30, "broadcast": False}
    assert row["abort_criteria"]["failure_pct"] == 20.0 and row["cancel"] is False
    assert capsys.readouterr().out.split() == ["fw-2", "fw-2"]


def test_bad_actions_are_refused_with_a_reason(tmp_path, capsys):
    root = str(tmp_path / "tables")
    assert main(["ota", "--tables-root", root, "create", "--all", "--version", "2.0.0"]) == 2
    assert "payload.url: required for an ota action" in capsys.readouterr().err
    assert main(["ota", "--tables-root", root, "create", "--kind", "command", "--devices", "d1"]) == 2
    assert "payload.command: required for a command action" in capsys.readouterr().err
    assert not open_table_store(None, root, backend="delta-rs").exists("actions")


def test_cancel_sets_the_flag_and_unknown_ids_fail(tmp_path, capsys):
    root = str(tmp_path / "tables")
    assert (
        main(
            [
                "ota",
                "--tables-root",
                root,
                "create",
                "--id",
                "c-1",
                "--kind",
                "command",
                "--command",
                "reboot",
                "--arg",
                "delay=5",
                "--devices",
                "d1,d2",
            ]
        )
        == 0
    )
    assert main(["ota", "--tables-root", root, "cancel", "c-1"]) == 0
    assert main(["ota", "--tables-root", root, "cancel", "nope"]) == 1
    table = open_table_store(None, root, backend="delta-rs").read_arrow("actions")
    row = table.filter(pc.equal(table["id"], "c-1")).to_pylist()
    assert len(row) == 1 and row[0]["cancel"] is True
    assert row[0]["target"]["device_ids"] == ["d1", "d2"] and dict(row[0]["payload"]["args"]) == {
        "delay": "5"
    }
    assert main(["ota", "--tables-root", root, "status"]) == 0
    assert "no action summaries yet" in capsys.readouterr().out


def test_actions_pipeline_refuses_a_bad_config_naming_the_field(tmp_path, capsys):
    config = tmp_path / "actions.yaml"
    config.write_text("brokers:\n  - name: edge1\n    mqtt_port: 70000\n")
    assert main(["pipeline", "actions", "--config", str(config)]) == 2
    assert "brokers[0].mqtt_port" in capsys.readouterr().err
    config.write_text("tick_interval: 1\n")
    assert main(["pipeline", "actions", "--config", str(config)]) == 2
    assert "tick_interval" in capsys.readouterr().err
