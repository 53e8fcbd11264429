"""``timestone ota status`` against a running actions job: the devices that keep an action open are named,
the job's heartbeat says it runs (and later that it stopped, or that it holds every action waiting for its
reports stream), and ``--watch`` follows an action to its end."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from pipelines.actions.engine import REPORTS_WAIT_WARNING_S
from pipelines.actions.heartbeat import HeartbeatWriter
from pipelines.cli import main
from tests.e2e.ota.conftest import SHA256, action_row, actions_stack, summary, wait_for
from tests.e2e.ota.rollout_harness import RolloutRun, finals, rollout_run
from tests.e2e.ota.test_restart_before_reports import engine_started_again
from tests.fleet_harness import quiet_devices

FIRMWARE = ["--version", "2.0.0", "--url", "https://example.invalid/fw.bin", "--sha256", SHA256]
OFFLINE = ["dev-offline-0", "dev-offline-1", "dev-offline-2"]


def test_status_names_the_devices_not_done_and_watch_follows_the_action_to_its_end(spark, tmp_path, capsys):
    with actions_stack(spark, tmp_path, {"count": 4, "groups": ["g"]}, quiet_devices()) as stack:
        store, root = stack.store, stack.config.tables_root
        now = datetime.now(UTC)
        registered = [{"device_id": d, "group": "g", "last_seen": now} for d in OFFLINE]  # never connect
        store.append(
            "devices", pa.Table.from_pylist(registered, schema=store.spec("devices").arrow_schema), "o", 0
        )

        def ota(*argv: str) -> int:
            return main(["ota", "--tables-root", root, *argv])

        assert ota("create", "--id", "s-1", "--group", "g", *FIRMWARE) == 0
        wait_for(lambda: (summary(store, "s-1") or {}).get("succeeded_count") == 4, what="the online devices")
        capsys.readouterr()

        assert ota("status", "s-1", "--show", "2") == 0
        out = capsys.readouterr().out
        assert "target    group g" in out and "state     IN_PROGRESS" in out
        assert "queued=3 in_progress=0 succeeded=4" in out and "total=7" in out
        assert "not done  3 devices:\n          dev-offline-0 QUEUED since " in out
        assert "dev-offline-1 QUEUED" in out and "dev-offline-2" not in out and "... and 1 more" in out
        assert "actions job: running on " in out

        assert ota("cancel", "s-1") == 0
        assert ota("status", "s-1", "--watch", "--interval", "0.2") == 0
        blocks = capsys.readouterr().out.strip().split("\n\n")
        assert "state     CANCELED" in blocks[-1] and "reason    canceled by operator" in blocks[-1]
        assert "not done" not in blocks[-1] and "actions job" not in blocks[-1]
        assert all(block.startswith(("cancel requested", "-- ")) for block in blocks)

    assert main(["ota", "--tables-root", root, "status"]) == 0
    out = capsys.readouterr().out
    assert "s-1" in out and "CANCELED" in out and "7/7" in out
    assert "actions job: stopped on " in out


def test_status_shows_the_row_the_job_took_when_another_was_appended_under_its_id(tmp_path, capsys):
    """An operator reuses the id of an action that completed: a notebook appends a row under it with a new
    version (``write_deltalake``), which the job ignores (one id is one action). Before, ``ota status``
    showed that ignored row (firmware 3.0.0) beside the old action's COMPLETED, as if the new build had gone
    out; now it shows the row the job took and says that another row under the id is ignored."""
    with rollout_run(tmp_path, quiet_devices(), count=3) as run:
        run.create(action_row("dup", group="g", version="2.0.0"))
        run.feed(lambda reports: finals(reports, "dup") == 3)
        assert run.summary("dup")["action_state"] == "COMPLETED"
        location = run.store.location("actions")
        schema = pa.schema(DeltaTable(location).schema().to_arrow())
        write_deltalake(
            location,
            pa.Table.from_pylist([action_row("dup", group="g", version="3.0.0")], schema),
            mode="append",
        )
        capsys.readouterr()
        assert main(["ota", "--tables-root", str(tmp_path / "tables"), "status", "dup"]) == 0
        out = capsys.readouterr().out
        assert "what      firmware 2.0.0 from " in out and "3.0.0" not in out.split("rows      ")[0]
        assert "state     COMPLETED" in out
        assert (
            "rows      2 rows with other content under this id (payload.url, payload.version): the actions "
            "job takes the one created first and ignores the others (write a new action)"
        ) in out
        assert main(["ota", "--tables-root", str(tmp_path / "tables"), "status"]) == 0
        assert "dup " in capsys.readouterr().out


def status_after_tick(run: RolloutRun, heartbeat: HeartbeatWriter, second: float, read_until: int, capsys):
    """Tick at ``second`` with the reports stream read until ``read_until`` (0: not caught up), beat as the
    job's ticker does, and return ``ota status`` (the one action, then the list)."""
    run.clock.now = run.clock.at(second)
    run.engine.tick(reports_read_until=read_until)
    heartbeat.beat(run.engine.reports_wait_since)
    capsys.readouterr()
    root = heartbeat.tables_root
    assert main(["ota", "--tables-root", root, "status", "rh-1"]) == 0
    assert main(["ota", "--tables-root", root, "status"]) == 0
    return capsys.readouterr().out


def test_status_says_that_the_job_holds_every_action_until_its_reports_stream_caught_up(tmp_path, capsys):
    """A job whose reports stream has not caught up with the brokers (one of them down) sends nothing: every
    action stays as it is. Before, only its log said so (at WARNING after two minutes); ``ota status``
    showed the action's devices QUEUED and the job running, with no reason. The heartbeat now carries the
    wait, and status says that every action is held, for how long, and past two minutes that a broker may be
    down; once the stream caught up the line is gone."""
    with rollout_run(tmp_path, quiet_devices(), count=2) as run:
        devices = sorted(d.device_id for d in run.fleet.devices)
        run.create(action_row("rh-1", device_ids=devices, max_per_minute=1))
        engine_started_again(run)
        heartbeat = HeartbeatWriter(str(tmp_path / "tables"), clock=run.clock)
        held = "held      every action: the actions job has sent nothing for {} s, waiting for its reports "
        held += "stream to catch up with the brokers{}; nothing goes out until it has"

        out = status_after_tick(run, heartbeat, 1, 0, capsys)
        assert out.count(held.format(0, "")) == 2 and "state     IN_PROGRESS" in out, out

        out = status_after_tick(run, heartbeat, REPORTS_WAIT_WARNING_S + 1, 0, capsys)
        assert out.count(held.format(int(REPORTS_WAIT_WARNING_S), " (is one of them down?)")) == 2, out

        out = status_after_tick(run, heartbeat, REPORTS_WAIT_WARNING_S + 2, run.clock.at(121), capsys)
        assert "held " not in out and out.count("actions job: running on ") == 2, out
