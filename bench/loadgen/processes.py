"""Starting load-generator worker processes and talking to them with timeouts.

Workers are spawned (not forked) daemons: they die with the parent, and `WorkerSet` terminates any that are
still alive when it is left, whatever the reason.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from bench.loadgen.worker import WorkerReport, WorkerSpec, worker_main

_CTX = mp.get_context("spawn")


class WorkerFailed(Exception):
    """A worker could not connect its clients, crashed, or did not answer in time."""


class WorkerSet:
    """The worker processes of one measurement, and the shared subscriber counters they use."""

    def __init__(self, counter_slots: int = 1) -> None:
        self.shared: Any = _CTX.RawArray("q", max(counter_slots, 1))
        self._workers: list[tuple[WorkerSpec, BaseProcess, Connection]] = []

    def __enter__(self) -> WorkerSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def start(self, spec: WorkerSpec, ready_timeout: float) -> int:
        """Spawn a worker and wait until its clients are connected; return how many connected."""
        parent, child = _CTX.Pipe()
        process = _CTX.Process(target=worker_main, args=(spec, child, self.shared), daemon=True)
        process.start()
        child.close()
        self._workers.append((spec, process, parent))
        message = receive(parent, ready_timeout, f"{spec.role} worker", process)
        if message[0] != "ready":
            raise WorkerFailed(f"{spec.role} worker: {message[1]}")
        connected, errors = message[1], message[2]
        if connected < spec.clients:
            raise WorkerFailed(
                f"only {connected} of {spec.clients} {spec.role} clients connected; first errors: {errors}"
            )
        return connected

    def send_all(self, message: tuple, role: str | None = None) -> None:
        """Send the same command to every worker (of that role)."""
        for spec, _, conn in self._workers:
            if role is None or spec.role == role:
                # a worker that already reported (its deadline passed) has closed its end: its report says
                # what it saw, so a command it can no longer take is not an error
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    conn.send(message)

    def reports(self, timeout: float, role: str | None = None) -> list[WorkerReport]:
        """Collect the final report of every worker (of that role), all within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        out = []
        for spec, process, conn in self._workers:
            if role is not None and spec.role != role:
                continue
            message = receive(conn, max(deadline - time.monotonic(), 0.1), f"{spec.role} worker", process)
            if message[0] != "done":
                raise WorkerFailed(f"{spec.role} worker: {message[1]}")
            out.append(WorkerReport(**message[1]))
        return out

    def terminate(self) -> None:
        """Stop every worker still alive (normally they have exited after reporting)."""
        for _, process, conn in self._workers:
            process.join(timeout=2)
            if process.is_alive():
                process.terminate()
                process.join(timeout=2)
            if process.is_alive():
                process.kill()
                process.join(timeout=2)
            conn.close()
        self._workers.clear()


def receive(conn: Connection, timeout: float, what: str, process: BaseProcess | None = None) -> tuple:
    """The next message from a worker; WorkerFailed if none comes within `timeout` or the worker died."""
    deadline = time.monotonic() + timeout
    while not conn.poll(0.2):
        if process is not None and not process.is_alive() and not conn.poll(0):
            raise WorkerFailed(f"the {what} exited with code {process.exitcode} without answering")
        if time.monotonic() >= deadline:
            raise WorkerFailed(f"no answer from the {what} within {timeout:.0f} s")
    try:
        return conn.recv()
    except EOFError as exc:
        raise WorkerFailed(f"the {what} died") from exc
