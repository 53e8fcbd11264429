"""`BrokerUnderTest`: how to start one broker on a free port, wait for it, find its PID and stop it.

Each broker runs in its own session (process group) with a generated config and a temporary data directory,
pinned to the CPUs it is given and with RLIMIT_NOFILE raised to the hard limit. Whatever happens (an
exception, Ctrl-C, SIGTERM), leaving `running()` kills the whole group and removes the directory; an atexit
hook catches the brokers of a run that dies some other way.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from bench import net

_LIVE: dict[int, subprocess.Popen[bytes]] = {}


class BrokerUnavailable(Exception):
    """The broker could not be installed or started; the message says why, for the results."""


@dataclass(frozen=True)
class RunningBroker:
    """A started broker that accepts MQTT connections."""

    label: str
    port: int
    pid: int
    workdir: Path

    @property
    def data_dir(self) -> Path:
        """Where the broker was told to keep its data."""
        return self.workdir / "data"


class BrokerUnderTest(ABC):
    """One broker (and one configuration of it) that the benchmark can start and stop."""

    #: short name used on the command line (`--brokers`) and in ratios ("timestone", "mosquitto", "amqtt")
    name: str = ""
    #: how long the broker may take between spawn and its first successful MQTT handshake
    start_timeout: float = 15.0

    @property
    def label(self) -> str:
        """The name shown in the tables; variants (persistence on/off) say which they are."""
        return self.name

    @abstractmethod
    def command(self, port: int, workdir: Path) -> list[str]:
        """Write the config into `workdir` and return the command that runs the broker on 127.0.0.1:port."""

    @abstractmethod
    def version(self) -> str:
        """The broker's version, for the results ("not installed" if it has none)."""

    def config_notes(self) -> str:
        """One line on how the broker is configured, for the results."""
        return ""

    @property
    def config_key(self) -> tuple[str, ...]:
        """Equal for two objects that run the same configuration (whatever their labels): a run measures
        each configuration once per flow and shows that measurement wherever the configuration appears."""
        return (self.name,)

    def with_tcp_nodelay(self) -> BrokerUnderTest:
        """This configuration with TCP_NODELAY on its client sockets (itself when that is its default)."""
        return self

    @property
    def summary(self) -> str:
        """The configuration in a few words, for each row of the tables."""
        return ""

    def drop_notice(self, log: str) -> str:
        """What the broker's own log (`log`: its broker.log) says of messages it dropped ("" if nothing)."""
        return ""

    @property
    def persists(self) -> bool:
        """True when this configuration must leave data in its data directory (a run that left none fails)."""
        return False

    def prepare(self) -> None:  # noqa: B027  (an optional hook: most brokers need nothing)
        """Install or check whatever the broker needs; raise BrokerUnavailable if that fails."""

    def env(self) -> dict[str, str] | None:
        """Environment of the broker process (None: inherit)."""
        return None

    @contextlib.contextmanager
    def running(self, cpus: set[int] | None = None, attempts: int = 3) -> Iterator[RunningBroker]:
        """Start the broker, yield it once it completes an MQTT handshake, then stop it whatever happens."""
        last_error: BrokerUnavailable | None = None
        for _ in range(attempts):
            workdir = Path(tempfile.mkdtemp(prefix=f"bench-{self.name}-"))
            (workdir / "data").mkdir()
            try:
                proc = self._spawn(net.free_port(), workdir, cpus)
            except BrokerUnavailable as exc:
                shutil.rmtree(workdir, ignore_errors=True)
                if "in use" not in str(exc):  # only a port taken in the meantime is worth another try
                    raise
                last_error = exc
                continue
            try:
                yield proc[1]
                return
            finally:
                stop_process_group(proc[0])
                shutil.rmtree(workdir, ignore_errors=True)
        raise last_error or BrokerUnavailable("could not be started")

    def popen(self, port: int, workdir: Path, cpus: set[int] | None) -> subprocess.Popen[bytes]:
        """Spawn the broker on `port` in its own session, pinned to `cpus`, output in workdir/broker.log."""
        cmd = self.command(port, workdir)
        with open(workdir / "broker.log", "wb") as log:
            try:
                return subprocess.Popen(
                    cmd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=workdir,
                    env=self.env(),
                    start_new_session=True,
                    preexec_fn=_limits_for_child(cpus),
                )
            except OSError as exc:
                raise BrokerUnavailable(f"`{' '.join(cmd)}` could not be run: {exc}") from exc

    def _spawn(
        self, port: int, workdir: Path, cpus: set[int] | None
    ) -> tuple[subprocess.Popen[bytes], RunningBroker]:
        """Start the process and wait for a handshake; BrokerUnavailable (with the log's tail) if it fails."""
        proc = self.popen(port, workdir, cpus)
        cmd = [str(arg) for arg in cast(Sequence[Any], proc.args)]
        log_path = workdir / "broker.log"
        _LIVE[proc.pid] = proc
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                stop_process_group(proc)
                raise BrokerUnavailable(f"`{' '.join(cmd)}` exited with {proc.returncode}: {_tail(log_path)}")
            if net.mqtt_handshake(port, timeout=0.5):
                return proc, RunningBroker(self.label, port, proc.pid, workdir)
            time.sleep(0.05)
        stop_process_group(proc)
        raise BrokerUnavailable(
            f"no MQTT handshake on port {port} within {self.start_timeout:.0f} s: {_tail(log_path)}"
        )


def _limits_for_child(cpus: set[int] | None) -> Callable[[], None]:
    def apply() -> None:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        if cpus:
            os.sched_setaffinity(0, cpus)

    return apply


def _tail(log_path: Path, lines: int = 5) -> str:
    try:
        text = log_path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def stop_process_group(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM the broker's process group, SIGKILL it if it is still there after `grace` seconds."""
    _LIVE.pop(proc.pid, None)
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    # the leader may be gone while workers it forked are not
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@atexit.register
def _stop_all() -> None:
    for proc in list(_LIVE.values()):
        stop_process_group(proc, grace=1.0)
