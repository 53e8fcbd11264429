"""``timestone ota``: one row per action, refused values named by option and field, an id never reused for
other content, no cancel of an ended action, and a status that says what waits for what."""

from __future__ import annotations

import resource
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from pipelines.actions.heartbeat import Heartbeat, write_heartbeat
from pipelines.cli import main
from pipelines.supervisor import NOT_RESTARTABLE
from sinks import open_table_store
from tests.e2e.ota.conftest import SHA256, register_devices
from tests.e2e.sources.conftest import EdgeBroker

FIRMWARE = ["--version", "2.0.0", "--url", "https://example.invalid/fw.bin", "--sha256", SHA256]


def actions(root: str) -> list[dict]:
    return open_table_store(None, root, backend="delta-rs").read_arrow("actions").to_pylist()


def ota(root, *argv: str) -> int:
    return main(["ota", "--tables-root", root, *argv])


def test_create_is_idempotent_per_action_id(tmp_path, capsys):
    root = str(tmp_path / "tables")
    argv = ["create", "--id", "fw-2", "--group", "canary", "--allow-unknown-group", *FIRMWARE]
    argv += ["--max-per-minute", "30", "--abort-failure-pct", "20"]
    assert ota(root, *argv) == 0
    assert ota(root, *argv) == 0
    rows = actions(root)
    assert len(rows) == 1
    row = rows[0]
    assert row["id"] == "fw-2" and row["target"]["group"] == "canary" and row["payload"]["version"] == "2.0.0"
    assert row["rollout"] == {"max_per_minute": 30, "broadcast": False}
    assert row["abort_criteria"]["failure_pct"] == 20.0 and row["cancel"] is False
    assert capsys.readouterr().out.split() == ["fw-2", "fw-2"]


