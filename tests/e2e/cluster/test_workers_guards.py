"""``timestone broker --workers 2`` as a service: SIGHUP passed on to the members, and a start that cannot
succeed ending with its exit status instead of members forked again for ever.

- a second command on the same MQTT port (members bind it with ``SO_REUSEPORT``, which another command of
  the same user could join) exits 1 naming the first's pid, and the first serves on;
- the same configuration started again exits 2 naming the data directory in use, before it starts an etcd
  or touches a file of the first's;
- a port taken by another process: exit 1, as a single broker;
- a member that cannot start (its admin port taken; its data directory held) ends the command with the
  member's status (1, 2) and reason;
- SIGHUP reaches every member (a user added to the password file logs in through each), the command runs on;
- the command killed (SIGKILL): its members and etcd stop, and the port can be served again.
- its own etcd killed is started again; one that cannot start again is tried again, the members kept;
- its own etcd serves once started (and once started again): its port accepting connections is not enough;
- its own etcd hung (SIGSTOP) is noticed, killed and started again, nothing acknowledged lost;
- too little disk for its etcd is refused at start, naming the directory and the space;
- a SIGTERM while its etcd starts ends the command at once;
- its etcd keeps a bounded history (compacted);
- --workers is bounded by the CPUs the command may run on.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from broker_edge.runtime import workers_etcd
from broker_edge.runtime.data_lock import DataDirectoryLock
from broker_edge.runtime.launcher import free_ports
from broker_edge.runtime.workers_etcd import ETCD_HUNG_S, LocalEtcd
from broker_edge.security.auth import hash_password
from tests.e2e.broker_clients import PahoClient, RawClient
from tests.e2e.cluster.test_workers import member_pids, read_topic, start_workers, stop_workers
from tests.harness.local_cluster import wait_until
from tests.processes import running, state

pytestmark = pytest.mark.timeout(240)

REFUSED_WITHIN_S = 60.0


def write_users(path: Path, users: dict[str, str]) -> None:
    path.write_text("".join(f"{user}:{hash_password(password)}\n" for user, password in users.items()))
    path.chmod(0o600)


class First:
    """The command every test but the last leaves serving."""

    def __init__(self, directory: Path, process: subprocess.Popen[bytes], port: int) -> None:
        self.directory = directory
        self.process = process
        self.port = port
        self.passwords = directory / "passwd"

    @property
    def offsets_api(self) -> str:
        return "http://127.0.0.1:" + self.config.read_text().split("offsets_api: {port: ")[1].split("}")[0]

    @property
    def config(self) -> Path:
        return self.directory / "broker.yaml"

    @property
    def workers_dir(self) -> Path:
        return self.directory / "data" / "workers"

    def log(self) -> str:
        return (self.directory / "workers.log").read_text(errors="replace")

    def logs_in(self, user: str, password: str, times: int = 6) -> bool:
        """``times`` connections to the shared port, each accepted (the kernel spreads them over the
        members)."""
        for n in range(times):
            client = RawClient(self.port, 5)
            try:
                answer = client.connect(f"{user}-{n}", username=user, password=password.encode())
            finally:
                client.close()
            if getattr(answer, "reason_code", None) != 0:
                return False
        return True


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Iterator[First]:
    directory = tmp_path_factory.mktemp("first")
    passwords = directory / "passwd"
    write_users(passwords, {"u1": "p1"})
    process, port, _ = start_workers(directory, runtime=f"auth: {{password_file: {passwords}}}\n")
    try:
        yield First(directory, process, port)
    finally:
        stop_workers(process)


def run_command(config: Path, timeout: float = REFUSED_WITHIN_S) -> tuple[int, str]:
    """``timestone broker --config CONFIG --workers 2`` to its end: (exit status, its output)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config), "--workers", "2"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired as expired:
        output = (expired.output or b"").decode(errors="replace")
        raise AssertionError(f"still running after {timeout} s:\n{output[-3000:]}") from None
    return done.returncode, done.stdout.decode(errors="replace")


