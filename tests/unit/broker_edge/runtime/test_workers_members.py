"""A ``--workers`` member's process tells its command when it serves or why it could not start: an exit
before it ever served with status 2 (configuration error) or 1 (cannot start) ends the command with that
status and reason; anything else is a crash, recovered from by starting it again."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from broker_edge.runtime.workers_members import Member, remove_pid_file
from broker_edge.runtime.workers_supervision import pass_on_due_sighups, pass_on_sighup

Tell = Callable[[str | None], None]


def ended(member: Member) -> int:
    assert member.pid is not None
    _, status = os.waitpid(member.pid, 0)
    return status


def member(tmp_path: Path, run: Callable[[str, str, Tell], int]) -> Member:
    return Member("w0", tmp_path / "w0.yaml", cast(Any, None), run)


def test_a_configuration_error_before_serving_is_told_with_its_reason(tmp_path):
    def run(config: str, node: str, tell: Tell) -> int:
        tell("storage.directory: the data directory\nis in use")
        return 2

    each = member(tmp_path, run)
    each.start([])
    assert (tmp_path / "w0.pid").read_text() == f"{each.pid}\n"
    assert each.failed_to_start(ended(each)) == (2, "storage.directory: the data directory is in use")
    assert not (tmp_path / "w0.pid").exists()
    assert each.reports is None and each.pid is None


def test_an_exit_1_without_a_reason_before_serving_is_said_so(tmp_path):
    each = member(tmp_path, lambda config, node, tell: 1)
    each.start([])
    assert each.failed_to_start(ended(each)) == (1, "member w0 exited (status 1) before it served")


def test_a_member_that_served_once_is_started_again_whatever_its_status(tmp_path):
    marker = tmp_path / "served"

    def run(config: str, node: str, tell: Tell) -> int:
        if marker.exists():
            tell("storage.directory: broken since")
            return 2
        marker.touch()
        tell(None)
        return 1

    each = member(tmp_path, run)
    each.start([])
    assert each.failed_to_start(ended(each)) is None
    assert each.served
    each.start([])  # a later process of it that cannot start: still a member that served, started again
    assert each.failed_to_start(ended(each)) is None


def test_a_member_killed_by_a_signal_before_serving_is_a_crash(tmp_path):
    def run(config: str, node: str, tell: Tell) -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(10)
        return 0

    each = member(tmp_path, run)
    each.start([])
    assert each.failed_to_start(ended(each)) is None


def test_a_pid_file_is_removed_only_while_it_names_the_process(tmp_path):
    path = tmp_path / "w0.pid"
    path.write_text("123\n")
    remove_pid_file(path, 456)
    assert path.read_text() == "123\n"
    remove_pid_file(path, 123)
    assert not path.exists()
    remove_pid_file(path, 123)  # gone already: nothing to do


def test_a_sighup_while_a_member_starts_is_passed_on_once_it_serves(tmp_path):
    go, hup = tmp_path / "go", tmp_path / "hup"

    def run(config: str, node: str, tell: Tell) -> int:
        while not go.exists():  # starting: SIGHUP ignored, as until a broker's loop takes it
            time.sleep(0.01)
        signal.signal(signal.SIGHUP, lambda signum, frame: hup.touch())
        tell(None)
        deadline = time.monotonic() + 20
        while not hup.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return 0 if hup.exists() else 3

    each = member(tmp_path, run)
    each.start([])
    try:
        pass_on_sighup([each])
        assert each.reload_due and not each.serving
        time.sleep(0.2)
        assert not hup.exists()
        pass_on_due_sighups([each])  # not serving yet: nothing sent
        go.touch()
        deadline = time.monotonic() + 20
        while not each.serving and time.monotonic() < deadline:
            time.sleep(0.01)
            each.read_reports()
        pass_on_due_sighups([each])
        assert not each.reload_due
        assert os.waitstatus_to_exitcode(ended(each)) == 0
        assert hup.exists()
    finally:
        go.touch()
        hup.touch()
