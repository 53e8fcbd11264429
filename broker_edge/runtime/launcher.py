"""Run a Timestone broker as a child process with a generated config: for the demo, benchmarks and tests.

The child runs ``timestone broker --config FILE`` (through this interpreter), so it exercises the real command
and YAML loading, keeps its event loop away from the caller's threads (Spark, clients), and can be killed with
SIGKILL and started again on the same ports and data directory, as after a crash.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, ClassVar

import yaml

from broker_edge.process.listening import listening_ports
from broker_edge.process.parent_death import die_with_parent


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (for a child process that needs to know its port)."""
    return free_ports(1, host)[0]


#: where ``free_ports`` looks below the kernel's ephemeral range (clear of the well-known and common ports)
_LISTEN_PORTS_FROM = 10000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


#: random ports tried below the ephemeral range before leaving the choice to the kernel
_RANDOM_TRIES = 64


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports on ``host`` that were free a moment ago, each held open until all are
    chosen (``free_port`` twice may give the same port).

    They are drawn below the kernel's ephemeral range where it has one (Linux): a port from that range may be
    taken as the local port of any outgoing connection, so a broker restarted on the ports of its first start
    could find one of them in use; ports below it are only ever taken by a listener that asks for them."""
    below = _ephemeral_floor()
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(_bound_socket(host, below)) for _ in range(count)]
        return [sock.getsockname()[1] for sock in socks]


def _ephemeral_floor() -> int | None:
    """The first port of the kernel's ephemeral range, or None where it is unknown or leaves no room below."""
    try:
        floor = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return floor if floor > _LISTEN_PORTS_FROM + 1000 else None


def _bound_socket(host: str, below: int | None) -> socket.socket:
    """A TCP socket bound on ``host`` to a free random port under ``below``, or to one the kernel picks."""
    if below is not None:
        for _ in range(_RANDOM_TRIES):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.bind((host, random.randrange(_LISTEN_PORTS_FROM, below)))
            except OSError:
                sock.close()
                continue
            return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


