"""The etcd ``timestone broker --workers 2`` runs itself, over a long life:

- started again after it died, on a port another process took meanwhile: it could not start again, ever
  (tried again every 30 s, the members fenced for good); it now takes free ports, and the members are
  started again with its new address;
- its log (``workers/etcd.log``) grew for ever: it is bounded, the older part kept as ``etcd.log.1``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from broker_edge.runtime import workers_etcd
from broker_edge.runtime.workers_etcd import LocalEtcd
from tests.e2e.broker_clients import PahoClient
from tests.e2e.cluster.test_workers import member_pids, start_workers, stop_workers
from tests.harness.local_cluster import wait_until

pytestmark = pytest.mark.timeout(180)


def etcd_url(workers_dir: Path) -> str:
    return (workers_dir / "w0.yaml").read_text().split("etcd:\n  - ")[1].split("\n")[0]


def etcd_pid(process: subprocess.Popen[bytes], workers_dir: Path) -> int:
    members = set(member_pids(workers_dir).values())
    children = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True)
    [pid] = [int(pid) for pid in children.stdout.split() if int(pid) not in members]
    return pid


def publishes(port: int) -> bool:
    try:
        client = PahoClient(port, "after-etcd-moved")
    except (AssertionError, OSError):
        return False
    try:
        client.publish("t/after-etcd-moved", b"x", qos=1)
        return True
    except (AssertionError, RuntimeError):
        return False
    finally:
        client.close()


def test_its_etcd_whose_port_was_taken_meanwhile_starts_on_other_ports_and_the_members_follow(tmp_path):
    process, port, _ = start_workers(tmp_path)
    workers_dir = tmp_path / "data" / "workers"
    log = tmp_path / "workers.log"
    taker = socket.socket()
    try:
        old = etcd_url(workers_dir)
        old_port = int(old.rsplit(":", 1)[1])
        os.kill(process.pid, signal.SIGSTOP)  # it restarts etcd at once: the port is taken before it can
        try:
            os.kill(etcd_pid(process, workers_dir), signal.SIGKILL)
            taker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            wait_until(partial(_binds, taker, old_port), 10, "etcd's port closed")
            taker.listen()
        finally:
            os.kill(process.pid, signal.SIGCONT)
        wait_until(lambda: f"127.0.0.1:{old_port} is taken" in log.read_text(), 30, "the taken port said")
        wait_until(lambda: etcd_url(workers_dir) != old, 30, "the members' configuration names the new etcd")
        wait_until(partial(publishes, port), 90, "a QoS 1 publish acknowledged with etcd on its new port")
        assert process.poll() is None, log.read_text()[-3000:]
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                "cluster",
                "status",
                "--config",
                str(tmp_path / "broker.yaml"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0 and "2 members live" in status.stdout, status
    finally:
        taker.close()
        stop_workers(process)


def _binds(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def test_its_etcd_log_is_bounded(tmp_path, monkeypatch):
    """etcd's output went to ``etcd.log``, appended at every start and never rotated. Past
    ``ETCD_LOG_BYTES`` it is moved to ``etcd.log.1`` (one older file kept) while etcd runs on."""
    monkeypatch.setattr(workers_etcd, "ETCD_LOG_BYTES", 4096)
    etcd = LocalEtcd(tmp_path)
    try:
        etcd.start()
        etcd_log = tmp_path / "etcd.log"
        with open(etcd_log, "ab") as output:
            output.write(b"x" * 10_000 + b"\n")
        etcd.watch()
        assert etcd_log.stat().st_size < 4096
        assert (tmp_path / "etcd.log.1").stat().st_size >= 10_000
        assert etcd.process is not None
        etcd.process.kill()
        etcd.process.wait()
        with open(etcd_log, "ab") as output:
            output.write(b"y" * 10_000 + b"\n")
        etcd.restart(signal.SIGKILL)  # a start rotates too
        assert etcd_log.stat().st_size < 4096
        assert b"y" * 100 in (tmp_path / "etcd.log.1").read_bytes()
    finally:
        etcd.stop()