def write_config(directory: Path, port: int, data: Path | None = None) -> Path:
    api, admin = free_ports(2)
    config = directory / "other.yaml"
    config.write_text(
        f"listeners:\n  - {{name: default, host: 127.0.0.1, port: {port}}}\n"
        f"storage: {{directory: {data or directory / 'data'}}}\n"
        f"offsets_api: {{port: {api}}}\n"
        f"admin_http: {{port: {admin}}}\n"
    )
    return config


def test_a_second_command_on_the_same_port_exits_1_and_the_first_serves_on(first, tmp_path):
    code, output = run_command(write_config(tmp_path, first.port))
    assert code == 1, output
    pid = first.process.pid
    assert (
        f"cannot start: [Errno 98] listeners[0] (default) 127.0.0.1:{first.port} is served by another "
        f"timestone broker --workers (pid {pid})" in output
    ), output
    assert "etcd for the members" not in output
    assert not (tmp_path / "data" / "workers").exists()
    assert first.process.poll() is None
    assert first.logs_in("u1", "p1")


def test_the_same_configuration_started_again_exits_2_naming_the_data_directory(first):
    pids = {path.name: path.read_text() for path in first.workers_dir.glob("w*.pid")}
    assert len(pids) == 2
    code, output = run_command(first.directory / "broker.yaml")
    assert code == 2, output
    data = first.directory / "data"
    refusal = f"timestone broker: configuration error: storage.directory: the data directory {data} is in use"
    assert refusal in output, output
    assert f"pid {first.process.pid}" in output
    assert "etcd for the members" not in output
    assert {path.name: path.read_text() for path in first.workers_dir.glob("w*.pid")} == pids
    assert first.process.poll() is None
    assert first.logs_in("u1", "p1")


