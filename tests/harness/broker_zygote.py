"""Broker processes forked from one that has imported the broker already (a fork server), for the tests.

A broker process spends most of its start importing its modules (a cluster member about 0.8 s of CPU on this
project's 2-core machines), and the suite starts about a thousand of them. ``ForkServer`` runs
``python -m tests.harness.broker_zygote``, which imports them once and then forks a child for each start: the
child takes the command's arguments, environment and working directory, writes to its log file, and runs the
command's module as ``python -m`` would (``runpy``), with everything after the imports its own.

``BrokerProcess.spawn`` (broker_edge.runtime.launcher) asks ``ForkServer.spawn`` first; a start it cannot make
as ``python -m`` would (another interpreter, a wrapper command, an environment whose variables read when a
process starts or a module is imported differ from the server's, ``READ_AT_START``) is left to
``subprocess.Popen``. The child's handle is a ``ForkedProcess``, a ``Popen`` whose exit status comes from the
server, which reaps it.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

PRELOADED = (
    "pipelines.cli",
    "broker_edge.runtime.main",
    "broker_edge.runtime.broker",
    "broker_edge.cluster.node",
    "broker_edge.offsets_api.server",
    "broker_edge.runtime.admin_http",
)
"""What the server imports before it forks: the broker's and a cluster member's modules."""

UNKNOWN_STATUS = 255
"""The exit status of a child whose server ended before it (its status went to init)."""


class ForkedProcess(subprocess.Popen):
    """A ``Popen`` of a child of the fork server: signals go to its pid, its exit status comes from the
    server."""

    def __init__(
        self, server: ForkServer, pid: int, args: Sequence[str]
    ) -> None:  # no super(): spawns nothing
        self._server = server
        self.args = list(args)
        self.pid = pid
        self.returncode: Any = None
        self.stdin = self.stdout = self.stderr = None
        self._child_created = False  # Popen's finaliser has nothing to reap

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.exit_status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            status = self._server.wait_exit(self.pid, timeout)
            if status is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self.returncode = status
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)


class ForkServer:
    """One fork server for this test process, started with the environment its children must have."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: subprocess.Popen | None = None
        self._environment: dict[str, str] = {}
        self._replies: dict[int, threading.Event] = {}
        self._exits: dict[int, threading.Event] = {}
        self._statuses: dict[int, int] = {}
        self._pids: dict[int, int | None] = {}
        self._requests = 0
        self._gone = False

    def spawn(self, argv: Sequence[str], log: IO[bytes], env: Mapping[str, str]) -> subprocess.Popen | None:
        """A child running ``argv`` (``python -m MODULE ARGS``) with ``env``, its output to ``log``; None
        where it cannot be forked as that command would start."""
        if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
            return None
        with self._lock:
            server = self._server
            if _settled(env) != _settled(self._environment) or server is None or server.poll() is not None:
                return None
            self._requests += 1
            request = self._requests
            replied = self._replies[request] = threading.Event()
            message = {"id": request, "module": argv[2], "args": list(argv[3:]), "env": dict(env)}
            message |= {"cwd": os.getcwd(), "log": os.readlink(f"/proc/self/fd/{log.fileno()}")}
            assert server.stdin is not None
            try:
                server.stdin.write(json.dumps(message).encode() + b"\n")
                server.stdin.flush()
            except BrokenPipeError:  # the server has ended
                return None
        if not replied.wait(30):
            raise RuntimeError("the tests' fork server did not fork a broker within 30 s")
        pid = self._pids.pop(request)
        return None if pid is None else ForkedProcess(self, pid, argv)

    def exit_status(self, pid: int) -> int | None:
        """The child's exit status once it has ended; None while it runs."""
        with self._lock:
            if pid in self._statuses or not self._gone:
                return self._statuses.get(pid)
        return _orphan_status(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit status once it has ended, waiting at most ``timeout`` seconds (None: as long as
        it takes); None if it still runs then."""
        with self._lock:
            exited = self._exits.setdefault(pid, threading.Event())
        deadline = None if timeout is None else time.monotonic() + timeout
        exited.wait(timeout)
        status = self.exit_status(pid)
        while status is None and self._gone and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)  # the server has ended: its children are init's, seen through /proc
            status = self.exit_status(pid)
        return status

    def stop(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is not None:
            server.kill()
            server.wait(10)

    def start(self, env: Mapping[str, str]) -> ForkServer:
        """Start the server (its modules imported once it answers); a server that fails forks nothing."""
        self._environment = dict(env)
        server = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.broker_zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self._environment,
        )
        assert server.stdout is not None
        if server.stdout.readline() != b"ready\n":
            server.kill()
            server.wait(10)
            return self
        self._server = server
        threading.Thread(target=self._read, args=(server.stdout,), name="fork-server", daemon=True).start()
        return self

    def _read(self, replies: IO[bytes]) -> None:
        for line in replies:
            reply = json.loads(line)
            with self._lock:
                if "exit" in reply:
                    self._statuses[reply["exit"]] = reply["status"]
                    self._exits.setdefault(reply["exit"], threading.Event()).set()
                    continue
                pid = reply.get("pid")
                if pid is not None:  # a pid the server reaped before may be this child's now
                    self._statuses.pop(pid, None)
                    self._exits.pop(pid, None)
                self._pids[reply["id"]] = pid
                self._replies.pop(reply["id"]).set()
        with self._lock:  # the server has ended: nobody reaps its children now, nor answers a request
            self._gone = True
            waiting = [*self._exits.values(), *self._replies.values()]
            self._pids.update(dict.fromkeys(self._replies))
        for event in waiting:
            event.set()


def _orphan_status(pid: int) -> int | None:
    """What a child of a server that has ended is known by: None while it runs, ``UNKNOWN_STATUS`` once it
    has gone (its status went to init)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return UNKNOWN_STATUS
    return UNKNOWN_STATUS if state in ("Z", "X") else None


READ_AT_START = ("PYTHON", "LD_", "MALLOC_", "LC_", "LANG", "TZ", "SSL_", "OPENSSL_", "GRPC_", "TIMESTONE_")
"""Environment variables (by prefix) read when a process starts or a module is imported: by the interpreter,
the dynamic loader, glibc's allocator, the locale, the time module, OpenSSL (the CA bundle aiohttp loads on
import), gRPC, or the broker (``TIMESTONE_PATH_TRACE``). A start whose values of these differ from the
server's is spawned; any other variable (``PYTEST_CURRENT_TEST``, which pytest changes for each test, or
Spark's, which the shared SparkSession sets) is the child's as the start gives it."""


def _settled(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of ``env`` that a forked child would have as the server had them."""
    return {name: value for name, value in env.items() if name.startswith(READ_AT_START)}


def _serve() -> None:
    """The server's loop: a request (a JSON line) forks a child; a child's end is answered with its status.
    A child leaves this function through ``_become``, which never returns."""
    for module in PRELOADED:
        __import__(module)
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the test process, which stops its brokers
    requests = io.FileIO(sys.stdin.fileno(), "r", closefd=False)
    replies = io.FileIO(sys.stdout.fileno(), "w", closefd=False)
    replies.write(b"ready\n")
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ)
    selector.register(wakeup_read, selectors.EVENT_READ)
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fileobj is requests:
                chunk = requests.read(65536)
                if not chunk:
                    return  # the test process has gone
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    request = json.loads(line)
                    try:
                        pid: int | None = os.fork()
                    except OSError:  # left to Popen
                        pid = None
                    if pid == 0:
                        server_fds = (wakeup_read, wakeup_write, requests.fileno(), replies.fileno())
                        _become(request, server_fds, selector)
                    replies.write(json.dumps({"id": request["id"], "pid": pid}).encode() + b"\n")
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(wakeup_read, 4096)
        _reap(replies)


def _reap(replies: io.FileIO) -> None:
    """Every child that has ended, its status told as ``Popen.returncode`` gives it."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        returncode = os.waitstatus_to_exitcode(status)
        replies.write(json.dumps({"exit": pid, "status": returncode}).encode() + b"\n")


def _become(request: dict[str, Any], server_fds: Sequence[int], selector: selectors.BaseSelector) -> None:
    """In the child: the request's command, as ``python -m`` runs it; its exit ends the interpreter."""
    import runpy

    selector.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    for fd in {*server_fds, log, null} - {0, 1, 2}:
        os.close(fd)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)))
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), write_through=True)
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), write_through=True, errors="backslashreplace"
    )  # and stdout strict, as a spawned interpreter's under a UTF-8 locale
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [request["module"], *request["args"]]
    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    raise SystemExit(0)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    _serve()
