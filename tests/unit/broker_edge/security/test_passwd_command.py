"""``timestone passwd`` on real files: it edits only a file the broker loads, never loses a user to another
run editing the same file, refuses a user name that would break the file's lines, and keeps the owner, group
and mode an operator gave the file (a broker running as its own user reads it)."""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from broker_edge.security.auth import PasswordFile, PasswordFileError, passwd_main

MOSQUITTO_LINE = (
    "mq:$7$101$9dy7CedXdQ9NFH8u$UW0T2YuyXSIEoXNsqwCbMasE3Ye+8+pyIo3+orG7ivXXao0JeVFrR3QeAgabOEpmJGbc4yT6"
)
SERVICE_GID = 65534  # nogroup: the service's group of these tests


def passwd(*argv: str) -> int:
    return passwd_main(list(argv), prompt=lambda _: pytest.fail("no prompt expected"))


@pytest.fixture
def users(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "passwd"
    assert passwd("-c", str(path), "u1", "--password", "p1") == 0
    capsys.readouterr()
    return path


@pytest.mark.parametrize(
    ("edit", "line", "why"),
    [
        (
            lambda text: text + MOSQUITTO_LINE + "\n",
            2,
            "unknown algorithm '7' (known: scrypt, pbkdf2-sha512)",
        ),
        (lambda text: text + text, 2, "user 'u1' appears twice"),
        (lambda text: "# users\r\n" + text + "dev\u2028x:" + text.partition(":")[2], 3, "line separators"),
    ],
)
@pytest.mark.parametrize(
    "argv", [("u2", "--password", "p2"), ("u1", "--password", "new"), ("u1", "--delete")]
)
def test_an_edit_that_leaves_a_file_the_broker_refuses_is_not_made(
    users: Path, capsys: pytest.CaptureFixture[str], edit: object, line: int, why: str, argv: tuple[str, ...]
) -> None:
    assert callable(edit)
    users.write_text(edit(users.read_text()))
    before = users.read_bytes()
    with pytest.raises(PasswordFileError) as broker:
        PasswordFile.load(users)
    assert broker.value.line == line and why in str(broker.value)
    if argv == ("u1", "--delete") and "appears twice" in why:
        assert (
            passwd(str(users), *argv) == 0
        )  # both of u1's lines go: what is left is a file the broker takes
        assert PasswordFile.load(users).verify("u1", b"p1") is False
        return
    assert passwd(str(users), *argv) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"timestone passwd: error: {broker.value}: the broker refuses this file, so it is left as it is; "
        f"correct or remove line {line} (--delete of its user removes it), then run this again\n"
    )
    assert users.read_bytes() == before


def test_a_new_password_for_the_user_of_the_line_the_broker_refuses_repairs_the_file(users: Path) -> None:
    users.write_text(users.read_text() + MOSQUITTO_LINE + "\n")
    assert passwd(str(users), "mq", "--password", "fresh") == 0
    assert PasswordFile.load(users).verify("mq", b"fresh")
    assert PasswordFile.load(users).verify("u1", b"p1")


@pytest.mark.parametrize("separator", ["\u2028", "\u2029", "\x85", "\x1e", "\x0b", "\x0c", "\r"])
def test_a_user_name_holding_a_line_separator_is_refused(
    users: Path, capsys: pytest.CaptureFixture[str], separator: str
) -> None:
    before = users.read_bytes()
    assert passwd(str(users), f"dev{separator}x", "--password", "x") == 1
    assert capsys.readouterr().err == (
        "timestone passwd: error: username must not contain control characters or line separators\n"
    )
    assert users.read_bytes() == before
    assert PasswordFile.load(users).users == ["u1"]


def test_lines_end_at_a_newline_only_and_a_crlf_file_loads_and_is_edited(users: Path) -> None:
    """The broker splits lines where the command ends them: a comment holding U+2028 is one comment line."""
    users.write_bytes(b"# plant \xe2\x80\xa8 devices\r\n" + users.read_bytes().replace(b"\n", b"\r\n"))
    assert PasswordFile.load(users).users == ["u1"]
    assert passwd(str(users), "u2", "--password", "p2") == 0
    assert users.read_text(encoding="utf-8").split("\n")[0] == "# plant \u2028 devices"
    loaded = PasswordFile.load(users, cache=False)
    assert loaded.users == ["u1", "u2"] and loaded.verify("u2", b"p2")


def test_a_file_saved_with_a_byte_order_mark_logs_its_first_user_in(users: Path) -> None:
    """An editor that saves UTF-8 with a BOM (Notepad) puts U+FEFF before the first user name: that user is
    the user the file names, not one no client can type."""
    users.write_bytes(b"\xef\xbb\xbf" + users.read_bytes().replace(b"\n", b"\r\n"))
    loaded = PasswordFile.load(users, cache=False)
    assert loaded.users == ["u1"] and loaded.verify("u1", b"p1")
    assert passwd(str(users), "u2", "--password", "p2") == 0
    assert not users.read_bytes().startswith(b"\xef\xbb\xbf")
    loaded = PasswordFile.load(users, cache=False)
    assert loaded.users == ["u1", "u2"] and loaded.verify("u1", b"p1") and loaded.verify("u2", b"p2")