def test_an_existing_id_with_other_content_is_refused_naming_what_differs(tmp_path, capsys):
    root = str(tmp_path / "tables")
    assert ota(root, "create", "--id", "fw-3", "--all", *FIRMWARE) == 0
    other = [*FIRMWARE[:1], "2.0.1", *FIRMWARE[2:]]
    assert ota(root, "create", "--id", "fw-3", "--all", *other) == 1
    err = capsys.readouterr().err
    assert "action fw-3 exists with other content" in err
    assert "payload.version: '2.0.0' in the table, '2.0.1' here" in err and "another --id" in err
    assert [r["payload"]["version"] for r in actions(root)] == ["2.0.0"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--all", *FIRMWARE, "--size", "-5"], "--size (payload.size): must be from 1 to "),
        (["--all", *FIRMWARE[:3], "notaurl", *FIRMWARE[4:]], "--url (payload.url): not an http(s) URL"),
        (["--all", *FIRMWARE, "--timeout", "-1"], "--timeout (in_progress_timeout_s): must be from 1"),
        (["--all", *FIRMWARE[:5], "9f2c"], "--sha256 (payload.sha256): expected 64 hexadecimal digits"),
        (["--devices", "d1,d2,d1", *FIRMWARE], "--devices (target.device_ids): lists d1 more than once"),
        (["--devices", "", *FIRMWARE], "--devices (target.device_ids): no device id given"),
        (
            ["--group", "nobody", *FIRMWARE],
            "--group (target.group): no registered device is in group 'nobody'",
        ),
        (["--all", *FIRMWARE, "--max-per-minute", "0"], "--max-per-minute (rollout.max_per_minute): must be"),
        (
            ["--all", *FIRMWARE, "--window", "mon 01:00 4h Europe"],  # a directory of the zone database
            "--window (maintenance_windows[0].time_zone): unknown time zone 'Europe'",
        ),
        (
            ["--all", *FIRMWARE, "--window", "mon 01:00 4h " + "Z" * 300],  # longer than a file name
            "--window (maintenance_windows[0].time_zone): unknown time zone 'ZZZ",
        ),
        (
            ["--all", *FIRMWARE, "--abort-failure-pct", "120"],
            "--abort-failure-pct (abort_criteria.failure_pct)",
        ),
        (["--all", "--version", "2.0.0"], "--url (payload.url): required for an ota action"),
        (
            ["--kind", "command", "--devices", "d1"],
            "--command (payload.command): required for a command action",
        ),
    ],
)
def test_impossible_values_are_refused_naming_the_option_and_the_field(tmp_path, capsys, argv, message):
    root = str(tmp_path / "tables")
    store = open_table_store(None, root, backend="delta-rs")
    register_devices(store, {"dev-1": "canary", "dev-2": "fleet"})
    assert ota(root, "create", *argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("timestone ota create: ") and message in err, err
    assert "Traceback" not in err
    if "--window" in argv:  # one problem, one line
        assert len(err.splitlines()) == 1, err
    assert not store.exists("actions")


@pytest.mark.parametrize("at", ["9999-12-31T23:00:00-05:00", "0001-01-01T00:00:00+01:00"])
def test_a_time_outside_the_years_1_to_9999_once_in_utc_is_a_wrong_command_line(tmp_path, capsys, at):
    """Written, it was a row the job rejects, and an end of it one that neither ``cancel`` nor ``end`` could
    read again: the action could no longer be stopped from the command line."""
    root = str(tmp_path / "tables")
    with pytest.raises(SystemExit) as refused:
        ota(root, "create", "--id", "far", "--devices", "d1", *FIRMWARE, "--start-at", at)
    assert refused.value.code == 2
    assert f"{at!r} is outside the years 1 to 9999 once in UTC" in capsys.readouterr().err
    assert ota(root, "create", "--id", "near", "--devices", "d1", *FIRMWARE) == 0
    with pytest.raises(SystemExit) as refused:
        ota(root, "end", "near", "--at", at)
    assert refused.value.code == 2
    assert "outside the years 1 to 9999" in capsys.readouterr().err
    assert ota(root, "cancel", "near") == 0  # still readable: nothing was written
    assert [(r["schedule"] or {}).get("end_at") for r in actions(root) if r["id"] == "near"] == [None]


def test_a_setting_given_twice_is_refused_not_the_last_kept(tmp_path, capsys):
    """``--arg delay=5 --arg delay=6`` wrote delay=6, and ``--phase 10%,wait=1d,wait=2d`` a wait of 2 days,
    without a word."""
    root = str(tmp_path / "tables")
    command = ["create", "--kind", "command", "--command", "reboot", "--devices", "d1"]
    assert ota(root, *command, "--arg", "delay=5", "--arg", "delay=6") == 2
    assert capsys.readouterr().err == "timestone ota create: --arg: 'delay' given twice\n"
    with pytest.raises(SystemExit) as refused:
        ota(root, *command, "--phase", "10%,wait=1d,wait=2d")
    assert refused.value.code == 2
    assert "phase setting 'wait' given twice in '10%,wait=1d,wait=2d'" in capsys.readouterr().err
    assert not (tmp_path / "tables").exists()


def test_every_problem_of_an_action_is_listed(tmp_path, capsys):
    root = str(tmp_path / "tables")
    argv = ["create", "--all", "--version", "2.0.0", "--url", "notaurl", "--sha256", "abc", "--size", "-5"]
    assert ota(root, *argv) == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":")[1].strip() for line in lines] == [
        "--url (payload.url)",
        "--sha256 (payload.sha256)",
        "--size (payload.size)",
    ]


def test_a_group_is_checked_against_the_devices_table(tmp_path, capsys):
    root = str(tmp_path / "tables")
    store = open_table_store(None, root, backend="delta-rs")
    register_devices(store, {"dev-1": "canary", "dev-2": "fleet"})
    assert ota(root, "create", "--group", "canary", *FIRMWARE) == 0
    assert ota(root, "create", "--group", "later", *FIRMWARE) == 2
    assert "groups in the devices table: canary, fleet" in capsys.readouterr().err
    assert ota(root, "create", "--group", "later", "--allow-unknown-group", *FIRMWARE) == 0
    assert sorted(r["target"]["group"] for r in actions(root)) == ["canary", "later"]


