"""Leader epochs per topic log: which leader epoch appended which range of offsets (Kafka's KIP-101/320).

Each replicated log keeps `(epoch, start_offset)` pairs, one per epoch under which records were appended,
in increasing order of both. A leader adds a pair when it first appends to a topic under a new epoch; a
follower copies its leader's pairs from fetch responses. A replica asking a (new) leader to go on from
`(offset, last_fetched_epoch)` is told where that epoch ends on the leader (`end_offset_for`): when it ends
before `offset`, the replica's tail diverged (records a former leader appended and never committed) and is
truncated there before following.

The pairs are kept in the journal of the topic's storage partition (`broker_edge.storage.epoch_journal`):
a change appends the topic's list, once per topic per leader change, and a first publish on a new device
topic must not wait for a disk sync on the event loop, so the journal's fsync runs in a worker thread; the
store syncs it again before each checkpoint of the committed ends. Losing the newest pairs in a crash is
safe: they are of records above the saved committed end, and a replica whose cache lacks an epoch reports
an older `last_fetched_epoch` (or none), which ends earlier on the leader but not below that committed end,
so it truncates earlier than needed and fetches those records again. A journal that cannot be read is
logged and treated as empty: the leader then asks the replica to cut records it holds committed, which it
refuses, and it stays out of the in-sync set (docs/cluster.md). A broker that is not in a cluster writes
none.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_right
from typing import TYPE_CHECKING

from broker_edge.storage.epoch_journal import EpochJournal

if TYPE_CHECKING:
    from broker_edge.storage.store import LogStore

__all__ = ["NO_EPOCH", "EpochCache", "LeaderEpochs"]

log = logging.getLogger(__name__)

NO_EPOCH = -1
"""The epoch of an empty log (or of records older than any known epoch)."""


class EpochCache:
    """The `(epoch, start_offset)` pairs of one topic's log, kept in its partition's journal."""

    __slots__ = ("_epochs", "_starts", "journal", "topic_id")

    def __init__(
        self, journal: EpochJournal, topic_id: int, entries: list[tuple[int, int]] | None = None
    ) -> None:
        self.journal = journal
        self.topic_id = topic_id
        self._epochs = [epoch for epoch, _ in entries or ()]
        self._starts = [start for _, start in entries or ()]

    @classmethod
    def load(cls, journal: EpochJournal, topic_id: int, log_end: int) -> EpochCache:
        """The topic's pairs from the journal (none: no epochs yet); pairs starting at or past `log_end` are
        dropped (a crash between a truncation of the log and of its epochs)."""
        cache = cls(journal, topic_id, journal.entries(topic_id))
        if cache._starts and cache._starts[-1] >= log_end:
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

    def clear(self) -> None:
        """Forget every epoch (the log restarted empty at a later offset)."""
        self._epochs.clear()
        self._starts.clear()
        self._write()

    def _write(self) -> None:
        self.journal.record(self.topic_id, self.entries)
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.journal.sync()
            return
        loop.run_in_executor(None, self.journal.sync)


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
            journal = store.replicated_log.epoch_journal(store.partition_of(topic))
            end = store.durable_end(topic)
            cache = self._caches[topic] = EpochCache.load(journal, store.topic_id(topic), end)
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
        self._store.replicated_log.truncate_to(topic, offset)
        if topic in self._store:
            self.for_topic(topic).truncate_from(offset)

    def restart_at(self, topic: str, offset: int) -> None:
        """Empty `topic`'s log (and epochs) to continue at `offset`."""
        self._store.replicated_log.restart_at(topic, offset)
        self.for_topic(topic).clear()