def test_concurrent_runs_lose_no_user(users: Path) -> None:
    results: list[int] = []
    runs = [
        threading.Thread(
            target=lambda n=n: results.append(passwd(str(users), f"user{n}", "--password", f"p{n}"))
        )
        for n in range(8)
    ]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    assert results == [0] * 8
    assert sorted(PasswordFile.load(users).users) == ["u1", *(f"user{n}" for n in range(8))]


def test_a_run_waits_while_another_holds_the_files_lock(users: Path) -> None:
    lock = users.with_name(".passwd.lock")
    assert lock.exists()
    descriptor = os.open(lock, os.O_RDWR)
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    results: list[int] = []
    run = threading.Thread(target=lambda: results.append(passwd(str(users), "u2", "--password", "p2")))
    run.start()
    try:
        time.sleep(0.5)  # the hash takes ~50 ms: by now it waits on the lock
        assert run.is_alive() and PasswordFile.load(users).users == ["u1"]
    finally:
        os.close(descriptor)
    run.join()
    assert results == [0] and PasswordFile.load(users).users == ["u1", "u2"]


def test_a_missing_file_without_create_is_refused_and_nothing_is_made(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert passwd(str(tmp_path / "passwd"), "u1", "--password", "p") == 1
    assert "file not found (use -c to create it)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_file_keeps_the_owner_group_and_mode_the_operator_gave_it(
    users: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert stat.S_IMODE(users.stat().st_mode) == 0o600, "a new file is its owner's only"
    if os.geteuid() != 0:
        pytest.skip("only root gives a file to another group it is not in")
    os.chown(users, 0, SERVICE_GID)
    users.chmod(0o640)
    assert passwd(str(users), "u2", "--password", "p2") == 0
    assert passwd(str(users), "u1", "--delete") == 0
    assert (users.stat().st_gid, stat.S_IMODE(users.stat().st_mode)) == (SERVICE_GID, 0o640)
    assert PasswordFile.load(users).users == ["u2"]

    def fchown(descriptor: int, uid: int, gid: int) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "fchown", fchown)  # a writer that may give neither owner nor group
    assert passwd(str(users), "u3", "--password", "p3") == 0
    assert (users.stat().st_gid, stat.S_IMODE(users.stat().st_mode)) == (os.getegid(), 0o600)


@pytest.mark.parametrize("through_a_link", [False, True])
def test_a_path_that_is_not_a_regular_file_is_refused_and_left_as_it_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], through_a_link: bool
) -> None:
    """``timestone passwd -c /dev/null u`` (a mistyped path, run as root) replaced the device by a regular
    file holding the user, and left a ``.null.lock`` beside it: a pipe, a device or a socket is refused,
    before anything is read or made, and stays what it was."""
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    path = tmp_path / "link" if through_a_link else pipe
    if through_a_link:
        path.symlink_to(pipe)
    writer = threading.Thread(target=lambda: os.close(os.open(pipe, os.O_WRONLY)), daemon=True)
    writer.start()  # a reader of the pipe reads an empty file rather than waiting for ever
    try:
        assert passwd("-c", str(path), "u1", "--password", "p1") == 1
        assert f"{os.path.realpath(pipe)}: not a regular file" in capsys.readouterr().err
        assert stat.S_ISFIFO(pipe.stat().st_mode) and path.exists()
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted({"pipe", path.name})
    finally:
        if writer.is_alive():
            os.close(os.open(pipe, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(5)


def test_a_file_in_a_directory_that_does_not_exist_names_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``passwd -c /etc/timestone/passwd u`` before ``/etc/timestone`` is made said ``[Errno 2] No such file
    or directory: '/etc/timestone/.passwd.lock'``, a file the operator never named."""
    path = tmp_path / "missing" / "passwd"
    assert passwd("-c", str(path), "u1", "--password", "p1") == 1
    err = capsys.readouterr().err
    assert err == f"timestone passwd: error: {path}: no directory {tmp_path / 'missing'} (make it first)\n"
    assert list(tmp_path.iterdir()) == []


def test_a_password_piped_in_on_one_line_is_taken_without_prompts_or_warnings(tmp_path: Path) -> None:
    """``echo "$PW" | timestone passwd -c FILE u`` (a script keeping the password out of the process list)
    printed Python's GetPassWarning with its source path, "Password input may be echoed" twice, then failed
    with 'no password given', the confirmation finding the pipe at its end."""
    path = tmp_path / "passwd"
    command = [sys.executable, "-m", "pipelines.cli", "passwd", "-c", str(path), "u1"]
    done = subprocess.run(command, input="p 1\n", capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    assert PasswordFile.load(path).verify("u1", b"p 1")
    empty = subprocess.run([*command[:-1], "u2"], input="", capture_output=True, text=True, timeout=60)
    assert empty.returncode == 1
    assert empty.stderr == (
        "timestone passwd: error: no password given (standard input is no terminal: give the password on "
        "its first line, or --password)\n"
    )