def _summarised(store, action_id: str, state: str) -> None:
    """The summary row the actions job writes when an action ends."""
    counts = {f"{s.lower()}_count": 0 for s in ("QUEUED", "IN_PROGRESS", "FAILED", "TIMED_OUT", "REJECTED")}
    now = datetime.now(UTC)
    row = {
        "action_id": action_id,
        **counts,
        "succeeded_count": 2,
        "canceled_count": 0,
        "total_count": 2,
        "action_state": state,
        "updated_at": now,
    }
    table = pa.Table.from_pylist([row], schema=store.spec("action_summary").arrow_schema)
    store.merge("action_summary", table, "tests/summary", int(time.time() * 1000))


def test_cancel_sets_the_flag_once_and_refuses_unknown_and_ended_actions(tmp_path, capsys):
    root = str(tmp_path / "tables")
    argv = ["create", "--id", "c-1", "--kind", "command", "--command", "reboot", "--arg", "delay=5"]
    assert ota(root, *argv, "--devices", "d1,d2") == 0
    assert ota(root, "cancel", "c-1") == 0
    assert ota(root, "cancel", "c-1") == 0
    out = capsys.readouterr().out
    assert "cancel requested for c-1" in out and "cancel already requested for c-1" in out
    assert ota(root, "cancel", "nope") == 1
    assert "no action 'nope'" in capsys.readouterr().err
    table = open_table_store(None, root, backend="delta-rs").read_arrow("actions")
    row = table.filter(pc.equal(table["id"], "c-1")).to_pylist()
    assert len(row) == 1 and row[0]["cancel"] is True
    assert row[0]["target"]["device_ids"] == ["d1", "d2"] and dict(row[0]["payload"]["args"]) == {
        "delay": "5"
    }

    store = open_table_store(None, root, backend="delta-rs")
    assert ota(root, "create", "--id", "done", "--devices", "d1,d2", *FIRMWARE) == 0
    _summarised(store, "done", "COMPLETED")
    assert ota(root, "cancel", "done") == 1
    assert "action done has ended (COMPLETED): nothing to cancel" in capsys.readouterr().err
    assert [r["cancel"] for r in actions(root) if r["id"] == "done"] == [False]


def test_writes_made_again_after_another_tool_deleted_the_row_are_written(tmp_path, capsys):
    """Each command's write was marked done under an app id of its action (``operator/create/<id>``, batch 0)
    and a device registration under one app id with the time as its batch: after a notebook deleted the
    action's row, ``create`` and ``cancel`` of the same id printed success and wrote nothing, and a
    registration from a host whose clock is behind the last one's was skipped."""
    from pipelines.actions.registry import register_devices as register

    root = str(tmp_path / "tables")
    store = open_table_store(None, root, backend="delta-rs")
    argv = ["create", "--id", "again", "--kind", "command", "--command", "reboot", "--devices", "d1"]
    assert ota(root, *argv) == 0
    assert ota(root, "cancel", "again") == 0
    DeltaTable(store.location("actions")).delete("id = 'again'")
    assert ota(root, *argv) == 0
    assert [(r["id"], r["cancel"]) for r in actions(root)] == [("again", False)]
    assert ota(root, "cancel", "again") == 0
    assert [(r["id"], r["cancel"]) for r in actions(root)] == [("again", True)]
    assert "cancel requested for again" in capsys.readouterr().out

    now = datetime.now(UTC)
    assert register(store, ["c-0"], "ahead", now.replace(year=now.year + 1)) == (1, 1)
    assert register(store, ["c-1"], "behind", now) == (1, 1)  # this host's clock a year behind the last
    registered = store.read_arrow("devices").to_pylist()
    assert sorted((r["device_id"], r["group"]) for r in registered) == [("c-0", "ahead"), ("c-1", "behind")]


