"""The sessions file: persistent sessions survive a broker restart (see docs/broker.md).

``SessionStore`` reads ``meta/sessions.json`` in the storage directory once at start and puts its sessions
back into the router as offline sessions, writes it every ``sessions.persist_interval_s`` (encoded and
written off the loop), and a last time at stop, once the commitlog has routed everything it acknowledged.
Every write is atomic: a temporary file, fsync, rename over the old one, fsync of the directory, so a crash
leaves the old snapshot or the new one, never part of one.

A file that cannot be read (corrupt, truncated, not a snapshot) or that a newer broker wrote never stops the
broker: the error is logged with the file's name, the file is moved aside (kept for inspection, never
overwritten by the next write) and the broker starts without persisted sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker_edge.engine.sessions.snapshot import (
    NewerSnapshotVersion,
    Snapshot,
    add_checks,
    capture,
    parse,
    restore,
)
from broker_edge.observe.refusal_log import FailingWrites
from broker_edge.runtime.qos2_journal import Qos2Journal
from broker_edge.runtime.qos2_log_ids import hold_logged_ids
from broker_edge.storage.segment import fsync_directory

if TYPE_CHECKING:
    from broker_edge.engine.routing.router import Router
    from broker_edge.settings.broker import SessionsConfig

__all__ = ["SESSIONS_FILE", "SessionStore"]

log = logging.getLogger(__name__)

SESSIONS_FILE = "sessions.json"


class SessionStore:
    """Persistent sessions of ``router`` in ``directory/sessions.json`` (the store's ``meta`` directory, apart
    from the topic logs of ``log_store``: no topic name can reach it).

    ``can_subscribe(client_id, username, filter)`` is the current ACL: a restored subscription it no longer
    allows is dropped.
    """

    def __init__(
        self,
        directory: Path,
        router: Router,
        log_store: Any,
        config: SessionsConfig,
        loop: asyncio.AbstractEventLoop,
        can_subscribe: Callable[[str, str | None, str], bool] | None = None,
    ) -> None:
        self.path = directory / SESSIONS_FILE
        self.router = router
        self.log_store = log_store
        self.config = config
        self.loop = loop
        self.can_subscribe = can_subscribe
        self._next_write = loop.time() + config.persist_interval_s
        self._writing: asyncio.Future[None] | None = None
        self.journal = Qos2Journal(directory)
        router.qos2_journal = self.journal.record
        self._said = FailingWrites(
            log, "writing persistent sessions", self.path, "the last file written stays"
        )

    # -- start ----------------------------------------------------------------------------------------------

    def restore(self) -> int:
        """Read the file (if any) and restore its sessions; returns how many were restored."""
        snapshot = self._read()
        if snapshot is None:
            return 0
        restored, expired, over, moved = restore(
            self.router,
            snapshot,
            self._log_ends(),
            self.loop.time(),
            time.time(),
            self.config.max_session_expiry_s,
            self.can_subscribe,
            self.config.max_persistent,
            self.log_store.store_id,
        )
        journal = self.journal.replay(self.router, snapshot.journal_from)
        if journal.held:
            log.info(
                "%d incoming QoS 2 ids held since the last snapshot restored from the journal", journal.held
            )
        logged = hold_logged_ids(
            self.router, self.log_store, snapshot.log_ends, journal, snapshot.log_positions
        )
        if logged:
            log.info(
                "%d incoming QoS 2 ids restored from the log's records since the last snapshot (appended,"
                " not yet answered when the broker stopped)",
                logged,
            )
        if snapshot.damaged:
            log.error(
                "%s: %d persistent sessions failed their check (the file is damaged): not restored, the"
                " others are; a copy is kept as %s",
                self.path,
                snapshot.damaged,
                self._copy_aside("damaged"),
            )
        if moved:
            log.warning(
                "%d positions of persistent sessions were past their logs' ends (the logs lost records or"
                " were wiped since %s was written): those sessions read the logs from their ends now",
                moved,
                self.path,
            )
        if over:
            log.warning(
                "%d persistent sessions not restored: sessions.max_persistent is %d",
                over,
                self.config.max_persistent,
            )
        log.info(
            "restored %d persistent sessions from %s (%d expired while the broker was down)",
            restored,
            self.path,
            expired,
        )
        return restored

    def _read(self) -> Snapshot | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._refuse(f"cannot be read ({exc})", "unreadable")
            return None
        try:
            return parse(json.loads(data))
        except NewerSnapshotVersion as exc:
            self._refuse(f"was written by a newer broker: {exc}", "newer")
        except (ValueError, RecursionError) as exc:  # JSON, UTF-8 and SnapshotError are ValueErrors
            self._refuse(f"is corrupt ({exc})", "corrupt")
        return None

    def _copy_aside(self, suffix: str) -> str:
        """A copy of the file for inspection (it is written again at the next interval)."""
        aside = self.path.with_name(f"{self.path.name}.{suffix}-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            shutil.copyfile(self.path, aside)
        except OSError as exc:
            return f"none ({exc})"
        return str(aside)

    def _refuse(self, why: str, suffix: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.{suffix}-{time.strftime('%Y%m%dT%H%M%S')}")
        try:
            os.replace(self.path, aside)
            fsync_directory(str(self.path.parent))
            where = f"moved to {aside}"
        except OSError as exc:
            where = f"could not be moved aside ({exc})"
        log.error("persistent sessions not restored: %s %s; %s; starting without them", self.path, why, where)

    # -- writing --------------------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Write a snapshot in the background when the interval has passed (the broker's sweep calls it)."""
        if now < self._next_write or (self._writing is not None and not self._writing.done()):
            return
        self._next_write = now + self.config.persist_interval_s
        self._writing = self.loop.run_in_executor(None, self._write, self._capture())

    async def close(self) -> None:
        """At stop: let the commitlog route what it acknowledged, then write the last snapshot.

        Call after the connections are closed and before the log store is."""
        for _ in range(2):  # connections closing (their wills), then the appends they queued
            await asyncio.sleep(0)
        with contextlib.suppress(Exception):  # a failed store has nothing more to route
            await self.log_store.wait_durable()
        await asyncio.sleep(0)  # the routing callbacks of those appends
        if self._writing is not None:
            await self._writing
        self._write(self._capture())
        self.journal.close()

    def _capture(self) -> dict[str, Any]:
        """The document, built on the loop (the router is not thread-safe); plain data from here on."""
        sessions = self.router.sessions
        persistent = any(s.expiry_interval > 0 for s in sessions.values())
        positions = [p.end for p in self.log_store.partitions()] if persistent else None  # before the ends
        log_ends = self._log_ends() if persistent else {}
        document = capture(
            self.router, log_ends, self.loop.time(), time.time(), self.log_store.store_id, positions
        )
        document["journal_from"] = self.journal.rotate()  # what the sessions hold after this is there
        return document

    def _log_ends(self) -> dict[str, int]:
        return self.log_store.end_offsets()

    def _write(self, document: dict[str, Any]) -> None:
        """Replace the file atomically with ``document``; a failure (a full disk, the directory removed) is
        logged when the writes start failing and at most once a minute after (``FailingWrites``), the old
        file stays, and the next interval writes again."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            data = json.dumps(add_checks(document), separators=(",", ":")).encode()
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # user names
            with os.fdopen(descriptor, "wb") as file:
                file.write(data)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, self.path)
            fsync_directory(str(self.path.parent))
            self.journal.forget_before(document["journal_from"])
        except (OSError, ValueError) as exc:
            self._said.failed(exc)
            with contextlib.suppress(OSError):  # a full disk: give back what part of it took
                os.unlink(temporary)
        else:
            self._said.succeeded()