def test_a_port_taken_by_another_process_exits_1_as_a_single_broker(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        code, output = run_command(write_config(tmp_path, port))
    finally:
        holder.close()
    assert code == 1, output
    assert (
        f"cannot start: [Errno 98] listeners[0] (default) cannot listen on 127.0.0.1:{port}: "
        "Address already in use (another process listens there)" in output
    ), output
    assert "etcd for the members" not in output


def test_a_member_that_cannot_start_ends_the_command_with_its_status_and_reason(tmp_path):
    config = write_config(tmp_path, free_ports(1)[0])
    admin = int(config.read_text().split("admin_http: {port: ")[1].split("}")[0])
    holder = socket.socket()
    holder.bind(("127.0.0.1", admin))  # the first member's (the others take free ones)
    holder.listen()
    try:
        code, output = run_command(config)
    finally:
        holder.close()
    assert code == 1, output
    reason = f"cannot start: member w0: [Errno 98] admin_http cannot listen on 127.0.0.1:{admin}"
    assert reason in output, output
    assert "starting it again" not in output
    assert "broker_edge.workers: stopped" not in output  # it did not stop on a signal
    assert not list((tmp_path / "data" / "workers").glob("*.pid"))


def test_a_member_with_a_configuration_error_ends_the_command_with_status_2(tmp_path):
    config = write_config(tmp_path, free_ports(1)[0])
    held = DataDirectoryLock(tmp_path / "data" / "workers" / "w1")
    held.acquire()
    try:
        code, output = run_command(config)
    finally:
        held.release()
    assert code == 2, output
    assert (
        "timestone broker: configuration error: member w1: storage.directory: the data directory "
        f"{tmp_path / 'data' / 'workers' / 'w1'} is in use by another broker (pid {os.getpid()}" in output
    ), output
    assert "starting it again" not in output


def test_cluster_status_given_the_commands_configuration_shows_its_members(first):
    """The configuration has no cluster: section (the command runs its own etcd, on a free port): status
    finds the cluster in the first member's configuration, where it said 'no cluster section' (exit 2)."""
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "cluster", "status", "--config", str(first.config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "2 members live" in done.stdout, done.stdout
    assert re.search(r"^  w0 +live", done.stdout, re.M) and re.search(r"^  w1 +live", done.stdout, re.M)


def test_sighup_is_passed_on_to_every_member_and_the_command_runs_on(first):
    assert not first.logs_in("u2", "p2", times=1)
    write_users(first.passwords, {"u1": "p1", "u2": "p2"})
    first.process.send_signal(signal.SIGHUP)
    wait_until(lambda: "SIGHUP passed on to members w0, w1" in first.log(), 30, "SIGHUP passed on")
    reloaded = f"password file {first.passwords} reloaded"
    wait_until(lambda: first.log().count(reloaded) >= 2, 30, "both members reloaded it")
    assert first.process.poll() is None
    assert first.logs_in("u2", "p2")
    assert first.logs_in("u1", "p1")


def test_its_etcd_serves_once_started(tmp_path):
    """etcd accepts connections a moment before it serves them: members started on its port's first
    answer logged WARNINGs (cannot register, retrying with backoff) at every start of the command. Started
    means serving: a request answered at once, and again after a restart."""
    etcd = LocalEtcd(tmp_path)
    try:
        url = etcd.start()
        assert _health(url) == {"health": "true"}
        assert etcd.process is not None
        etcd.process.kill()
        etcd.process.wait()
        etcd.restart(signal.SIGKILL)
        assert _health(url) == {"health": "true"}
    finally:
        etcd.stop()


def test_its_etcd_keeps_a_bounded_history(tmp_path, monkeypatch):
    """Every client's connection writes its session's record in etcd, and etcd keeps each version until
    compacted: the command's etcd compacted nothing, so its database grew with every connection of the
    fleet until etcd's quota (2 GB), where it takes no more writes. It now keeps ``ETCD_HISTORY`` of
    history (here shortened to 2 s): older versions read as compacted."""
    monkeypatch.setattr(workers_etcd, "ETCD_HISTORY", "2s")
    etcd = LocalEtcd(tmp_path)
    try:
        url = etcd.start()
        for value in (b"1", b"2", b"3"):
            revision = _etcd_call(url, "put", {"key": b"k", "value": value})["header"]["revision"]

        def compacted() -> bool:
            answer = _etcd_call(url, "range", {"key": b"k", "revision": int(revision) - 1})
            return "compacted" in str(answer.get("error", ""))

        wait_until(compacted, 30, "etcd compacted its older revisions")
    finally:
        etcd.stop()


def _etcd_call(url: str, call: str, request: dict[str, object]) -> dict[str, Any]:
    """etcd's JSON gateway: ``/v3/kv/<call>`` with bytes as base64; its answer, an error's too."""
    body = {k: base64.b64encode(v).decode() if isinstance(v, bytes) else v for k, v in request.items()}
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(f"{url}/v3/kv/{call}", json.dumps(body).encode(), timeout=5) as answer:
            result: dict[str, Any] = json.load(answer)
    except urllib.error.HTTPError as error:
        result = json.load(error)
    return result


def _health(url: str) -> object:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with direct.open(f"{url}/health", timeout=0.2) as answer:
        return json.load(answer)


def test_a_sighup_during_the_start_is_no_end_and_reaches_every_member(tmp_path):
    """Members still starting ignore SIGHUP and are told once they serve: the command never dies of it."""
    passwords = tmp_path / "passwd"
    write_users(passwords, {"u1": "p1"})
    port = free_ports(1)[0]
    config = write_config(tmp_path, port)
    config.write_text(config.read_text() + f"auth: {{password_file: {passwords}}}\n")
    log = tmp_path / "command.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config), "--workers", "2"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: b"etcd for the members" in log.read_bytes(), 60, "etcd started")
        write_users(passwords, {"u1": "p1", "u2": "p2"})
        process.send_signal(signal.SIGHUP)
        wait_until(lambda: b"2 members serving" in log.read_bytes(), 60, "both members serving")
        assert b"SIGHUP passed on to members" in log.read_bytes()
        command = First(tmp_path, process, port)
        assert command.logs_in("u2", "p2")
        assert process.poll() is None
    finally:
        stop_workers(process)
    assert process.returncode == 0, log.read_text()


def test_a_sigterm_while_its_etcd_starts_stops_the_command_at_once(tmp_path):
    """etcd slow to serve (a long recovery, a stalled disk; here stopped before it runs, through a wrapper
    first on PATH that execs the real one): a SIGTERM waited for etcd's start to time out (20 s), and the
    command then said 'cannot start: etcd did not start' with exit 1, or forked the members only to stop
    them. It now stops etcd and ends at once: exit 0, nothing started, nothing left running."""
    wrapper = tmp_path / "bin" / "etcd"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nkill -STOP $$\nexec {shutil.which("etcd")} "$@"\n')
    wrapper.chmod(0o755)
    config = write_config(tmp_path, free_ports(1)[0])
    log = tmp_path / "command.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config), "--workers", "2"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, "PATH": f"{wrapper.parent}:{os.environ['PATH']}"},
        )
    etcd: list[int] = []
    try:

        def etcd_stopped() -> bool:
            children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True)
            etcd[:] = [int(pid) for pid in children.stdout.split() if state(int(pid)) == "T"]
            return bool(etcd)

        wait_until(etcd_stopped, 60, "etcd started (and stopped before it serves)")
        process.send_signal(signal.SIGTERM)
        process.wait(5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for pid in etcd:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    said = log.read_text()
    assert process.returncode == 0, said
    assert "broker started" not in said and "cannot start" not in said, said
    wait_until(lambda: not any(running(pid) for pid in etcd), 10, "etcd stopped")


def test_its_etcd_killed_is_started_again_and_qos_1_publishes_are_taken_again(first):
    """The command's own etcd dies (OOM killer, kill -9): logged, started again on its ports and data, and
    the members, fenced meanwhile, take QoS 1 publishes again; the command runs on."""
    etcd = _etcd_pid(first)
    os.kill(etcd, signal.SIGKILL)
    wait_until(
        lambda: "etcd of the members exited (signal 9): starting it again" in first.log(), 30, "noticed"
    )
    wait_until(lambda: "etcd of the members answers again" in first.log(), 60, "etcd started again")
    assert _etcd_pid(first) != etcd and first.process.poll() is None

    wait_until(partial(_publishes, first), 60, "a QoS 1 publish acknowledged after etcd came back")


def _publishes(command: First, topic: str = "t/after-etcd", payload: bytes = b"x") -> bool:
    try:
        client = PahoClient(command.port, "after-etcd", username="u1", password="p1")
    except (AssertionError, OSError):
        return False
    try:
        client.publish(topic, payload, qos=1)
        return True
    except (AssertionError, RuntimeError):  # refused, or told to go, while its member was fenced
        return False
    finally:
        client.close()


def test_its_etcd_that_cannot_start_again_is_tried_again_while_the_members_wait(first):
    """Its etcd killed and unable to start again at once (as on a full disk, where etcd ends as soon as it
    starts; here its data directory replaced by a file): the command stopped every member and exited 1, a
    whole broker down for a passing shortage. It now says why etcd did not start, keeps the members and
    tries again, until etcd serves and they take publishes again."""
    data = first.workers_dir / "etcd"
    aside = first.workers_dir / "etcd.aside"
    data.rename(aside)
    data.write_text("not a directory\n")
    os.kill(_etcd_pid(first), signal.SIGKILL)
    wait_until(lambda: "failed to list data directory" in first.log(), 30, "the reason etcd did not start")
    wait_until(lambda: first.log().count("trying again in") >= 2, 30, "a second try")
    assert first.process.poll() is None, first.log()[-3000:]
    answered = first.log().count("etcd of the members answers again")
    data.unlink()
    aside.rename(data)
    wait_until(
        lambda: first.log().count("etcd of the members answers again") > answered, 60, "etcd started again"
    )
    wait_until(partial(_publishes, first), 60, "a QoS 1 publish acknowledged after etcd came back")


def test_its_etcd_hung_is_killed_and_started_again_and_nothing_acknowledged_is_lost(first):
    """Its etcd hung (SIGSTOP here; a stalled disk, a deadlock): the process lived on, so the command saw
    nothing wrong and the members stayed fenced (nothing acknowledged) for as long as it hung. The command
    now asks it every second; one that answers nothing for ``ETCD_HUNG_S`` is said at ERROR, killed and
    started again, and the members take QoS 1 publishes again, those acknowledged before all kept."""
    before = [f"before-{n}".encode() for n in range(3)]
    for payload in before:
        wait_until(partial(_publishes, first, "t/etcd-hung", payload), 60, "acknowledged before")
    etcd = _etcd_pid(first)
    answered = first.log().count("etcd of the members answers again")
    os.kill(etcd, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        wait_until(
            lambda: f"etcd of the members (pid {etcd}) answered nothing for" in first.log(),
            ETCD_HUNG_S + 15,
            "the hung etcd noticed",
        )
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(etcd, signal.SIGCONT)
    assert time.monotonic() - stopped_at >= ETCD_HUNG_S - 1.0
    wait_until(
        lambda: first.log().count("etcd of the members answers again") > answered, 60, "etcd started again"
    )
    assert first.process.poll() is None, first.log()[-3000:]
    wait_until(
        partial(_publishes, first, "t/etcd-hung", b"after"), 60, "a QoS 1 publish after etcd came back"
    )
    logged = read_topic(first.offsets_api, "t/etcd-hung")
    assert [payload for payload in logged if payload in before] == before, logged


def _etcd_pid(command: First) -> int:
    members = set(member_pids(command.workers_dir).values())
    children = subprocess.run(["pgrep", "-P", str(command.process.pid)], capture_output=True, text=True)
    [etcd] = [int(pid) for pid in children.stdout.split() if int(pid) not in members]
    return etcd


def test_the_command_killed_leaves_nothing_serving(first):
    """Last: it ends the module's command."""
    pids = member_pids(first.workers_dir)
    etcd = [
        int(pid)
        for pid in subprocess.run(
            ["pgrep", "-P", str(first.process.pid)], capture_output=True, text=True
        ).stdout.split()
        if int(pid) not in pids.values()
    ]
    assert len(pids) == 2 and etcd
    first.process.kill()
    first.process.wait()

    def gone() -> bool:
        return not any(running(pid) for pid in [*pids.values(), *etcd])

    wait_until(gone, 60, "the members and etcd stopped")
    port = first.port
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs (root is needed to mount it)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "disk"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_too_little_disk_for_its_etcd_is_refused_at_start_naming_the_directory_and_the_space(
    tmp_path, small_disk
):
    """etcd preallocates its write-ahead log in 64 MB files: on 64 MiB it started anyway, took the disk
    (a few MB left to the members' logs) and was to fail at its next file; on less it ended at once and the
    command said only 'failed to create WAL: no space left on device'. The command now refuses to start
    (exit 1) before etcd runs, naming etcd's data directory, the space it needs and the space there is."""
    config = write_config(tmp_path, free_ports(1)[0], data=small_disk / "data")
    code, output = run_command(config, timeout=30)
    assert code == 1, output
    etcd_data = small_disk / "data" / "workers" / "etcd"
    assert re.search(
        rf"cannot start: the etcd of --workers needs about 130 MB free in {etcd_data} \(its write-ahead log "
        r"is preallocated in two 64 MB files\); its filesystem has \d+ MB free",
        output,
    ), output
    assert "Traceback" not in output and "broker started" not in output, output
    assert not (etcd_data / "member").exists()


def test_check_with_workers_refuses_what_the_command_refuses(tmp_path):
    """``--check --workers 2`` said 'configuration OK' (exit 0) of a configuration the command refuses
    (exit 2: a listener on port 0, the log off), and took any --workers: a reload or a config management
    run checking it passed files the service then could not start with."""
    port = free_ports(1)[0]
    config = write_config(tmp_path, port)
    good = config.read_text()
    config.write_text(good.replace(f"port: {port}", "port: 0"))
    done = _check(config, "2")
    assert done.returncode == 2 and "listeners[0].port: --workers needs a fixed port" in done.stderr, done
    config.write_text(good.replace("storage: {", "storage: {enabled: false, "))
    done = _check(config, "2")
    assert done.returncode == 2 and "storage.enabled" in done.stderr, done
    config.write_text(good)
    done = _check(config, "0")
    assert done.returncode == 2 and "--workers: from 1 to" in done.stderr, done
    done = _check(config, "2")
    assert done.returncode == 0 and "configuration OK" in done.stdout, done
    assert "2 members" in done.stdout, done.stdout
    assert not (tmp_path / "data").exists(), "nothing is created"


def test_the_most_workers_counts_the_cpus_the_command_may_run_on(tmp_path):
    """A command held to one CPU (taskset, a container's cpuset) took --workers 2 per CPU of the whole
    machine: members enough for every core of the host, sharing the one it may use. It counts the CPUs it
    may run on."""
    config = write_config(tmp_path, free_ports(1)[0])
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "broker", "--check", "-c", str(config), "--workers", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}),
    )
    assert done.returncode == 2, done
    assert "--workers: from 1 to 2 (2 per CPU this command may run on" in done.stderr, done.stderr


