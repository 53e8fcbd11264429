"""The leader epochs of a partition's topics, kept in one append-only journal (a cluster's replicas).

A replicated topic's log keeps which leader epoch appended which offsets
(`broker_edge.cluster.replication.epochs`).
With topics sharing partition logs there is no directory per topic to keep that in: each partition has one
journal, `log/NN/leader-epochs`. Its first line is the version; every change to a topic's epochs appends
the topic's whole list, ``<topic id> <epoch> <start> <epoch> <start> ...`` (a topic id alone: none), and
the last line of a topic wins. A topic's epochs change once per leader change, so lines are short and few;
when the journal holds more than twice the lines it folds to, it is rewritten whole (temporary file, fsync,
rename) at load.

Lines are appended to the page cache at once and fsynced by the caller off the event loop (a first
publish on a new device topic must not wait for a disk sync), and at the latest before the next checkpoint
of the committed ends (`replicated_log`): a crash can lose only lines of epochs whose records are not
committed in the saved checkpoint, and a replica that lacks one of those truncates earlier than needed,
above its committed end, and fetches again. A line that cannot be read (torn by a crash: without its
newline) is skipped.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Sequence

from .segment import fsync_directory

__all__ = ["EPOCHS_FILE", "EpochJournal"]

log = logging.getLogger(__name__)

EPOCHS_FILE = "leader-epochs"
_VERSION = "1"
_COMPACT_MIN_LINES = 1000


class EpochJournal:
    """One partition's journal of its topics' `(epoch, start_offset)` lists."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._entries: dict[int, list[tuple[int, int]]] | None = None
        self._lines = 0
        self._unsynced = False
        """Whether a line was recorded since the last sync began."""
        self._sync_lock = threading.Lock()

    def entries(self, topic_id: int) -> list[tuple[int, int]]:
        """The topic's pairs as last recorded (none for a topic never recorded)."""
        return list(self._folded().get(topic_id, ()))

    def record(self, topic_id: int, pairs: Sequence[tuple[int, int]]) -> None:
        """Append the topic's whole list (to the page cache: `sync` makes it durable)."""
        folded = self._folded()
        folded[topic_id] = list(pairs)
        line = " ".join([str(topic_id), *(f"{epoch} {start}" for epoch, start in pairs)]) + "\n"
        with open(self.path, "a", encoding="ascii") as file:
            if file.tell() == 0:
                file.write(_VERSION + "\n")
            file.write(line)
        self._lines += 1
        self._unsynced = True

    def sync(self) -> bool:
        """Make every line recorded so far durable: fsync the journal and its directory (in a worker
        thread: it may take a while); whether they are. It returns at once when nothing was recorded since
        the last sync began, once that sync has ended."""
        with self._sync_lock:
            if not self._unsynced:
                return True
            self._unsynced = False  # a line recorded from now on is synced by the next call
            try:
                descriptor = os.open(self.path, os.O_RDONLY)
                try:
                    os.fsync(descriptor)
                finally:
                    os.close(descriptor)
                fsync_directory(os.path.dirname(self.path))
            except OSError as error:
                self._unsynced = True
                log.error("cannot sync %s: %s", self.path, error)
                return False
            return True

    def _folded(self) -> dict[int, list[tuple[int, int]]]:
        if self._entries is None:
            self._entries, self._lines = _read(self.path)
            if self._lines > max(_COMPACT_MIN_LINES, 2 * len(self._entries)):
                self._rewrite()
        return self._entries

    def _rewrite(self) -> None:
        assert self._entries is not None
        temporary = self.path + ".tmp"
        with open(temporary, "w", encoding="ascii") as file:
            file.write(_VERSION + "\n")
            for topic_id, pairs in sorted(self._entries.items()):
                if pairs:
                    file.write(" ".join([str(topic_id), *(f"{e} {s}" for e, s in pairs)]) + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, self.path)
        fsync_directory(os.path.dirname(self.path))
        self._lines = sum(1 for pairs in self._entries.values() if pairs)


def _read(path: str) -> tuple[dict[int, list[tuple[int, int]]], int]:
    """The folded journal at `path` and how many lines it holds."""
    try:
        with open(path, encoding="ascii", errors="replace") as file:
            lines = file.read().split("\n")[:-1]  # a last line without its newline was torn: not read
    except FileNotFoundError:
        return {}, 0
    if not lines or lines[0] != _VERSION:
        log.error(
            "%s is not a leader epoch journal of version %s: its topics start without epochs", path, _VERSION
        )
        return {}, 0
    folded: dict[int, list[tuple[int, int]]] = {}
    count = 0
    for number, line in enumerate(lines[1:], 2):
        if not line:
            continue
        count += 1
        parts = line.split(" ")
        if not all(part.isdigit() for part in parts) or len(parts) % 2 != 1:
            log.warning("%s:%d: skipped an unreadable line (torn by a crash?)", path, number)
            continue
        values = [int(part) for part in parts]
        pairs = list(zip(values[1::2], values[2::2], strict=True))
        if any(b[0] <= a[0] or b[1] < a[1] for a, b in itertools.pairwise(pairs)):
            log.warning("%s:%d: skipped a line whose epochs and offsets do not increase", path, number)
            continue
        folded[values[0]] = pairs
    return folded, count
