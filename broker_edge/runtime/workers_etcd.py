"""The etcd of ``timestone broker --workers N`` without a ``cluster:`` section: Debian's ``etcd`` (package
etcd-server) on free loopback ports, its data beside the members', started once it serves and again when it
exits (on other free ports where another process took one of its own meanwhile: the members follow), tried
again while it cannot start; its log bounded (``ETCD_LOG_BYTES``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from broker_edge.config.loader import ConfigError
from broker_edge.process.parent_death import die_with_parent
from broker_edge.runtime.launcher import free_ports

__all__ = ["LocalEtcd", "StartStopped", "stop_pending"]

log = logging.getLogger("broker_edge.workers")

ETCD_START_TIMEOUT_S = 20.0
ETCD_RETRY_S = 1.0
"""The first wait before the command's etcd that could not start again is tried again; doubled while it
keeps failing, up to ``ETCD_RETRY_MAX_S``."""
ETCD_RETRY_MAX_S = 30.0
ETCD_HISTORY = "1h"
"""How much of its history the command's etcd keeps (``--auto-compaction-retention``, periodic): every
client's connection writes a version of its session's record; older versions are compacted away, so that the
database holds what the cluster holds now (and reuses its pages) instead of growing to its quota."""
ETCD_LOG_BYTES = 10_000_000
"""etcd's log (``workers/etcd.log``, at WARNING) is kept under this: past it, its lines go to ``etcd.log.1``,
the one older file kept (checked every ``HEALTH_EVERY_S`` and at each start)."""
ETCD_HUNG_S = 5.0
"""The command's etcd that answers nothing for this long (asked every ``HEALTH_EVERY_S``) hangs: stopped
(SIGSTOP), its disk stalled, deadlocked. The members' leases ran out before (they are fenced, acknowledging
nothing): it is killed and started again, as an etcd that exited."""
HEALTH_EVERY_S = 1.0
WAL_FILE_BYTES = 64_000_000
"""etcd's write-ahead log file, preallocated whole (etcd 3.4's ``wal.SegmentSizeBytes``)."""
ETCD_DISK_BYTES = 2 * WAL_FILE_BYTES + 2_000_000
"""What etcd takes of its disk from its start: its write-ahead log file, the next one preallocated ahead, and
its database's first pages."""


class StartStopped(Exception):
    """A SIGTERM or SIGINT came while etcd was starting: it is stopped, and so is the command."""


def stop_pending() -> bool:
    """Whether a SIGTERM or SIGINT waits for this command (blocked, taken by ``sigtimedwait`` later)."""
    return bool(signal.sigpending() & {signal.SIGTERM, signal.SIGINT})