def _check(config: Path, workers: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "broker",
            "--check",
            "--config",
            str(config),
            "--workers",
            workers,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_started_again_while_members_of_a_killed_command_still_run_names_them(tmp_path):
    """The command killed (SIGKILL), a member of it that does not stop (here stopped with SIGSTOP, its
    SIGTERM pending) still holds the data directory: a new command was refused naming the dead command's
    pid, which an operator then looks for in vain. It names the members still running."""
    port = free_ports(1)[0]
    config = write_config(tmp_path, port)
    log = tmp_path / "command.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config), "--workers", "2"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    workers_dir = tmp_path / "data" / "workers"
    pids: dict[str, int] = {}
    try:
        wait_until(lambda: b"2 members serving" in log.read_bytes(), 60, "both members serving")
        pids = member_pids(workers_dir)
        os.kill(pids["w1"], signal.SIGSTOP)
        process.kill()
        process.wait()
        wait_until(lambda: not running(pids["w0"]), 30, "w0 stopped")
        code, said = run_command(config)
        assert code == 2, said
        assert f"w1 (pid {pids['w1']})" in said and "still run" in said, said
    finally:
        if process.poll() is None:
            process.kill()
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)  # its SIGTERM, pending, stops it
    wait_until(lambda: not any(running(pid) for pid in pids.values()), 30, "the members stopped")


