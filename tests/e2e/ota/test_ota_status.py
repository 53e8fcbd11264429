"""``timestone ota status`` against a running actions job: the devices that keep an action open are named,
the job's heartbeat says it runs (and later that it stopped, or that it holds every action waiting for its
reports stream), and ``--watch`` follows an action to its end."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

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
REPO = Path(__file__).resolve().parents[3]


class Watch:
    """``timestone ota status ACTION --watch`` in a process of its own, as an operator runs it beside the
    job, its output gathered as it comes."""

    def __init__(self, tables_root: str, action_id: str) -> None:
        command = [sys.executable, "-m", "pipelines.cli", "ota", "--tables-root", tables_root, "status"]
        command += [action_id, "--watch", "--interval", "0.2"]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True)
        self._lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def ended(self, timeout_s: float) -> tuple[int, list[str]]:
        """Its exit status and the blocks it printed, once it has ended by itself."""
        status = self.process.wait(timeout=timeout_s)
        self._reader.join(timeout=timeout_s)
        return status, self.output.strip().split("\n\n")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        assert self.process.stdout is not None
        self.process.stdout.close()


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

        def online_done() -> bool:
            return (summary(store, "s-1") or {}).get("succeeded_count") == 4

        wait_for(online_done, timeout_s=180, what="the online devices")
        capsys.readouterr()

        assert ota("status", "s-1", "--show", "2") == 0
        out = capsys.readouterr().out
        assert "target    group g" in out and "state     IN_PROGRESS" in out
        assert "queued=3 in_progress=0 succeeded=4" in out and "total=7" in out
        assert "not done  3 devices:\n          dev-offline-0 QUEUED since " in out
        assert "dev-offline-1 QUEUED" in out and "dev-offline-2" not in out and "... and 1 more" in out
        assert "actions job: running on " in out

        # The watch is under way (its first look printed) before the cancel, so that it follows the action
        # from IN_PROGRESS to its end, whenever the job takes the cancel in.
        watch = Watch(root, "s-1")
        try:
            wait_for(lambda: "\n\n" in watch.output, timeout_s=120, what="the watch's first look")
            assert ota("cancel", "s-1") == 0
            assert capsys.readouterr().out == "cancel requested for s-1\n"
            status, blocks = watch.ended(timeout_s=180)
        finally:
            watch.close()
        assert status == 0
        assert "state     IN_PROGRESS, updated" in blocks[0] and "actions job: running on " in blocks[0]
        assert "state     CANCELED" in blocks[-1] and "reason    canceled by operator" in blocks[-1]
        assert "not done" not in blocks[-1] and "actions job" not in blocks[-1]
        assert all(block.startswith("-- ") for block in blocks)

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