class LocalEtcd:
    """Debian's etcd on two free loopback ports, its data in ``directory/etcd`` (mode 0700), its log in
    ``directory/etcd.log``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.url = ""
        self.ports = (0, 0)
        """Its client and peer ports."""
        self.moved = False
        """Started again on other ports (one of its own was taken): the members must be told its new URL
        (the command clears this once it told them)."""
        self._binary = ""
        self.process: subprocess.Popen[bytes] | None = None
        self._command: list[str] = []
        self.retry_at: float | None = None
        """When to try again to start it (it exited and did not start again); None while it serves."""
        self._delay = ETCD_RETRY_S
        self.heard_at: float | None = None
        """When it last answered (None: not running, or killed as hung)."""
        self._ask_at = 0.0
        self._silent_since: float | None = None
        """When the questions it has left unanswered began (None: it answered the last)."""

    def start(self) -> str:
        """Start it and wait until it answers; its client URL."""
        binary = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
        if binary is None:
            raise ConfigError(
                "cluster",
                "--workers without a cluster: section runs its own etcd, and no etcd binary was found "
                "(install Debian's etcd-server, or name an etcd in a cluster: section)",
            )
        data = self.directory / "etcd"
        data.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(data, 0o700)  # etcd refuses a data directory others may read
        _check_room(data)
        self._binary = binary
        self._on_ports(*free_ports(2))
        self._launch()
        log.info("etcd for the members on %s (data in %s)", self.url, data)
        return self.url

    def _on_ports(self, client: int, peer: int) -> None:
        """Its command line and URL for these loopback ports."""
        self.ports = (client, peer)
        self.url = f"http://127.0.0.1:{client}"
        self._command = [
            self._binary,
            "--name",
            "timestone-workers",
            "--data-dir",
            str(self.directory / "etcd"),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls",
            f"http://127.0.0.1:{peer}",
            "--initial-cluster",
            f"timestone-workers=http://127.0.0.1:{peer}",
            "--logger",
            "zap",
            "--log-level",
            "warn",
            "--auto-compaction-mode",
            "periodic",
            "--auto-compaction-retention",
            ETCD_HISTORY,
        ]

    def _move_if_taken(self) -> None:
        """Before it starts again: a port of its own another process took meanwhile (etcd could never bind
        it again) is replaced by free ones; ``moved`` then tells the command to give the members its new
        URL. One etcd member alone on its data: its own peer URL may change (etcd 3.4 takes the new one)."""
        taken = [port for port in self.ports if not _bindable(port)]
        if not taken:
            return
        old = self.url
        self._on_ports(*free_ports(2))
        self.moved = True
        log.error(
            "etcd of the members cannot start again on %s: 127.0.0.1:%d is taken (by another process since "
            "it started): starting it on %s, the members started again with it",
            old,
            taken[0],
            self.url,
        )

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` is its process."""
        return self.process is not None and self.process.pid == pid

    def watch(self) -> float:
        """Ask it, every ``HEALTH_EVERY_S`` while it runs, whether it answers: one that answered none of the
        questions of ``ETCD_HUNG_S`` is killed (SIGKILL), to be started again once its exit is seen
        (``restart``); a question or two unanswered after this command itself was held up (a paused machine)
        is no hang. The seconds until it is to be asked again."""
        now = time.monotonic()
        process = self.process
        if process is None or self.heard_at is None:
            return HEALTH_EVERY_S
        if now < self._ask_at:
            return self._ask_at - now
        _bound_log(self.directory / "etcd.log")
        if _answers(self.url):
            self.heard_at, self._silent_since = time.monotonic(), None
        else:
            if self._silent_since is None:
                self._silent_since = now
            if now - self._silent_since >= ETCD_HUNG_S:
                self._kill_hung(process.pid, now - self._silent_since)
        self._ask_at = time.monotonic() + HEALTH_EVERY_S
        return HEALTH_EVERY_S

    def _kill_hung(self, pid: int, silent_s: float) -> None:
        log.error(
            "etcd of the members (pid %d) answered nothing for %.0f s (hung: stopped, its disk stalled, "
            "deadlocked): killed, to be started again; the members acknowledge nothing until it answers",
            pid,
            silent_s,
        )
        self.heard_at = self._silent_since = None
        with contextlib.suppress(ProcessLookupError):  # not Popen.kill: its poll would reap the exit
            os.kill(pid, signal.SIGKILL)

    def restart(self, status: int) -> None:
        """It exited (``status``, as ``waitpid`` gives it, the process already reaped): start it again on the
        same ports and data, where the members look for it (``try_again``; on free ones where another
        process took one of them meanwhile: ``moved``)."""
        how = (
            f"signal {os.WTERMSIG(status)}"
            if os.WIFSIGNALED(status)
            else f"status {os.waitstatus_to_exitcode(status)}"
        )
        log.error("etcd of the members exited (%s): starting it again on %s", how, self.url)
        self.process = None
        self.try_again()

    def try_again(self) -> None:
        """Start it again; one that does not serve (its disk full, its data unreadable) is tried again at
        ``retry_at``, after a wait that doubles up to ``ETCD_RETRY_MAX_S``: the members, fenced meanwhile,
        serve again once it does, where the command stopped them all for a passing shortage."""
        try:
            self._move_if_taken()
            self._launch()
        except StartStopped:  # the supervision loop takes the signal next, before it tries again
            self.retry_at = time.monotonic() + self._delay
            return
        except RuntimeError as error:
            log.error(
                "%s: trying again in %.0f s (the members acknowledge nothing meanwhile)", error, self._delay
            )
            self.retry_at = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, ETCD_RETRY_MAX_S)
            return
        self.retry_at, self._delay = None, ETCD_RETRY_S
        log.warning("etcd of the members answers again on %s", self.url)

    def _launch(self) -> None:
        """Start it and wait until it serves; ``RuntimeError`` saying why it did not (etcd's own last word
        from its log), ``StartStopped`` (it stopped) when a SIGTERM or SIGINT came meanwhile."""
        parent = os.getpid()
        self.heard_at = self._silent_since = None  # not watched until it serves
        etcd_log = self.directory / "etcd.log"
        _bound_log(etcd_log)
        with open(etcd_log, "ab") as output:
            logged = output.tell()
            self.process = subprocess.Popen(
                self._command,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=output,
                start_new_session=True,  # stopped by this command, after the members, never by a Ctrl-C
                preexec_fn=lambda: _etcd_process(parent),
            )
        deadline = time.monotonic() + ETCD_START_TIMEOUT_S
        while not _serves(self.url):
            if stop_pending():
                self.stop()
                raise StartStopped
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                reason = _etcd_last_word(etcd_log, logged)
                raise RuntimeError(f"etcd did not start{f' ({reason})' if reason else ''}: see {etcd_log}")
            time.sleep(0.05)
        self.heard_at = time.monotonic()

    def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.terminate()
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGCONT)  # a stopped (hung) one takes its SIGTERM now
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _bindable(port: int) -> bool:
    """Whether a listener may bind 127.0.0.1:``port`` (as etcd binds it: ``SO_REUSEADDR``, so that its own
    connections left in TIME_WAIT are no obstacle)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _bound_log(path: Path) -> None:
    """Keep etcd's log (appended to by etcd, ``O_APPEND``) under ``ETCD_LOG_BYTES``: past it, its lines are
    copied to ``<path>.1`` (the one older file kept) and it is emptied in place, as logrotate's
    ``copytruncate`` does (etcd writes on at its new end); a line written in between may be lost."""
    try:
        if not path.exists() or path.stat().st_size <= ETCD_LOG_BYTES:
            return
        older = path.with_name(path.name + ".1")
        shutil.copyfile(path, older)
        os.truncate(path, 0)
    except OSError as error:  # a full disk: the log is information, never a reason to stop
        log.warning("etcd's log %s not rotated: %s", path, error)


def _check_room(data: Path) -> None:
    """``RuntimeError`` naming ``data`` when its filesystem cannot hold etcd (``ETCD_DISK_BYTES``, less
    what it holds there already): with less it ends at once, or runs with the members' disk all but full and
    ends at its next log file."""
    held = sum(
        path.lstat().st_blocks * 512 for path in data.rglob("*") if path.is_file() and not path.is_symlink()
    )
    stats = os.statvfs(data)
    free = stats.f_bavail * stats.f_frsize
    if free + held >= ETCD_DISK_BYTES:
        return
    holds = f" and etcd holds {held // 1_000_000} MB there" if held else ""
    raise RuntimeError(
        f"the etcd of --workers needs about {ETCD_DISK_BYTES // 1_000_000} MB free in {data} (its "
        f"write-ahead log is preallocated in two {WAL_FILE_BYTES // 1_000_000} MB files); its filesystem has "
        f"{free // 1_000_000} MB free{holds}: free space there, move storage.directory to a larger disk, or "
        "name an etcd in a cluster: section"
    )


def _etcd_last_word(path: Path, since: int) -> str:
    """The message of etcd's last fatal or panic line written to its log from ``since`` on, with its error
    (``failed to create WAL: no space left on device``); empty if none."""
    try:
        with open(path, "rb") as etcd_log:
            etcd_log.seek(since)
            lines = etcd_log.read(1 << 20).decode("utf-8", "replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("fatal", "panic"):
            return ": ".join(str(entry[key]) for key in ("msg", "error") if entry.get(key))
    return ""


def _etcd_process(parent: int) -> None:
    """In etcd's process before it runs: SIGTERM when this command dies, and no signal blocked (this
    command blocks those it takes with sigtimedwait; etcd would inherit them blocked, SIGTERM included)."""
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    die_with_parent(signal.SIGTERM, parent)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""Requests to the command's own etcd on loopback: never through an ``http_proxy`` of the environment."""


def _answers(url: str) -> bool:
    """Whether etcd at ``url`` answers its ``/health`` at all within a second: one that says it is not
    healthy (an alarm raised, no leader) answers, and is no hung process."""
    try:
        with _DIRECT.open(f"{url}/health", timeout=1.0) as answer:
            answer.read()
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):
        return False
    return True


def _serves(url: str) -> bool:
    """Whether etcd at ``url`` serves its clients: its ``/health`` answers. Its port accepts connections
    a moment before (its server not ready, its member not yet leader), when a member's first calls fail."""
    try:
        with _DIRECT.open(f"{url}/health", timeout=1.0) as answer:
            return bool(json.load(answer).get("health") == "true")
    except (OSError, ValueError, AttributeError):
        return False