def test_a_member_started_again_on_a_full_disk_leaves_its_pid_file_and_serves(tmp_path):
    """A member crashing while its disk is full (no room for its ``w<n>.pid``; here a directory in its
    place) ended the command with 'cannot start: [Errno 28] No space left on device', every member with it.
    The pid file is only information: a WARNING says it was not written, and the member starts again."""
    port = free_ports(1)[0]
    config = write_config(tmp_path, port)
    log = tmp_path / "command.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config), "--workers", "2"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: b"2 members serving" in log.read_bytes(), 60, "both members serving")
        pid_file = tmp_path / "data" / "workers" / "w1.pid"
        w1 = int(pid_file.read_text())
        pid_file.unlink()
        pid_file.mkdir()
        os.kill(w1, signal.SIGKILL)
        wait_until(lambda: log.read_text().count("broker started:") >= 3, 60, "w1 started again")
        assert process.poll() is None, log.read_text()[-3000:]
        assert f"{pid_file} not written" in log.read_text()
    finally:
        stop_workers(process)
    assert process.returncode == 0, log.read_text()[-3000:]


def test_cluster_status_of_a_stopped_command_says_its_etcd_runs_only_with_it(tmp_path):
    """Its etcd runs only while the command does: status of a stopped one said only 'Connection refused' of
    an etcd URL the operator never gave; it now says whose etcd that is and asks whether it runs."""
    config = write_config(tmp_path, free_ports(1)[0])
    log = tmp_path / "command.log"
    with open(log, "wb") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", "broker", "--config", str(config), "--workers", "2"],
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: b"2 members serving" in log.read_bytes(), 60, "both members serving")
    finally:
        stop_workers(process)
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "cluster", "status", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done
    assert "timestone broker --workers" in done.stderr and "is it running?" in done.stderr, done.stderr