def test_a_row_created_after_the_year_9999_is_shown_and_refused_not_a_traceback(tmp_path, capsys):
    """A row written by hand with ``created_at`` in nanoseconds as microseconds (about the year 58,900)."""
    root = str(tmp_path / "tables")
    assert ota(root, "create", "--id", "far", "--devices", "d1", *FIRMWARE) == 0
    location = open_table_store(None, root, backend="delta-rs").location("actions")
    table = DeltaTable(location).to_pyarrow_table()
    at = table.schema.get_field_index("created_at")
    ticks = pa.array([int(time.time() * 1e6) * 1000], pa.timestamp("us", tz="UTC"))
    write_deltalake(location, table.set_column(at, table.field(at), ticks), mode="overwrite")
    capsys.readouterr()

    assert ota(root, "status") == 0 and "far" in capsys.readouterr().out
    assert ota(root, "status", "far") == 0
    out = capsys.readouterr().out
    assert (
        "WAITING" in out
        and "will reject it, sending nothing: created_at: a timestamp after the year 9999" in out
    )
    expected = "far's row cannot be read (created_at: a timestamp after the year 9999"
    assert ota(root, "cancel", "far") == 1
    assert expected in capsys.readouterr().err
    assert ota(root, "end", "far") == 1
    assert expected in capsys.readouterr().err
    assert ota(root, "create", "--id", "far", "--devices", "d1", *FIRMWARE) == 0  # the same content: a retry
    assert DeltaTable(location).to_pyarrow_table().num_rows == 1


def test_an_actions_table_written_by_hand_in_another_layout_is_refused_in_one_line(tmp_path, capsys):
    """A table made by ``write_deltalake`` from a pandas frame, with only the columns its writer thought of:
    ``status`` reads its rows; ``cancel``, ``end`` and ``create`` refuse to write to it, naming the column."""
    import pandas as pd

    root = str(tmp_path / "tables")
    location = open_table_store(None, root, backend="delta-rs").location("actions")
    frame = pd.DataFrame(
        {
            "id": ["by-hand"],
            "kind": ["command"],
            "target": [{"group": "g1"}],
            "payload": [{"command": "reboot"}],
            "created_at": [pd.Timestamp("2026-11-01T12:00:00Z")],
        }
    )
    write_deltalake(location, frame)
    assert ota(root, "status", "by-hand") == 0 and "command reboot" in capsys.readouterr().out
    for argv in (
        ["cancel", "by-hand"],
        ["end", "by-hand"],
        ["create", "--id", "new", "--group", "g1", "--allow-unknown-group", *FIRMWARE],
    ):
        assert ota(root, *argv) == 1
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"timestone ota {argv[0]}: the actions table at "), err
        assert "not the layout the actions job reads and writes" in err[0]
    assert DeltaTable(location).version() == 0  # nothing written


@pytest.mark.parametrize(
    ("columns", "named"),
    [
        (
            {"id": pa.array([1], pa.int64()), "kind": ["ota"]},
            "actions.id: table has bigint, spec says string",
        ),
        ({"id": ["as-text"], "target": ["all"]}, "actions.target: table has string, spec says struct<"),
        ({"kind": ["ota"], "target": [{"all": True}]}, "actions.id: column missing"),
    ],
)
def test_an_actions_table_whose_columns_hold_other_kinds_of_value_is_refused_by_every_verb(
    tmp_path, capsys, columns, named
):
    """A table another tool made with ``write_deltalake`` whose ids are numbers, whose target is text, or
    that has no id: ``status``, ``cancel``, ``end`` and ``create`` each say so in one line (exit 1), where
    they ended in a traceback (ArrowNotImplementedError, AttributeError, KeyError); nothing is written."""
    root = str(tmp_path / "tables")
    location = open_table_store(None, root, backend="delta-rs").location("actions")
    write_deltalake(location, pa.table(columns))
    for argv in (
        ["status"],
        ["status", "1"],
        ["cancel", "1"],
        ["end", "1"],
        ["create", "--id", "new", "--all", *FIRMWARE],
    ):
        assert ota(root, *argv) == 1, argv
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"timestone ota {argv[0]}: the actions table at "), err
        assert named in err[0]
    assert DeltaTable(location).version() == 0


