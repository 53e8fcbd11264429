"""The actions job's heartbeat: a small file beside the tables saying whether a job is acting on them.

An action written to the table waits for the actions job; ``timestone ota status`` reads this file to tell
the operator whether one is running against these tables (and will pick the action up) or not, and since
when. The job rewrites the file every :data:`INTERVAL_S` seconds and marks it stopped when it stops; a
beat older than :data:`STALE_AFTER_S` is a job that died without saying so. The file also says since when
the job holds every action, waiting for its reports stream to catch up with the brokers (written as the
wait starts and ends), so that status can say why nothing goes out.

The file is ``<tables root>/_timestone/actions_job.json`` (Delta ignores a directory that is no table), on
any file system Arrow opens (a local path, ``s3://``, ``gs://``, ``abfss://``).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from pyarrow import fs as pafs

__all__ = ["INTERVAL_S", "STALE_AFTER_S", "Heartbeat", "HeartbeatWriter", "read_heartbeat"]

INTERVAL_S = 5.0
STALE_AFTER_S = 30.0
RELATIVE_PATH = "_timestone/actions_job.json"


@dataclass(frozen=True)
class Heartbeat:
    """What the job last said about itself (times in epoch ms)."""

    host: str
    pid: int
    started_at_ms: int
    beat_at_ms: int
    stopped: bool = False
    reports_wait_since_ms: int | None = None
    """Since when the job sends nothing, waiting for its reports stream to catch up with the brokers (None:
    it sends)."""

    def running(self, now_ms: int) -> bool:
        """Whether the job is running now: it beat recently and did not say it stopped."""
        return not self.stopped and now_ms - self.beat_at_ms <= STALE_AFTER_S * 1000


def _now_ms() -> int:
    return int(time.time() * 1000)


def heartbeat_location(tables_root: str) -> str:
    return f"{tables_root.rstrip('/')}/{RELATIVE_PATH}"


def _local_path(location: str) -> str | None:
    if location.startswith("file://"):
        return location.removeprefix("file://")
    return None if "://" in location else location


def read_heartbeat(tables_root: str) -> Heartbeat | None:
    """The last heartbeat of a job on these tables; None when no job ever wrote one (or it is unreadable)."""
    location = heartbeat_location(tables_root)
    try:
        local = _local_path(location)
        if local is not None:
            with open(local, encoding="utf-8") as file:
                data = json.load(file)
        else:
            filesystem, path = pafs.FileSystem.from_uri(location)
            with filesystem.open_input_stream(path) as stream:
                data = json.loads(stream.read())
        return Heartbeat(**data)
    except (OSError, ValueError, TypeError):
        return None


def write_heartbeat(tables_root: str, beat: Heartbeat) -> None:
    """Replace the heartbeat file (atomically on a local file system)."""
    location = heartbeat_location(tables_root)
    body = json.dumps(asdict(beat)).encode()
    local = _local_path(location)
    if local is None:
        filesystem, path = pafs.FileSystem.from_uri(location)
        with filesystem.open_output_stream(path) as stream:
            stream.write(body)
        return
    directory = os.path.dirname(os.path.abspath(local))
    os.makedirs(directory, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".heartbeat-")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(body)
        os.replace(temporary, local)
    except BaseException:
        os.unlink(temporary)
        raise


class HeartbeatWriter:
    """The job's side: :meth:`beat` as often as convenient (it writes every :data:`INTERVAL_S` at most),
    :meth:`stop` once; a beat after the stop writes nothing (a tick that outlived the job's wait for its
    ticker must not say that the stopped job runs)."""

    def __init__(self, tables_root: str, clock: Callable[[], int] = _now_ms) -> None:
        self.tables_root = tables_root
        self.clock = clock
        now = clock()
        self._beat = Heartbeat(socket.gethostname(), os.getpid(), now, now)
        self._written_at: int | None = None
        self._stopped = False
        self._writing = threading.Lock()
        """The ticker beats while the job's stop writes the stop (a beat's check and write are one step)."""

    def beat(self, reports_wait_since_ms: int | None = None) -> None:
        """Say the job runs; ``reports_wait_since_ms``: since when it waits for its reports stream (written
        at once when that changes)."""
        with self._writing:
            if self._stopped:
                return
            now = self.clock()
            waits = reports_wait_since_ms != self._beat.reports_wait_since_ms
            if not waits and self._written_at is not None and now - self._written_at < INTERVAL_S * 1000:
                return
            self._beat = replace(self._beat, reports_wait_since_ms=reports_wait_since_ms)
            self._write(replace(self._beat, beat_at_ms=now))

    def stop(self) -> None:
        with self._writing:
            self._stopped = True
            stopped = replace(self._beat, beat_at_ms=self.clock(), stopped=True, reports_wait_since_ms=None)
            self._write(stopped)

    def _write(self, beat: Heartbeat) -> None:
        write_heartbeat(self.tables_root, beat)
        self._written_at = beat.beat_at_ms