def wait_for_port(
    port: int, host: str = "127.0.0.1", timeout_s: float = 15.0, alive: Callable[[], int | None] | None = None
) -> None:
    """Block until something accepts TCP connections on ``host:port``; with ``alive`` (a process's ``poll``),
    give up as soon as that process has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((host, port)) == 0:
                return
        if alive is not None and alive() is not None:
            break
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {host}:{port}")


class _PortTaken(Exception):
    """The broker could not bind a port chosen for it: another process took it after the probe."""


#: how often a first start chooses its ports again when one was taken meanwhile
_PORT_TRIES = 3


def _merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class BrokerProcess:
    """One broker on loopback: MQTT on ``port``, offsets API on ``offsets_port``, data under ``directory``.

    ``sections`` are config sections merged over the generated ones, e.g.
    ``limits={"max_connections": 20000}``.
    """

    #: the module run with `python -m` (its command line: `broker --config FILE`)
    module = "pipelines.cli"
    #: a command the broker runs under (e.g. `setpriv` giving it a group of its own, which a test's packet
    #: filter can then tell apart)
    wrapper: tuple[str, ...] = ()
    #: what starts the command before ``subprocess.Popen`` is asked (a test harness's fork server): given the
    #: command, the log file its output goes to and its environment, a started process, or None to leave it
    #: to Popen
    spawn: ClassVar[Callable[[list[str], BinaryIO, dict[str, str]], subprocess.Popen | None] | None] = None

    def __init__(
        self,
        directory: Path,
        name: str = "edge1",
        descriptor_limit: int | None = None,
        *,
        dies_with_parent: bool = False,
        **sections: Any,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.descriptor_limit = descriptor_limit
        """The child's ``RLIMIT_NOFILE`` (soft and hard), as a host with a low ``ulimit -n`` gives it."""
        self.dies_with_parent = dies_with_parent
        """SIGTERM to the broker when this process ends, however it ends (SIGKILL too: Linux's
        ``PR_SET_PDEATHSIG``). The kernel tells it when the thread that started it ends: start it from the
        main thread."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path = self.directory / "broker.yaml"
        self.log_path = self.directory / "broker.log"
        self.process: subprocess.Popen | None = None
        self._sections = sections
        self._started_before = False
        self._choose_ports()

    def _choose_ports(self) -> None:
        """Free ports for MQTT, the offsets API and the admin API, written into the config file."""
        self.port, self.offsets_port, self.admin_port = free_ports(3)
        config: dict[str, Any] = {
            "listeners": [{"name": "mqtt", "host": "127.0.0.1", "port": self.port}],
            "storage": {"directory": str(self.directory / "data")},
            "offsets_api": {"host": "127.0.0.1", "port": self.offsets_port},
            "admin_http": {"host": "127.0.0.1", "port": self.admin_port},
        }
        self.config_path.write_text(yaml.safe_dump(_merge(config, self._sections)))

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    @property
    def offsets_url(self) -> str:
        return f"http://127.0.0.1:{self.offsets_port}"

    def start(self, timeout_s: float = 30.0) -> BrokerProcess:
        """Start the broker and wait until it listens. On its first start, a port that another process took
        between the probe and the bind is chosen again (up to three tries); a restart keeps its ports."""
        for attempt in range(_PORT_TRIES):
            try:
                self._start_once(timeout_s)
            except _PortTaken:
                if self._started_before or not self._ports_are_generated() or attempt == _PORT_TRIES - 1:
                    raise self._did_not_start() from None
                self._choose_ports()
                continue
            self._started_before = True
            return self
        raise AssertionError("unreachable")

    def _ports_are_generated(self) -> bool:
        """Whether every port is the launcher's choice: no section given fixes one (an ``offsets_api`` with
        only its tokens, say, leaves its port to the launcher)."""
        sections = self._sections
        return "listeners" not in sections and not any(
            "port" in (sections.get(key) or {}) for key in ("offsets_api", "admin_http")
        )

    def _start_once(self, timeout_s: float) -> None:
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        command = [
            *self.wrapper,
            sys.executable,
            "-m",
            self.module,
            "broker",
            "--config",
            str(self.config_path),
        ]
        prepare = self._in_child(os.getpid())
        with open(self.log_path, "ab") as log:
            spawn = BrokerProcess.spawn
            forked = spawn(command, log, env) if spawn is not None and prepare is None else None
            self.process = forked or subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=prepare
            )
        try:
            for port in (self.port, self.offsets_port):
                wait_for_port(port, timeout_s=timeout_s, alive=self.process.poll)
            self._wait_until_own(self.port, self.offsets_port, timeout_s=timeout_s)
        except TimeoutError:
            self.stop()
            with open(self.log_path, "rb") as log:
                log.seek(log_start)
                if b"address already in use" in log.read().lower():  # the loops word it differently
                    raise _PortTaken from None
            raise self._did_not_start() from None

    def _wait_until_own(self, *ports: int, timeout_s: float) -> None:
        """Wait until the broker itself listens on ``ports``: one that answers may be another process's,
        taken after the probe (the broker then fails to bind it and exits). Where ``/proc`` cannot tell, the
        broker being alive is taken for it."""
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while self.process.poll() is None:
            own = listening_ports(self.process.pid)
            if own is None or own.issuperset(ports):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the broker does not listen on {sorted(set(ports) - own)} itself")
            time.sleep(0.05)
        raise TimeoutError("the broker exited")

    def _in_child(self, parent: int) -> Callable[[], None] | None:
        """What the child does before it runs the broker, if anything."""
        if self.descriptor_limit is None and not self.dies_with_parent:
            return None

        def prepare() -> None:
            import resource

            if self.descriptor_limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (self.descriptor_limit, self.descriptor_limit))
            if self.dies_with_parent:
                die_with_parent(signal.SIGTERM, parent)

        return prepare

    def _did_not_start(self) -> RuntimeError:
        return RuntimeError(f"broker did not start:\n{self.log_path.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no flush, as a power cut would leave it."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM and wait for a clean shutdown (SIGKILL after 15 s)."""
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