def test_status_reads_rows_written_by_hand_with_nulls_and_says_what_the_job_will_reject(tmp_path, capsys):
    """A table written with every column nullable (a writer's own schema): a row without an id, one without
    a kind; ``status`` lists them all and says, before any job ran, why one will be rejected."""
    root = str(tmp_path / "tables")
    store = open_table_store(None, root, backend="delta-rs")
    schema = store.spec("actions").arrow_schema
    nullable = pa.schema([column.with_nullable(True) for column in schema])
    now = datetime.now(UTC)
    common = {"target": {"group": "g"}, "payload": {"command": "reboot"}, "created_at": now, "cancel": False}
    rows = [
        {**common, "id": None, "kind": "command"},
        {**common, "id": "no-kind", "kind": None},
        {**common, "id": "fine", "kind": "command"},
    ]
    write_deltalake(store.location("actions"), pa.Table.from_pylist(rows, schema=nullable))
    capsys.readouterr()
    assert ota(root, "status") == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed[1:4]] == ["no-kind", "fine", "-"]  # newest first, then by id
    assert ota(root, "status", "no-kind") == 0
    out = capsys.readouterr().out
    assert "state     WAITING: the actions job has not picked it up yet" in out
    assert "rejects   the actions job will reject it, sending nothing: kind: unknown kind None" in out
    assert ota(root, "status", "fine") == 0
    assert "rejects" not in capsys.readouterr().out


def test_status_says_an_action_waits_for_the_job_and_whether_one_runs(tmp_path, capsys):
    root = str(tmp_path / "tables")
    assert ota(root, "status") == 0
    assert "no actions yet" in capsys.readouterr().out
    assert ota(root, "create", "--id", "w-1", "--devices", "dev-1", *FIRMWARE, "--timeout", "600") == 0
    capsys.readouterr()

    assert ota(root, "status", "w-1") == 0
    out = capsys.readouterr().out
    assert "target    1 device: dev-1" in out and "firmware 2.0.0 from https://example.invalid/fw.bin" in out
    assert "timeout 600 s per device" in out and "created   20" in out
    assert "state     WAITING: the actions job has not picked it up yet" in out
    assert "actions job: no actions job has run against" in out and "timestone pipeline actions" in out

    now = int(time.time() * 1000)
    write_heartbeat(root, Heartbeat("edge-host", 4242, now - 3_600_000, now - 120_000))
    assert ota(root, "status") == 0
    out = capsys.readouterr().out
    assert "w-1" in out and "WAITING" in out
    assert "actions job: not running (no heartbeat for over 30 s) on edge-host (pid 4242)" in out

    write_heartbeat(root, Heartbeat("edge-host", 4242, now - 3_600_000, now))
    assert ota(root, "status", "w-1") == 0
    assert "actions job: running on edge-host (pid 4242), last heartbeat" in capsys.readouterr().out

    assert ota(root, "status", "nope") == 1
    assert "no action 'nope'" in capsys.readouterr().err
    assert ota(root, "status", "--watch") == 2
    assert "--watch follows one action" in capsys.readouterr().err


def test_actions_pipeline_refuses_a_bad_config_naming_the_field(tmp_path, capsys):
    config = tmp_path / "actions.yaml"
    config.write_text("brokers:\n  - name: edge1\n    mqtt_port: 70000\n")
    assert main(["pipeline", "actions", "--config", str(config)]) == 2
    assert "brokers[0].mqtt_port" in capsys.readouterr().err
    config.write_text("tick_interval: 1\n")
    assert main(["pipeline", "actions", "--config", str(config)]) == 2
    assert "tick_interval" in capsys.readouterr().err


def test_actions_pipeline_whose_token_a_broker_refuses_ends_as_no_restart_fixes(tmp_path, capsys):
    """A broker whose offsets API refuses the job's token (401) as the job asks whether the brokers form a
    cluster: the actions job ended with exit status 2 (a wrong configuration), where the telemetry job, and
    a running query failing on the token, end with 5, the status the systemd unit does not restart. Both
    jobs now end the same way, in one line naming the broker."""
    broker = EdgeBroker(tmp_path / "edge", token="the-right-token")
    try:
        config = tmp_path / "actions.yaml"
        config.write_text(
            f"tables_root: {tmp_path / 'tables'}\ncheckpoint_root: {tmp_path / 'checkpoints'}\n"
            f"brokers:\n  - name: edge1\n    offsets_api: {broker.url}\n    token: a-wrong-token\n"
        )
        assert main(["pipeline", "actions", "--config", str(config)]) == NOT_RESTARTABLE
    finally:
        broker.close()
    err = capsys.readouterr().err
    said = "timestone pipeline actions: failed, not restarted: broker refused the token: "
    assert err.startswith(f"{said}edge1 ({broker.url}): ") and "brokers[].token" in err, err
    assert "Traceback" not in err, err


