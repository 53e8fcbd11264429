"""``timestone broker --workers 2`` and the configuration file it is given:

- a file that can be read once (``-c <(envsubst < broker.yaml)``, a named pipe) is read once: the members
  serve what it says (they served the defaults, the pipe read empty a second time) and ``--check`` ends
  (it waited for a second writer on a named pipe);
- an error a member finds names the user's file and its line, not the member's generated file.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from broker_edge.runtime.launcher import free_ports
from tests.e2e.cluster.test_workers import stop_workers
from tests.harness.local_cluster import wait_until

pytestmark = pytest.mark.timeout(120)


def config_text(directory: Path, port: int, extra: str = "") -> str:
    api, admin = free_ports(2)
    return (
        f"listeners:\n  - {{name: default, host: 127.0.0.1, port: {port}}}\n"
        f"storage: {{directory: {directory / 'data'}}}\n"
        f"offsets_api: {{port: {api}}}\n"
        f"admin_http: {{port: {admin}}}\n" + extra
    )


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cli", "broker", *args]


def serving(config: str, log: Path, **popen: Any) -> subprocess.Popen[bytes]:
    """``timestone broker --config CONFIG --workers 2`` with its output in ``log``, once its two members
    serve or it has exited (``popen``: more of ``subprocess.Popen``'s arguments)."""
    with open(log, "wb") as output:
        process = subprocess.Popen(
            command("--config", config, "--workers", "2"),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **popen,
        )
    try:
        wait_until(lambda: b"2 members serving" in log.read_bytes() or process.poll() is not None, 60, "up")
    except BaseException:
        stop_workers(process)
        raise
    return process


def test_a_configuration_given_through_a_pipe_is_what_the_members_serve(tmp_path):
    """``-c <(envsubst < broker.yaml)``: the command read the pipe, then read it again for the members'
    configurations and found it empty: they served the defaults (port 1883) while the command held the
    configured port. It is read once."""
    port = free_ports(1)[0]
    reading, writing = os.pipe()
    os.write(writing, config_text(tmp_path, port).encode())
    os.close(writing)
    log = tmp_path / "command.log"
    try:
        process = serving(f"/dev/fd/{reading}", log, pass_fds=(reading,))
    finally:
        os.close(reading)
    try:
        said = log.read_text()
        assert f"listening: default tcp on 127.0.0.1:{port}" in said, said[-3000:]
        assert "127.0.0.1:1883" not in said, said[-3000:]
    finally:
        stop_workers(process)


def test_check_with_workers_reads_a_named_pipe_once(tmp_path):
    """``--check --workers 2 -c FIFO`` read the FIFO twice: the second open waited for a writer for ever."""
    fifo = tmp_path / "broker.yaml"
    os.mkfifo(fifo)
    text = config_text(tmp_path, free_ports(1)[0]).encode()

    def write_once() -> None:
        with open(fifo, "wb") as pipe:
            pipe.write(text)

    writer = threading.Thread(target=write_once, daemon=True)
    writer.start()
    try:
        done = subprocess.run(
            command("--check", "--config", str(fifo), "--workers", "2"),
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:  # the command is killed
        raise AssertionError("--check waited on the named pipe") from None
    assert done.returncode == 0 and "configuration OK" in done.stdout, done


def test_a_configuration_error_a_member_finds_names_the_file_given_and_its_line(tmp_path):
    """A password file the members refuse (found when each starts, not by the command): the error named
    ``.../workers/w1.yaml, line 18``, a file the command writes, twice more from the members themselves.
    It names the file given and the line of ``auth.password_file`` there, once."""
    passwords = tmp_path / "passwd"
    passwords.write_text("alice:not-a-hash\n")
    passwords.chmod(0o600)
    config = tmp_path / "broker.yaml"
    config.write_text(config_text(tmp_path, free_ports(1)[0], f"auth:\n  password_file: {passwords}\n"))
    done = subprocess.run(
        command("--config", str(config), "--workers", "2"), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done
    said = [line for line in done.stderr.splitlines() if "configuration error" in line]
    assert len(said) == 1, done.stderr
    assert "workers/w" not in said[0], said
    assert f"{passwords}:1" in said[0] and f"(in {config}, line 7)" in said[0], said


def test_a_value_taken_from_the_environment_reaches_the_members_not_their_files(tmp_path):
    """``password: !env MQTT_PASSWORD`` (a secret kept out of files): the command could not write the
    members' configurations ('cannot represent an object', a traceback, exit 1). Each member's file says
    ``!env NAME`` as the file given does, and the member reads the variable itself."""
    port = free_ports(1)[0]
    config = tmp_path / "broker.yaml"
    config.write_text(config_text(tmp_path, port, "limits: {max_connections: !env TS_MAX_CONNECTIONS}\n"))
    log = tmp_path / "command.log"
    process = serving(str(config), log, env={**os.environ, "TS_MAX_CONNECTIONS": "321"})
    try:
        assert process.poll() is None, log.read_text()[-3000:]
        member = (tmp_path / "data" / "workers" / "w1.yaml").read_text()
        assert "max_connections: !env 'TS_MAX_CONNECTIONS'" in member, member
        # no value is the variable's (a port such as 23217 may hold its digits)
        assert re.search(r"""[:-] ['"]?321['"]?$""", member, re.MULTILINE) is None, member
    finally:
        stop_workers(process)


def test_sighup_after_the_file_given_changed_says_its_settings_apply_at_the_next_start(tmp_path):
    """A SIGHUP reads the files the configuration names again, not the configuration: ``timestone broker``
    says so at WARNING when its file changed since its start, the command said nothing (the members' own
    files never change)."""
    port = free_ports(1)[0]
    config = tmp_path / "broker.yaml"
    config.write_text(config_text(tmp_path, port))
    log = tmp_path / "command.log"
    process = serving(str(config), log)
    try:
        config.write_text(config.read_text() + "limits: {max_connections: 10}\n")
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: b"SIGHUP passed on to members" in log.read_bytes(), 30, "SIGHUP passed on")
        wait_until(
            lambda: f"SIGHUP: {config} changed since the broker started" in log.read_text(), 10, "said"
        )
        assert process.poll() is None
    finally:
        stop_workers(process)


def test_the_members_configurations_are_readable_by_their_user_alone(tmp_path):
    """The members' files hold the configuration given, its secrets written inline included (a reader
    token, an etcd password): they were written 0644 under the usual umask, readable by every user of the
    host however closed the file given was. They are 0600."""
    port = free_ports(1)[0]
    config = tmp_path / "broker.yaml"
    config.write_text(config_text(tmp_path, port))
    config.chmod(0o600)
    log = tmp_path / "command.log"
    process = serving(str(config), log, preexec_fn=lambda: os.umask(0o022))
    try:
        for member in ("w0", "w1"):
            mode = (tmp_path / "data" / "workers" / f"{member}.yaml").stat().st_mode & 0o777
            assert mode == 0o600, oct(mode)
    finally:
        stop_workers(process)
