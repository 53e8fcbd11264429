"""Start-up of a broker process: time until it accepts TCP and serves MQTT, CPU spent, idle RSS.

The clock starts just before the process is spawned and stops at the first successful TCP connect to its
MQTT port (polled every millisecond), then at the first CONNECT/CONNACK. Idle RSS is the process tree's
VmRSS `settle_s` after that, with no client connected.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench import net
from bench.brokers.base import BrokerUnavailable, BrokerUnderTest
from bench.brokers.timestone import Timestone
from bench.sysinfo import cpu_seconds, rss_bytes


class DefaultTimestone(Timestone):
    """`timestone broker` with its defaults: only the ports (free ones) and the data directory are set.

    Without a file the broker would bind the fixed ports 1883, 9883 and 9884, which another broker on a
    shared machine may hold; everything else (commitlog, offsets API, admin HTTP, limits, logging) is the
    embedded default.
    """

    def __init__(
        self,
        executable: Path | None = None,
        label: str = "timestone (defaults)",
        storage: dict[str, int] | None = None,
        traced: Path | None = None,
        transport: str | None = None,
        admin_port: int = 0,
        logs: Sequence[str] = (),
        logs_from: int = 0,
    ) -> None:
        super().__init__(executable=executable, transport=transport)
        self._label = label
        self.storage = storage or {}
        """Storage settings other than the defaults (the soak may bound the tail caches)."""
        self.traced = traced
        """Run under `bench.traced_broker` with this control directory (None: the `timestone` command)."""
        self.admin_port = admin_port
        """The admin HTTP port (/metrics); 0: a free one nobody is told of."""
        self.logs = logs
        """Topics whose logs the data directory holds before the broker starts (`seed_logs`), each
        continuing at `logs_from`; none: a fresh store."""
        self.logs_from = logs_from

    @property
    def label(self) -> str:
        return self._label

    def command(self, port: int, workdir: Path) -> list[str]:
        if self.logs:
            seed_logs(workdir / "data", self.logs, self.logs_from)
        config = workdir / "timestone.yaml"
        config.write_text(
            f"listeners:\n  - port: {port}\n"
            + (f"    transport: {self.transport}\n" if self.transport else "")
            + f"storage:\n  directory: {workdir / 'data'}\n"
            + "".join(f"  {key}: {value}\n" for key, value in self.storage.items())
            + "offsets_api:\n  port: 0\n"
            f"admin_http:\n  port: {self.admin_port}\n"
        )
        if self.traced is not None:
            return [
                sys.executable,
                "-m",
                "bench.traced_broker",
                str(self.traced),
                "broker",
                "--config",
                str(config),
            ]
        return [str(self.executable), "broker", "--config", str(config)]

    def env(self) -> dict[str, str] | None:
        """The environment a user's shell gives the command: Python writes its bytecode cache.

        A shell with PYTHONDONTWRITEBYTECODE set makes an editable install compile every module of the broker
        at every start (an installed wheel has its bytecode from pip either way), which is not what a user
        runs; the warm-up start of `measure_startup` writes the cache.
        """
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        if self.traced is not None:
            env["PYTHONPATH"] = str(Path(__file__).resolve().parent.parent)
        elif "PYTHONDONTWRITEBYTECODE" not in os.environ:
            return None
        return env

    def config_notes(self) -> str:
        changed = "".join(f", storage.{key} {value}" for key, value in self.storage.items())
        notes = "embedded defaults; listener, offsets API and admin HTTP on free ports, data in a temp dir"
        transport = f", listener transport {self.transport}" if self.transport else ""
        seeded = (
            f", its data directory holding the logs of {len(self.logs):,} topics (the devices'), which "
            f"continue at offset {self.logs_from:,}"
            if self.logs
            else ""
        )
        return notes + transport + changed + seeded


def seed_logs(directory: Path, topics: Sequence[str], offset: int) -> None:
    """Make `directory` a store holding a log for each of `topics` that continues at `offset` (one record at
    `offset`, as after retention removed the older ones).

    A broker that has run for days has logs whose offsets are far beyond CPython's cached small integers
    (up to 256): everything that holds an offset of such a log (its ends, its caches, the cursors of
    sessions) holds an integer object of its own. On a fresh store each log reaches that range only after
    256 records, which at one message a second per topic is minutes into a soak, and Python's allocated
    blocks step up then: a warm-up of the store, not of the broker.
    """
    from broker_edge.storage import LogStore
    from broker_edge.storage.config import StorageConfig

    quiet = logging.getLogger("broker_edge.storage")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # a restart of every log is logged as a warning
    try:
        with LogStore(directory, StorageConfig()) as store:
            for topic in topics:
                store.replicated_log.restart_at(topic, offset)
                store.append_message(topic, b"", 1)
            store.flush()
    finally:
        quiet.setLevel(level)


@dataclass(frozen=True)
class StartupRun:
    """One start of a broker."""

    listen_s: float
    serve_s: float
    cpu_s: float
    idle_rss: int


@dataclass(frozen=True)
class StartupResult:
    """Several starts of one broker; medians are what the tables show."""

    label: str
    runs: list[StartupRun]

    @property
    def listen_s(self) -> float:
        return statistics.median(run.listen_s for run in self.runs)

    @property
    def serve_s(self) -> float:
        return statistics.median(run.serve_s for run in self.runs)

    @property
    def cpu_s(self) -> float:
        return statistics.median(run.cpu_s for run in self.runs)

    @property
    def idle_rss(self) -> int:
        return int(statistics.median(run.idle_rss for run in self.runs))


def measure_startup(
    broker: BrokerUnderTest, runs: int, cpus: set[int] | None = None, settle_s: float = 2.0, warmup: int = 1
) -> StartupResult:
    """Start `broker` `warmup` times uncounted (page cache, bytecode cache), then `runs` times, each in a
    fresh directory, measuring each start."""
    for _ in range(warmup):
        _start_once(broker, cpus, 0.0)
    return StartupResult(broker.label, [_start_once(broker, cpus, settle_s) for _ in range(runs)])


def _start_once(broker: BrokerUnderTest, cpus: set[int] | None, settle_s: float) -> StartupRun:
    workdir = Path(tempfile.mkdtemp(prefix=f"footprint-{broker.name}-"))
    (workdir / "data").mkdir()
    port = net.free_port()
    process: subprocess.Popen[bytes] | None = None
    try:
        started = time.monotonic()
        process = broker.popen(port, workdir, cpus)
        listen_s = _wait_for_tcp(port, process, started, broker.start_timeout)
        cpu_s = cpu_seconds(process.pid)
        while not net.mqtt_handshake(port, timeout=1.0):
            if time.monotonic() - started > broker.start_timeout:
                raise BrokerUnavailable(f"{broker.label}: no MQTT handshake on port {port}")
            time.sleep(0.001)
        serve_s = time.monotonic() - started
        time.sleep(settle_s)
        return StartupRun(listen_s, serve_s, cpu_s, rss_bytes(process.pid))
    finally:
        if process is not None:
            _stop(process)
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_for_tcp(port: int, process: subprocess.Popen[bytes], started: float, timeout_s: float) -> float:
    while time.monotonic() - started < timeout_s:
        with socket.socket() as sock:
            if sock.connect_ex((net.HOST, port)) == 0:
                return time.monotonic() - started
        if process.poll() is not None:
            raise BrokerUnavailable(f"exited with {process.returncode} before listening")
        time.sleep(0.001)
    raise BrokerUnavailable(f"nothing listened on port {port} within {timeout_s:.0f} s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