def test_a_tables_root_that_cannot_be_written_is_refused_by_name(capsys):
    assert main(["ota", "--tables-root", "/etc/hostname", "create", "--all", *FIRMWARE]) == 2
    err = capsys.readouterr().err
    assert err == "timestone ota create: --tables-root: '/etc/hostname' is a file, not a directory\n"


def test_an_empty_tables_root_and_one_delta_rs_would_read_elsewhere_are_refused_in_one_line(
    tmp_path, capsys, monkeypatch
):
    """``--tables-root ""`` (a shell variable unset) wrote under the default root; a root holding '%20' ended
    every verb and ``devices register`` in a traceback."""
    monkeypatch.chdir(tmp_path)
    escaped = str(tmp_path / "pct%20lake")
    for root, said in (("", "--tables-root: must not be empty"), (escaped, "holds a '%' and two hex digits")):
        for argv in (
            ["ota", "--tables-root", root, "create", "--all", *FIRMWARE],
            ["ota", "--tables-root", root, "status"],
        ):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert said in err and "Traceback" not in err and len(err.splitlines()) == 1, err
        assert main(["devices", "register", "--tables-root", root, "--group", "g", "d-1"]) == 2
        assert said in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # nothing written, the default root neither


def no_file_may_grow() -> None:
    """In the child: every write to a file fails (EFBIG), as on a full disk, and the process lives on."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["ota", "create", "--kind", "command", "--command", "reboot", "--all"], "timestone ota create"),
        (["devices", "register", "--group", "g", "d1"], "timestone devices register"),
    ],
)
def test_a_table_write_that_fails_is_said_in_one_line_not_a_traceback(tmp_path, argv, said):
    """On a full disk (here: no file may grow) ``ota create`` and ``devices register`` ended in a delta-rs
    traceback."""
    root = tmp_path / "tables"
    command = [sys.executable, "-m", "pipelines.cli", *argv, "--tables-root", str(root)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, preexec_fn=no_file_may_grow)
    assert done.returncode == 1, done.stderr[-3000:]
    why = "File too large (os error 27)"
    assert done.stderr == f"{said}: writing the tables under {root} failed: {why}; nothing was committed\n"


def test_status_under_a_tables_root_that_is_a_file_says_so_not_that_there_are_no_actions(tmp_path, capsys):
    root = tmp_path / "tables"
    root.write_text("")
    assert main(["ota", "--tables-root", str(root), "status"]) == 2
    err = capsys.readouterr().err
    assert err == f"timestone ota status: --tables-root: '{root}' is a file, not a directory\n"


@pytest.mark.parametrize("interval", ["nan", "inf", "-1", "0", "1e300"])
def test_a_watch_interval_no_clock_can_wait_is_refused_in_one_line(tmp_path, capsys, interval):
    root = str(tmp_path / "tables")
    assert ota(root, "create", "--id", "w", "--devices", "d1", *FIRMWARE) == 0
    capsys.readouterr()
    assert ota(root, "status", "w", "--watch", "--interval", interval) == 2
    assert capsys.readouterr().err.splitlines() == [
        "timestone ota status: --interval must be above 0 and at most 86400 seconds, and --show at least 0"
    ]


def test_status_keeps_its_columns_under_an_id_longer_than_the_header(tmp_path, capsys):
    """A rollback's id is its action's and ``-rollback`` (25 characters for the demo's): every row's kind,
    state and count stay under their headings."""
    root = str(tmp_path / "tables")
    assert ota(root, "create", "--id", "act-6e5b2e922eb5-rollback", "--all", *FIRMWARE) == 0
    assert ota(root, "create", "--id", "fw-2", "--all", *FIRMWARE) == 0
    capsys.readouterr()
    assert ota(root, "status") == 0
    header, *rows = capsys.readouterr().out.splitlines()[:3]
    for row in rows:
        assert row.index(" ota ") + 1 == header.index("kind"), (header, row)
        assert row.index("WAITING") == header.index("state"), (header, row)


def test_a_bad_value_of_the_config_file_names_the_file_and_its_line(tmp_path, capsys):
    """``timestone ota --config FILE`` said the key of a refused value but not which file held it."""
    config = tmp_path / "actions.yaml"
    config.write_text("# the OTA job's settings\ntables_root: 5\n")
    assert main(["ota", "--config", str(config), "status", "fw-1"]) == 2
    assert capsys.readouterr().err == (
        f"timestone ota: bad config: tables_root: expected a string, got int 5 (in {config}, line 2)\n"
    )


def test_a_list_of_tens_of_thousands_of_devices_is_written_from_a_file(tmp_path, capsys):
    """20,000 listed devices (the rules allow 100,000) as ``--devices a,b,...`` are one argument of 220 KB,
    past the 128 KiB Linux passes to a program: the shell refused to run the command at all
    ('Argument list too long'), so no such action could be written with ``ota create``.
    ``--devices-from-file`` reads them one a line, as ``devices register --from-file`` does."""
    root = str(tmp_path / "tables")
    ids = [f"dev-{i:06d}" for i in range(20_000)]
    assert len(",".join(ids)) > 128 * 1024
    listed = tmp_path / "targets.txt"
    listed.write_bytes(("\ufeff# rollout wave 3\r\n" + "\r\n".join(ids) + "\r\n\r\n").encode())
    assert ota(root, "create", "--id", "wave-3", "--devices-from-file", str(listed), *FIRMWARE) == 0
    (row,) = actions(root)
    assert row["target"] == {"device_ids": ids, "group": None, "all": False}

    for path, why in [
        (tmp_path / "missing.txt", "cannot read"),
        (tmp_path / "empty.txt", "no device id given"),
        (tmp_path / "bad.txt", "cannot be part of one topic level"),
    ]:
        if path.name == "empty.txt":
            path.write_text("# nothing yet\n")
        if path.name == "bad.txt":
            path.write_text("dev-1\nsite/dev-2\n")
        capsys.readouterr()
        assert ota(root, "create", "--devices-from-file", str(path), *FIRMWARE) == 2
        err = capsys.readouterr().err
        assert err.startswith("timestone ota create: --devices-from-file") and why in err, err
    assert len(actions(root)) == 1


def test_the_job_status_suggests_starting_it_on_the_tables_and_config_status_read(tmp_path, capsys):
    """``ota status --tables-root DIR`` (as the demo prints it) said '(start one: timestone pipeline
    actions)', a job that reads conf/actions.yaml's tables_root, not DIR: the job it suggests now reads the
    tables (and the config) status read; without either option it is the plain command."""
    root = str(tmp_path / "demo tables")
    config = tmp_path / "actions.yaml"
    config.write_text(f"tables_root: {tmp_path / 'elsewhere'}\n")
    assert ota(root, "status") == 0
    out = capsys.readouterr().out
    assert f"(start one: timestone pipeline actions --set 'tables_root={root}')" in out

    assert main(["ota", "status", "--config", str(config)]) == 0
    assert f"(start one: timestone pipeline actions --config {config})" in capsys.readouterr().out

    now = int(time.time() * 1000)
    write_heartbeat(root, Heartbeat("edge-host", 4242, now - 3_600_000, now - 120_000, stopped=True))
    assert ota(root, "status") == 0
    out = capsys.readouterr().out
    assert f"(start one: timestone pipeline actions --set 'tables_root={root}')" in out


def test_an_end_before_the_action_was_created_is_a_wrong_command_line_not_a_traceback(tmp_path, capsys):
    """``ota end ID --at 2020-01-01T00:00`` of an action created today ended in a traceback of InvalidAction
    (exit 1); it is refused in one line naming --at and the field, exit 2, and nothing is written."""
    root = str(tmp_path / "tables")
    assert ota(root, "create", "--id", "e-1", "--devices", "dev-1", *FIRMWARE) == 0
    capsys.readouterr()
    assert ota(root, "end", "e-1", "--at", "2020-01-01T00:00") == 2
    err = capsys.readouterr().err
    assert err.startswith("timestone ota end: --at (schedule.end_at): 2020-01-01T00:00:00+00:00 is not after")
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert actions(root)[0]["schedule"] is None or actions(root)[0]["schedule"]["end_at"] is None
