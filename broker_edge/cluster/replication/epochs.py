"""Leader epochs per topic log: which leader epoch appended which range of offsets (Kafka's KIP-101/320).

Each replicated log keeps a small file `leader-epochs` in its directory: `(epoch, start_offset)` pairs, one
per epoch under which records were appended, in increasing order of both. A leader adds a pair when it
first appends to a topic under a new epoch; a follower copies its leader's pairs from fetch responses. A
replica asking a (new) leader to go on from `(offset, last_fetched_epoch)` is told where that epoch ends on
the leader (`end_offset_for`): when it ends before `offset`, the replica's tail diverged (records a former
leader appended and never committed) and is truncated there before following.

The file is rewritten whole (temporary file, rename): it changes once per topic per leader change, and a
first publish on a new device topic must not wait for a disk sync on the event loop, so the fsyncs of the
file and its directory run in a worker thread. Losing the newest pairs in a crash is safe: a replica whose
cache lacks an epoch reports an older `last_fetched_epoch` (or none), which ends earlier on the leader, so
it truncates earlier than needed and fetches those records again. A file that cannot be read is logged
and treated as empty, with the same effect. A broker that is not in a cluster writes none.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from bisect import bisect_right
from typing import TYPE_CHECKING

from broker_edge.storage.segment import fsync_directory

if TYPE_CHECKING:
    from broker_edge.storage.store import LogStore

__all__ = ["EPOCHS_FILE", "NO_EPOCH", "EpochCache", "LeaderEpochs"]

log = logging.getLogger(__name__)

EPOCHS_FILE = "leader-epochs"
NO_EPOCH = -1
"""The epoch of an empty log (or of records older than any known epoch)."""
_VERSION = "1"


class EpochCache:
    """The `(epoch, start_offset)` pairs of one topic's log, kept in `directory/leader-epochs`."""

    __slots__ = ("_epochs", "_starts", "directory")

    def __init__(self, directory: str, entries: list[tuple[int, int]] | None = None) -> None:
        self.directory = directory
        self._epochs = [epoch for epoch, _ in entries or ()]
        self._starts = [start for _, start in entries or ()]

    @classmethod
    def load(cls, directory: str, log_end: int) -> EpochCache:
        """Read the file (none: no epochs yet); pairs starting at or past `log_end` are dropped (a crash
        between a truncation of the log and of its epochs)."""
        path = os.path.join(directory, EPOCHS_FILE)
        entries: list[tuple[int, int]] = []
        try:
            with open(path, encoding="ascii") as file:
                lines = file.read().split("\n")
        except FileNotFoundError:
            return cls(directory)
        try:
            entries = _parse(path, lines)
        except ValueError as error:
            log.error("%s; the log's replicas will compare it from its start", error)
            entries = []
        cache = cls(directory, entries)
        if entries and entries[-1][1] >= log_end:
            cache.truncate_from(log_end)
        return cache

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._starts, strict=True))

    @property
    def latest_epoch(self) -> int:
        """The epoch of the newest records (`NO_EPOCH` for none)."""
        return self._epochs[-1] if self._epochs else NO_EPOCH

    def epoch_at(self, offset: int) -> int:
        """The epoch that appended the record at `offset`."""
        position = bisect_right(self._starts, offset) - 1
        return self._epochs[position] if position >= 0 else NO_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Records from `start_offset` on were appended under `epoch`; a no-op unless `epoch` is newer than
        every known one. Returns whether the file was written."""
        if self._epochs and epoch <= self._epochs[-1]:
            return False
        if self._starts and start_offset <= self._starts[-1]:
            start_offset = self._starts[-1]  # the previous epoch has no record left here
            self._epochs.pop()
            self._starts.pop()
        self._epochs.append(epoch)
        self._starts.append(start_offset)
        self._write()
        return True

    def end_offset_for(self, epoch: int, log_end: int) -> tuple[int, int]:
        """`(e, end)`: the largest known epoch `e <= epoch` and the offset where it ends here (the start of
        the next epoch, or `log_end` for the latest). `(NO_EPOCH, start of the first epoch)` when `epoch`
        is older than all of them; `(NO_EPOCH, log_end)` without epochs."""
        epochs = self._epochs
        if not epochs:
            return NO_EPOCH, log_end
        position = bisect_right(epochs, epoch) - 1
        if position < 0:
            return NO_EPOCH, self._starts[0]
        if position == len(epochs) - 1:
            return epochs[position], log_end
        return epochs[position], self._starts[position + 1]

    def boundaries(self, first: int, end: int) -> list[tuple[int, int]]:
        """The pairs describing records `first .. end - 1`: the epoch of `first` (with its own start),
        then every epoch starting before `end`."""
        starts = self._starts
        position = max(bisect_right(starts, first) - 1, 0)
        stop = bisect_right(starts, end - 1)
        return list(zip(self._epochs[position:stop], starts[position:stop], strict=True))

    def truncate_from(self, offset: int) -> None:
        """Forget epochs starting at or after `offset` (the log was truncated there)."""
        keep = bisect_right(self._starts, offset - 1) if offset > 0 else 0
        if keep < len(self._starts):
            del self._epochs[keep:]
            del self._starts[keep:]
            self._write()

    def _write(self) -> None:
        path = os.path.join(self.directory, EPOCHS_FILE)
        temporary = path + ".tmp"
        lines = [
            _VERSION,
            *(f"{epoch} {start}" for epoch, start in zip(self._epochs, self._starts, strict=True)),
        ]
        with open(temporary, "w", encoding="ascii") as file:
            file.write("\n".join(lines) + "\n")
        os.replace(temporary, path)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            _sync(path)
            return
        loop.run_in_executor(None, _sync, path)


def _sync(path: str) -> None:
    """Make a rewritten epoch file durable: its data, then the rename (its directory)."""
    try:
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)
        fsync_directory(os.path.dirname(path))
    except OSError as error:
        log.error("cannot sync %s: %s", path, error)


def _parse(path: str, lines: list[str]) -> list[tuple[int, int]]:
    if not lines or lines[0] != _VERSION:
        raise ValueError(f"{path}: not a leader epoch file of version {_VERSION}")
    entries: list[tuple[int, int]] = []
    for number, line in enumerate(lines[1:], 2):
        if not line:
            continue
        parts = line.split(" ")
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            raise ValueError(f"{path}:{number}: expected 'epoch start_offset', got {line!r}")
        epoch, start = int(parts[0]), int(parts[1])
        if entries and (epoch <= entries[-1][0] or start < entries[-1][1]):
            raise ValueError(f"{path}:{number}: epochs and offsets must increase")
        entries.append((epoch, start))
    return entries


class LeaderEpochs:
    """The epoch caches of a store's logs, loaded on first use per topic."""

    def __init__(self, store: LogStore) -> None:
        self._store = store
        self._caches: dict[str, EpochCache] = {}

    def for_topic(self, topic: str) -> EpochCache:
        """The cache of `topic`'s log (which must exist)."""
        cache = self._caches.get(topic)
        if cache is None:
            store = self._store
            cache = self._caches[topic] = EpochCache.load(
                store.log_directory(topic), store.durable_end(topic)
            )
        return cache

    def epoch_at(self, topic: str, offset: int) -> int:
        """The epoch that appended `topic`'s record at `offset` (`NO_EPOCH` without a log)."""
        if topic not in self._store:
            return NO_EPOCH
        return self.for_topic(topic).epoch_at(offset)

    def latest_epoch(self, topic: str) -> int:
        """The epoch of `topic`'s newest record (`NO_EPOCH` without a log)."""
        if topic not in self._store:
            return NO_EPOCH
        return self.for_topic(topic).latest_epoch

    def truncate(self, topic: str, offset: int) -> None:
        """Truncate `topic`'s log and then its epochs at `offset` (see `LogStore.truncate`)."""
        self._store.truncate(topic, offset)
        if topic in self._store:
            self.for_topic(topic).truncate_from(offset)

    def restart_at(self, topic: str, offset: int) -> None:
        """Empty `topic`'s log (and epochs) to continue at `offset`."""
        self._store.restart_at(topic, offset)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._store.log_directory(topic), EPOCHS_FILE))
        self._caches.pop(topic, None)
