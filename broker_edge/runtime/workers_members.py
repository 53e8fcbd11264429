"""One member of ``timestone broker --workers N``: ``timestone broker`` in a process forked from the command,
which it tells over a pipe once it serves (and every second while it does) or why it could not start; killed
when it hangs, its etcd registration removed and started again when it exits after it served."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_edge.config.loader import ConfigError
from broker_edge.process.parent_death import die_with_parent
from broker_edge.settings.cluster import ClusterConfig

__all__ = ["HUNG_S", "SERVING", "Member", "RunBroker", "config_error_of", "config_refusal", "remove_pid_file"]

log = logging.getLogger("broker_edge.workers")

RESTART_DELAY_S = 0.1
"""The first wait before a member that exited is started again; doubled while it keeps failing."""
RESTART_DELAY_MAX_S = 30.0
STEADY_S = 60.0
"""A member that ran this long before it exited is started again after the first wait."""
HUNG_S = 10.0
"""A member that serves and says nothing for this long (it says it serves every ``main.HEARTBEAT_S``)
hangs: stopped (SIGSTOP), deadlocked, its loop blocked. Its lease ran out long before (the cluster took it
for dead): it is killed and started again, as a member that crashed."""
FORGET_TIMEOUT_S = 10.0


RunBroker = Callable[[str, str, Callable[[str | None], None]], int]
"""``timestone broker --config PATH`` as member NODE (``main.run_broker``), telling REPORT ``None`` once it
serves or why it could not start: its exit status."""

SERVING = b"serving\n"
"""What a member writes on its pipe once it serves, and again every ``main.HEARTBEAT_S`` while it does;
``failed <reason>`` lines say why it could not start."""


CONFIG_ERROR = "configuration error "
"""How a member's reason starts when it is a configuration error: its key and message follow (JSON), without
the member's file, which the command writes: the command names the file given and the key's line there."""


def config_refusal(error: ConfigError) -> str:
    """The reason a member tells its command of ``error``: its key and message, not where it was set."""
    return CONFIG_ERROR + json.dumps([error.path, error.detail])


def config_error_of(reason: str) -> ConfigError | None:
    """The configuration error a member's ``reason`` (``config_refusal``) tells, or None."""
    if not reason.startswith(CONFIG_ERROR):
        return None
    try:
        path, detail = json.loads(reason.removeprefix(CONFIG_ERROR))
    except ValueError:
        return None
    return ConfigError(str(path), str(detail))


