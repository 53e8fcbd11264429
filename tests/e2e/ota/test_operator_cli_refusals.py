"""What ``timestone ota create`` and ``timestone devices register`` refuse, and with which exit status: an
option that means nothing without another, every unusable device id at once, and a tables root that cannot
be written (a failure of the tables, exit 1, not a wrong command line, exit 2)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pipelines.cli import main
from sinks import open_table_store
from tests.e2e.ota.conftest import SHA256

FIRMWARE = ["--version", "2.0.0", "--url", "https://example.invalid/fw.bin", "--sha256", SHA256]
NOBODY = 65534
REPO = Path(__file__).resolve().parents[3]


def test_a_min_executed_without_a_failure_share_is_a_wrong_command_line(tmp_path, capsys):
    """``--abort-min-executed 50`` alone was written without a word: a count of finished devices before a
    share of failures is judged, with no share to judge, aborts nothing."""
    root = str(tmp_path / "tables")
    create = ["ota", "--tables-root", root, "create", "--id", "m-1", "--all", *FIRMWARE]
    assert main([*create, "--abort-min-executed", "50"]) == 2
    assert capsys.readouterr().err == (
        "timestone ota create: --abort-min-executed needs --abort-failure-pct: it is how many devices must "
        "have finished before their share of failures aborts the action\n"
    )
    assert not open_table_store(None, root, backend="delta-rs").exists("actions")  # nothing written

    assert main([*create, "--abort-min-executed", "50", "--abort-failure-pct", "20"]) == 0
    (row,) = open_table_store(None, root, backend="delta-rs").read_arrow("actions").to_pylist()
    assert row["abort_criteria"] == {"failure_pct": 20.0, "min_executed": 50}


def test_every_unusable_device_id_is_named_in_one_refusal(tmp_path, capsys):
    """A list with several ids that cannot be one topic level was refused naming the first only: the
    operator fixed it, ran again and learned of the next. Every one is named at once, in one line."""
    root = str(tmp_path / "tables")
    create = ["ota", "--tables-root", root, "create", *FIRMWARE]
    assert main([*create, "--devices", "dev-1,site/dev-2,dev-3,dev+4,dev#5"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "timestone ota create: --devices (target.device_ids): 3 device ids cannot be used: [1] 'site/dev-2', "
        "[3] 'dev+4', [4] 'dev#5': contains '/', '+' or '#', which cannot be part of one topic level"
    ]

    listed = tmp_path / "wave.txt"
    bad = [f"site/dev-{number}" for number in range(25)]
    listed.write_text("\n".join(["dev-0", *bad, "x" * 129]) + "\n")
    assert main([*create, "--devices-from-file", str(listed)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("timestone ota create: --devices-from-file (target.device_ids): 26 device ids ")
    shown = [f"[{index}] 'site/dev-{index - 1}'" for index in range(1, 21)]
    assert ", ".join(shown) + ": contains '/'" in line and "'site/dev-20'" not in line
    assert line.endswith("; and 6 more"), line
    assert not open_table_store(None, root, backend="delta-rs").exists("actions")


def test_register_names_every_unusable_device_id_in_one_refusal(tmp_path, capsys):
    root = str(tmp_path / "tables")
    register = ["devices", "register", "--tables-root", root, "--group", "g"]
    assert main([*register, "d-1", "d+2", "", "d/4"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        "timestone devices register: 3 device ids cannot be used: [1] 'd+2', [3] 'd/4': contains '/', '+' "
        "or '#', which cannot be part of one topic level; [2] '': must not be empty"
    ]
    assert not open_table_store(None, root, backend="delta-rs").exists("devices")


@contextlib.contextmanager
def tables_made_read_only(read_only: Callable[[Path], list[Path]]) -> Iterator[Path]:
    """A tables root holding an action and registered devices, outside pytest's temporary tree (which only
    root may enter), then the directories ``read_only(root)`` names made read-only (``chmod 0555``)."""
    assert os.geteuid() != 0 or shutil.which("setpriv"), "root writes whatever the mode says: needs setpriv"
    base = Path(tempfile.mkdtemp(prefix="timestone-read-only-"))
    base.chmod(0o755)
    root = base / "tables"
    assert main(["ota", "--tables-root", str(root), "create", "--id", "a-1", "--all", *FIRMWARE]) == 0
    assert main(["devices", "register", "--tables-root", str(root), "--group", "g", "d-1"]) == 0
    directories = read_only(root)
    for directory in directories:
        directory.chmod(0o555)
    try:
        yield root
    finally:
        for directory in directories:
            directory.chmod(0o755)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def read_only_root() -> Iterator[Path]:
    """A tables root made read-only, its directories too."""
    with tables_made_read_only(
        lambda root: [root, *(path for path in root.rglob("*") if path.is_dir())]
    ) as root:
        yield root


@pytest.fixture
def read_only_tables() -> Iterator[Path]:
    """A tables root anyone may write whose tables' folders are read-only, their logs too."""
    with tables_made_read_only(lambda root: [path for path in root.rglob("*") if path.is_dir()]) as root:
        root.chmod(0o777)
        yield root


def as_unprivileged(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``timestone ARGV`` run as a user the directory's mode binds (nobody, when the tests run as root)."""
    command = [sys.executable, "-m", "pipelines.cli", *argv]
    if os.geteuid() == 0:
        command = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


WRITES = pytest.mark.parametrize(
    "argv",
    [
        ["devices", "register", "--group", "g", "d-2"],
        ["ota", "create", "--all", *FIRMWARE],
        ["ota", "cancel", "a-1"],
        ["ota", "end", "a-1"],
    ],
    ids=["register", "create", "cancel", "end"],
)
"""The commands that write the tables."""


@WRITES
def test_a_read_only_tables_root_is_a_failure_of_the_tables_not_of_the_command_line(read_only_root, argv):
    """A right command line whose tables cannot be written ended with exit status 2, a wrong command line,
    where docs/ota.md promises 1 for tables that cannot be written: 1, in one line, nothing written."""
    root = read_only_root
    done = as_unprivileged([*argv[:2], "--tables-root", str(root), *argv[2:]])
    command = f"timestone {' '.join(argv[:2])}"
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr == (
        f"{command}: --tables-root: '{root}' cannot be written: no write permission on '{root}'\n"
    )
    store = open_table_store(None, str(root), backend="delta-rs")
    assert [row["id"] for row in store.read_arrow("actions").to_pylist()] == ["a-1"]
    assert store.read_arrow("devices").column("device_id").to_pylist() == ["d-1"]


@WRITES
def test_a_read_only_table_under_a_writable_root_is_said_in_one_line_before_any_write(read_only_tables, argv):
    """A table's folder this user may not write, under a root it may: delta-rs failed in the middle of the
    write and printed a Rust panic before the command's line. The folder is named, exit 1, nothing
    written."""
    root = read_only_tables
    done = as_unprivileged([*argv[:2], "--tables-root", str(root), *argv[2:]])
    table = root / ("devices" if argv[0] == "devices" else "actions")
    assert done.returncode == 1, done.stderr[-3000:]
    assert done.stderr == (
        f"timestone {' '.join(argv[:2])}: --tables-root: '{root}' cannot be written: no write permission "
        f"on '{table}'\n"
    )
    store = open_table_store(None, str(root), backend="delta-rs")
    assert [row["id"] for row in store.read_arrow("actions").to_pylist()] == ["a-1"]
    assert store.read_arrow("devices").column("device_id").to_pylist() == ["d-1"]
