"""Incoming QoS 2 packet ids of persistent sessions between two session snapshots (see docs/broker.md).

The sessions file keeps the ids a session holds from PUBREC to PUBREL (``received``), but only as of its last
write: a broker killed after it lost the ids it answered since, and a publisher resending such a PUBLISH
(DUP 1) then had it logged and delivered twice. ``Qos2Journal`` appends one line per id held or released to
``meta/qos2-ids.<generation>`` before the PUBREC (or PUBCOMP) can leave: a write to the file, no fsync, so
it survives the process's death (not a power cut). Each snapshot starts a new generation (``rotate``) and
records it (``journal_from``); once the snapshot is written the older files are deleted. At start the files
from the snapshot's generation on are replayed, in order, onto the sessions it restored.

A line is ``[client_id, packet_id, 1]`` (held) or ``[client_id, packet_id, 0]`` (released) as JSON; a last
line that does not parse (cut by a power cut) is skipped, and so is any other line that is no such entry
(damaged, written by hand), said at WARNING.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from broker_edge.observe.refusal_log import FailingWrites

if TYPE_CHECKING:
    from broker_edge.engine.routing.router import Router

__all__ = ["JOURNAL_PREFIX", "JournalState", "Qos2Journal"]

log = logging.getLogger(__name__)

JOURNAL_PREFIX = "qos2-ids."


@dataclass
class JournalState:
    """What the files since a snapshot say: each id's last line (held or released), how many times each was
    released, and how many ids the replay held."""

    last: dict[tuple[str, int], bool] = field(default_factory=dict)
    releases: Counter[tuple[str, int]] = field(default_factory=Counter)
    held: int = 0


class Qos2Journal:
    """The journal files in ``directory`` (the store's ``meta`` directory)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.generation = max(self._generations(), default=0) + 1
        self._fd: int | None = None
        self._said = FailingWrites(
            log,
            "writing incoming QoS 2 ids",
            directory / f"{JOURNAL_PREFIX}<n>",
            "until a file can be written, a broker killed meanwhile may log a resent QoS 2 PUBLISH again",
        )
        self._open()

    def _generations(self) -> list[int]:
        found = []
        for path in self.directory.glob(JOURNAL_PREFIX + "*"):
            suffix = path.name[len(JOURNAL_PREFIX) :]
            if suffix.isdigit():
                found.append(int(suffix))
        return sorted(found)

    def _path(self, generation: int) -> Path:
        return self.directory / f"{JOURNAL_PREFIX}{generation}"

    def _open(self) -> None:
        try:
            self._fd = os.open(self._path(self.generation), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except OSError as exc:
            self._fd = None
            self._said.failed(exc)
        else:
            self._said.succeeded()

    def record(self, client_id: str, packet_id: int, held: bool) -> None:
        """One id of ``client_id``'s session held (PUBREC due) or released (PUBCOMP due)."""
        fd = self._fd
        if fd is None:
            return
        line = json.dumps([client_id, packet_id, int(held)], separators=(",", ":")) + "\n"
        try:
            os.write(fd, line.encode())
        except OSError as exc:
            self._said.failed(exc)

    def rotate(self) -> int:
        """Start the next generation (a snapshot is being captured); returns it."""
        self._close()
        self.generation += 1
        self._open()
        return self.generation

    def forget_before(self, generation: int) -> None:
        """Delete the files older than ``generation`` (a snapshot that has them is written)."""
        for old in self._generations():
            if old < generation:
                with contextlib.suppress(OSError):
                    self._path(old).unlink()

    def replay(self, router: Router, since: int | None) -> JournalState:
        """Apply the files from generation ``since`` on (None: every file) to ``router``'s sessions; returns
        what they say (``JournalState``: ``held`` counts the ids held after it)."""
        state = JournalState()
        for generation in self._generations():
            if (since is None or generation >= since) and generation != self.generation:
                self._read(self._path(generation), state)
        for (client_id, packet_id), is_held in state.last.items():
            session = router.sessions.get(client_id)
            if session is None:
                continue
            if is_held:
                session.restore_incoming((packet_id,))
                state.held += 1
            else:
                session.release_incoming(packet_id)
        return state

    @staticmethod
    def _read(path: Path, state: JournalState) -> None:
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            log.error("reading incoming QoS 2 ids from %s failed: %s", path, exc)
            return
        lines = text.splitlines()
        skipped = 0
        for number, line in enumerate(lines, 1):
            entry = _entry(line)
            if entry is None:
                cut = number == len(lines) and not text.endswith("\n")  # a power cut in its last line
                skipped += not cut
                continue
            client_id, packet_id, is_held = entry
            state.last[(client_id, packet_id)] = is_held
            if not is_held:
                state.releases[(client_id, packet_id)] += 1
        if skipped:
            log.warning("%s: %d lines are not incoming QoS 2 ids (damaged): skipped", path, skipped)

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        """At stop, after the last snapshot (which deleted the files it has)."""
        self._close()


def _entry(line: str) -> tuple[str, int, bool] | None:
    """The (client id, packet id, held) of a journal line; None for a line that is no such entry."""
    try:
        entry = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: brackets nested past the parser's depth
        return None
    if not isinstance(entry, list) or len(entry) != 3:
        return None
    client_id, packet_id, is_held = entry
    if isinstance(client_id, str) and type(packet_id) is int and 0 < packet_id < 65536:
        return client_id, packet_id, bool(is_held)
    return None
