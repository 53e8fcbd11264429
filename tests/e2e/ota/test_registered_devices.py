"""Devices registered for OTA without the telemetry pipeline (``timestone devices register``), then an OTA
to their group: the devices table holds what was registered, and the group's rollout reaches every device."""

from __future__ import annotations

import logging

import pytest

from broker_edge.runtime.launcher import BrokerProcess
from pipelines.actions.engine import ActionsEngine
from pipelines.actions.publisher import MqttPublisher
from pipelines.cli import main
from tests.e2e.ota.conftest import (
    SHA256,
    action_row,
    actions_stack,
    register_devices,
    summary,
    wait_for,
    write_actions,
)
from tests.e2e.ota.rollout_harness import BROKER_LIMITS, ManualClock, finals
from tests.fleet_harness import FleetHarness, FleetSpec, quiet_devices

FIRMWARE = ["--version", "2.0.0", "--url", "https://example.invalid/fw.bin", "--sha256", SHA256]


def test_a_group_registered_by_command_takes_an_ota_to_every_device_without_the_telemetry_pipeline(
    spark, tmp_path, capsys
):
    with actions_stack(
        spark, tmp_path, {"count": 4, "groups": ["plant-3"]}, quiet_devices(), register=False
    ) as stack:
        store, root = stack.store, stack.config.tables_root
        devices = [device.device_id for device in stack.harness.fleet.devices]

        def ota(*argv: str) -> int:
            return main(["ota", "--tables-root", root, *argv])

        assert ota("create", "--group", "plant-3", *FIRMWARE) == 2  # nobody registered: refused, naming why
        assert "none: no device is registered yet" in capsys.readouterr().err

        listed = tmp_path / "devices.txt"
        listed.write_text("\n".join(devices[2:]) + "\n")
        register = ["devices", "register", "--tables-root", root, "--group", "plant-3"]
        assert main([*register, *devices[:2], "--from-file", str(listed), "--tag", "site=plant-3"]) == 0
        assert f"registered 4 devices in group 'plant-3' (4 new) in {root}/devices" in capsys.readouterr().out
        rows = {row["device_id"]: row for row in store.read_arrow("devices").to_pylist()}
        assert sorted(rows) == sorted(devices)
        assert {row["group"] for row in rows.values()} == {"plant-3"}
        assert all(dict(row["tags"]) == {"site": "plant-3"} for row in rows.values())

        assert ota("create", "--id", "r-1", "--group", "plant-3", *FIRMWARE) == 0
        wait_for(lambda: (summary(store, "r-1") or {}).get("action_state") == "COMPLETED", what="the rollout")
        final = summary(store, "r-1")
        assert final is not None and final["succeeded_count"] == 4
        assert all(device.firmware == "2.0.0" for device in stack.harness.fleet.devices)

        # registering again moves a device, keeps the others' rows, and adds nothing twice
        assert main(["devices", "register", "--tables-root", root, "--group", "line-9", devices[0]]) == 0
        assert "(0 new)" in capsys.readouterr().out
        moved = {row["device_id"]: row["group"] for row in store.read_arrow("devices").to_pylist()}
        assert len(moved) == 4 and moved[devices[0]] == "line-9" and moved[devices[1]] == "plant-3"


def test_register_refuses_a_command_line_without_devices_or_with_an_unusable_name(tmp_path, capsys):
    root = str(tmp_path / "tables")
    assert main(["devices", "register", "--tables-root", root, "--group", "g"]) == 2
    assert "no device id given" in capsys.readouterr().err
    assert main(["devices", "register", "--tables-root", root, "--group", "a/b", "d1"]) == 2
    assert "--group: 'a/b' contains '/'" in capsys.readouterr().err
    assert main(["devices", "register", "--tables-root", root, "--group", "g", "d+1"]) == 2
    assert "1 device id cannot be used: [0] 'd+1': contains '/', '+'" in capsys.readouterr().err


def test_a_file_of_device_ids_saved_by_an_editor_registers_the_ids_it_shows(tmp_path, capsys):
    """UTF-8 with a byte order mark and CRLF line ends (Notepad) registers ``dev-1``, not U+FEFF + ``dev-1``,
    which no device is; a file that is missing or no UTF-8 text is a wrong command line, in one line."""
    from sinks import open_table_store

    root = str(tmp_path / "tables")
    listed = tmp_path / "devices.txt"
    listed.write_bytes(b"\xef\xbb\xbfdev-1\r\ndev-2\r\n")
    register = ["devices", "register", "--tables-root", root, "--group", "g", "--from-file"]
    assert main([*register, str(listed)]) == 0
    rows = open_table_store(None, root, backend="delta-rs").read_arrow("devices")
    assert sorted(rows.column("device_id").to_pylist()) == ["dev-1", "dev-2"]
    capsys.readouterr()
    assert main([*register, str(tmp_path / "gone.txt")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"timestone devices register: --from-file: cannot read {tmp_path / 'gone.txt'}: "
        "No such file or directory"
    ]
    listed.write_bytes(b"caf\xe9\n")
    assert main([*register, str(listed)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"timestone devices register: --from-file: {listed}: not UTF-8 text"
    )


def test_device_ids_another_tool_registered_that_are_no_topic_level_are_left_out_of_a_group(
    tmp_path, table_store, caplog: pytest.LogCaptureFixture
):
    """Rows of ``devices`` written by hand with ids that cannot be one topic level (``+``, ``/``, blank):
    sent on their own topics (``device_buckets: 0``) they made the broker close the job's connection at every
    tick, which stopped every action's pacing, timeouts and aborts. They are left out of the group, named
    once in a WARNING, and the group's other devices get the rollout."""
    with BrokerProcess(tmp_path / "broker", limits=BROKER_LIMITS) as broker:
        spec = FleetSpec(brokers=[broker.address], count=3, groups=["g"])
        with FleetHarness(broker.address, spec, quiet_devices()) as harness:
            store = table_store
            fleet = [d.device_id for d in harness.fleet.devices]
            register_devices(store, {**dict.fromkeys(fleet, "g"), "bad+id": "g", "bad/id": "g", " ": "g"})
            clock = ManualClock()
            publisher = MqttPublisher([broker.address], client_id="actions-test")
            engine = ActionsEngine(store, publisher, clock=clock, device_buckets=0)
            try:
                row = action_row("paced", group="g", max_per_minute=60)
                write_actions(store, [row], 0)
                with caplog.at_level(logging.WARNING):
                    engine.on_action_rows([row], "fanout", 0)
                    for second in range(1, 4):
                        clock.now = clock.at(second)
                        engine.tick()
                warned = [r.getMessage() for r in caplog.records if "no topic level" in r.getMessage()]
                assert len(warned) == 1 and "'bad+id'" in warned[0] and "'bad/id'" in warned[0], warned
                harness.wait_until(lambda: finals(list(harness.reports), "paced") == 3)
                engine.on_reports(harness.take_reports(), "reports", 0)
                final = summary(store, "paced")
                assert final is not None
                assert (final["action_state"], final["succeeded_count"], final["total_count"]) == (
                    "COMPLETED",
                    3,
                    3,
                )
            finally:
                publisher.close()