class Member:
    """One member: ``timestone broker --config <its file>`` in a process forked from this command."""

    def __init__(self, node: str, config_path: Path, cluster: ClusterConfig, run: RunBroker) -> None:
        self.node = node
        self.run = run
        self.config_path = config_path
        self.cluster = cluster
        self.pid: int | None = None
        self.started_at = 0.0
        self.start_at: float | None = 0.0
        """When to start it (now or later: it exited and waits); None while it runs or stopping."""
        self.delay = RESTART_DELAY_S
        self.served = False
        """Whether it ever served (in any of its processes): from then on an exit is a crash to recover
        from by starting it again, whatever its status."""
        self.reports: int | None = None
        """The read end of the pipe its running process reports on (``SERVING``, or why it failed)."""
        self.serving = False
        """Whether its running process said it serves (its SIGHUP handler in place)."""
        self.reload_due = False
        """A SIGHUP came while its process was starting (ignoring it): passed on once it serves."""
        self.heard_at: float | None = None
        """When its running process last said it serves (None: not yet, or killed as hung)."""

    @property
    def pid_file(self) -> Path:
        return self.config_path.with_suffix(".pid")

    def start(self, inherited: list[int]) -> None:
        """Fork its process; ``inherited``: descriptors of this command's the member must close (the other
        members' pipes)."""
        parent = os.getpid()
        reports, report = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(reports)
            for fd in inherited:
                with contextlib.suppress(OSError):
                    os.close(fd)
            _member_process(self.run, str(self.config_path), self.node, parent, report)  # never returns
        os.close(report)
        os.set_blocking(reports, False)
        self.reports, self.serving, self.reload_due, self.heard_at = reports, False, False, None
        self.pid, self.started_at, self.start_at = pid, time.monotonic(), None
        try:  # information only: a full disk must not end the command
            self.pid_file.write_text(f"{pid}\n")
        except OSError as error:
            log.warning("member %s is pid %d: %s not written (%s)", self.node, pid, self.pid_file, error)

    def follow_etcd(self, url: str) -> None:
        """Name the command's etcd at ``url`` in its configuration file (read at its next start)."""
        from broker_edge.config.loader import load_yaml_file
        from broker_edge.runtime.workers_config import write_yaml

        document = load_yaml_file(self.config_path)  # its ``!env NAME`` values kept
        document["cluster"]["etcd"] = [url]
        write_yaml(self.config_path, document)
        self.cluster = dataclasses.replace(self.cluster, etcd=[url])

    def reload(self) -> None:
        """SIGHUP to its process (one that serves): it reads its files and certificates again."""
        self.reload_due = False
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGHUP)

    def read_reports(self) -> str | None:
        """Read what its process reported since the last call (noting that it serves); the last reason it
        gave for not starting, if any."""
        reason = None
        if self.reports is None:
            return None
        chunks = []
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self.reports, 65536):
                chunks.append(chunk)
        for line in b"".join(chunks).decode("utf-8", "replace").splitlines():
            if line == SERVING.decode().strip():
                self.served = self.serving = True
                self.heard_at = time.monotonic()
            elif line.startswith("failed "):
                reason = line.removeprefix("failed ")
        return reason

    def kill_if_hung(self) -> None:
        """SIGKILL to its process if it served and has said nothing for ``HUNG_S``: it is then started
        again as after a crash (``exited``), where it held its share of the shared listeners' new
        connections, unanswered, and its partitions without a leader for as long as it hung."""
        heard_at, pid = self.heard_at, self.pid
        if heard_at is None or pid is None or time.monotonic() - heard_at < HUNG_S:
            return
        log.error(
            "member %s (pid %d) said nothing for %.0f s (hung: stopped, deadlocked, its loop blocked): "
            "killed, to be started again",
            self.node,
            pid,
            time.monotonic() - heard_at,
        )
        self.heard_at = None
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)

    def ended(self) -> str | None:
        """Its process is gone: its pid file removed (if still its own), its pipe read and closed; the reason
        it gave for not starting, if any."""
        reason = self.read_reports()
        if self.reports is not None:
            os.close(self.reports)
            self.reports = None
        if self.pid is not None:
            remove_pid_file(self.pid_file, self.pid)
        self.pid = None
        return reason

    def failed_to_start(self, status: int) -> tuple[int, str] | None:
        """Its process ended by itself (``status`` as ``os.waitpid`` gives it): (exit status, reason) when
        it could not start (configuration error 2, cannot start 1) and never served; starting it again
        would fail the same way. None: a crash, to recover from by ``exited``."""
        node = self.node
        reason = self.ended()
        code = os.waitstatus_to_exitcode(status)
        if self.served or code not in (1, 2):
            return None
        return code, reason or f"member {node} exited (status {code}) before it served"

    def exited(self, status: int) -> None:
        """Its process ended (``status``) and ``failed_to_start`` said it was a crash: forget it in etcd and
        start it again after its wait."""
        code = os.waitstatus_to_exitcode(status)
        how = f"signal {-code}" if code < 0 else f"status {code}"
        if time.monotonic() - self.started_at >= STEADY_S:
            self.delay = RESTART_DELAY_S
        log.warning("member %s exited (%s): starting it again in %.1f s", self.node, how, self.delay)
        _run_in_child(lambda: asyncio.run(_forget_member(self.cluster, self.node)), FORGET_TIMEOUT_S)
        self.start_at = time.monotonic() + self.delay
        self.delay = min(self.delay * 2, RESTART_DELAY_MAX_S)


def remove_pid_file(path: Path, pid: int) -> None:
    """Remove ``path`` if it still holds ``pid``: a file another command wrote is never removed."""
    with contextlib.suppress(OSError):
        if path.read_text().strip() == str(pid):
            path.unlink()


def _member_process(run: RunBroker, config_path: str, node: str, parent: int, report: int) -> None:
    """The forked member: its own session (the command decides when it stops; SIGTERM if the command dies),
    SIGINT and SIGTERM noted until its loop takes them (``stop_signals``, as ``timestone broker`` has them
    from its start), SIGHUP ignored until then (its files are being read anyway), then ``timestone broker``,
    which tells ``report`` (a pipe to the command) when it serves, or why it could not start."""
    code = 1

    def tell(reason: str | None) -> None:
        line = SERVING if reason is None else f"failed {' '.join(reason.split())}\n".encode()
        with contextlib.suppress(OSError):
            os.write(report, line)

    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.set_blocking(report, False)  # a command busy for a moment never blocks the member's loop
        os.setsid()
        die_with_parent(signal.SIGTERM, parent)
        code = run(config_path, node, tell)
    except BaseException as error:
        traceback.print_exc()
        tell(f"{type(error).__name__}: {error}")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run_in_child(work: Any, timeout_s: float) -> None:
    """Run ``work()`` in a forked child and wait for it at most ``timeout_s``: this process stays free of
    threads (an etcd client's), so that it can keep forking members safely."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            work()
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


async def _forget_member(config: ClusterConfig, node: str) -> None:
    """Remove a dead member's registration, so that the cluster acts now rather than when its lease ends
    (its process is gone: it renews nothing; it registers anew once started again, after this)."""
    from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd

    etcd = Etcd(config.etcd, 5.0, config.etcd_tls, config.etcd_auth)
    try:
        await etcd.delete(ClusterKeys(config.key_prefix).member(node))
    finally:
        await etcd.close()
