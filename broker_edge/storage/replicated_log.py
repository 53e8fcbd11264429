"""The store's replicated-log interface: what a cluster's replicas and the uplink write through, and nothing
else of replication.

A replica appends its leader's frames verbatim at the leader's offsets (``append_at``), cuts a tail its new
leader does not have (``truncate_to``) or starts a log over where its leader's now starts (``restart_at``),
and reads frames to send by offset (``read_frames``, ``next_held``); a leader moves a log's committed end,
what readers see, once its in-sync replicas hold the records (``commit_to``). Which records are committed is
the cluster's decision (``cluster.partition``); the store keeps the committed ends and saves them to a
checkpoint (``hw_checkpoint``), so that a restart does not show readers more than was committed. Once
enabled (``enable``), readers see each log up to its committed end instead of its durable end. The leader
epochs of each partition are a journal the store keeps for the cluster (``epoch_journal``), made durable
before each checkpoint: the epochs of committed records survive any crash the checkpoint survives. A
site whose hub holds more of its logs than it does (its data directory was lost) moves them on to the
hub's ends (``continue_at``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from array import array
from typing import TYPE_CHECKING

from broker_edge.bounds import MAX_OFFSET
from broker_edge.observe import path_trace

from .entry import RESTART, TRUNCATE
from .epoch_journal import EPOCHS_FILE, EpochJournal
from .errors import (
    CorruptRecord,
    InvalidRecord,
    OffsetOutOfRange,
)
from .hw_checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from .record import FrameError, check_frames
from .store_state import StoreState, _check_offset

if TYPE_CHECKING:
    pass

log = logging.getLogger("broker_edge.storage.store")

__all__ = ["REPLICATED_SYNC_PIPELINE", "ReplicatedLog"]

REPLICATED_SYNC_PIPELINE = 2
"""Group-commit jobs a replicated store lets be in flight at once (see `GroupCommitter.pipeline`)."""


class ReplicatedLog:
    """The replicated-log interface of one store (see the module docstring)."""

    def __init__(self, store: StoreState) -> None:
        self._store = store
        self._checkpointed: bytes | None = None
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoints_taken = 0
        self._checkpoints_written = 0
        self._checkpoint_writing: asyncio.Future[None] | None = None
        self._epoch_journals: dict[int, EpochJournal] = {}

    def enable(self, checkpoint_interval_s: float = 5.0) -> None:
        """From now on readers see each log up to its committed end (`commit`), not its durable end.

        The logs found at open start committed up to the end the checkpoint saved for them (0 for a log it
        does not list); with no checkpoint at all (a store that was never replicated: everything in it was
        acknowledged alone) up to their durable end. The checkpoint is written at once, then every
        `checkpoint_interval_s` while an event loop runs (in a thread of its executor), and at close."""
        if self._store._replicated:
            return
        if checkpoint_interval_s <= 0:
            raise ValueError(f"checkpoint_interval_s must be positive, got {checkpoint_interval_s}")
        saved = (
            read_checkpoint(self._store.layout.meta_file(CHECKPOINT_FILE)) if self._store._opened else None
        )
        self._store._replicated = True
        self._store._committer.pipeline(REPLICATED_SYNC_PIPELINE)
        table = self._store._table
        committed = array("q", table.durable)
        if saved is not None:
            for topic_id, name in enumerate(self._store._names):
                committed[topic_id] = max(
                    table.start[topic_id], min(saved.get(name, 0), table.durable[topic_id])
                )
        table.committed = committed
        for part in self._store._partitions:
            part.replicated = True
        if self._store._opened:
            self.checkpoint()
            self._schedule_checkpoints(checkpoint_interval_s)

    def checkpoint(self) -> None:
        """Save every log's committed end (when one moved since the last checkpoint), before returning."""
        taken = self._take_checkpoint()
        if taken is not None:
            self._write_checkpoint(*taken)

    def _take_checkpoint(self) -> tuple[int, array, list[str]] | None:
        """The committed ends to save now, numbered (None: nothing moved since the last checkpoint)."""
        committed = self._store._table.committed
        if not self._store._replicated or not self._store._opened or committed is None:
            return None
        data = committed.tobytes()
        if data == self._checkpointed and os.path.exists(self._store.layout.meta_file(CHECKPOINT_FILE)):
            return None
        self._checkpointed = data
        self._checkpoints_taken += 1
        return self._checkpoints_taken, array("q", committed), self._store._names

    def _write_checkpoint(self, number: int, committed: array, names: list[str]) -> None:
        """Write checkpoint `number` unless a later one is written already (any thread)."""
        with self._checkpoint_lock:
            if number <= self._checkpoints_written:
                return
            if path_trace.ON:
                path_trace.mark("checkpoint", "", 0, 1)
            ends = {names[topic_id]: end for topic_id, end in enumerate(committed)}
            journals = tuple(self._epoch_journals.values())
            unsynced = [journal.path for journal in journals if not journal.sync()]
            if unsynced:  # epochs first (see `epoch_journal`): no checkpoint without them
                log.error(
                    "cannot save the committed ends of the logs while %s cannot be synced (tried again at "
                    "the next interval)",
                    ", ".join(unsynced),
                )
                self._checkpointed = None
                return
            try:
                write_checkpoint(self._store.layout.meta_file(CHECKPOINT_FILE), ends)
            except OSError as error:
                log.error(
                    "cannot save the committed ends of the logs (tried again at the next interval): %s", error
                )
                self._checkpointed = None  # the next periodic checkpoint writes them even if none moved
                return
            if path_trace.ON:
                path_trace.mark("checkpointed", "", 0, 1)
            self._checkpoints_written = number

    def _schedule_checkpoints(self, interval_s: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (a tool): the checkpoint is written at close

        def tick() -> None:
            if self._store._closed:
                return
            writing = self._checkpoint_writing
            if writing is None or writing.done():
                taken = self._take_checkpoint()
                if taken is not None:
                    self._checkpoint_writing = loop.run_in_executor(None, self._write_checkpoint, *taken)
            self._checkpoint_timer = loop.call_later(interval_s, tick)

        self._checkpoint_timer = loop.call_later(interval_s, tick)

    @property
    def enabled(self) -> bool:
        return self._store._replicated

    def commit_to(self, topic: str, offset: int) -> int:
        """Let readers of `topic` see its records below `offset` (capped at the durable end): wakes the
        long-polls it satisfies. Returns the committed end."""
        topic_id = self._store._id(topic)
        table = self._store._table
        committed = table.committed
        if committed is None:
            return table.durable[topic_id]
        before = committed[topic_id]
        offset = min(offset, table.durable[topic_id])
        if offset > before:
            committed[topic_id] = offset
            self._store._wake([(topic_id, before)])
        return committed[topic_id]

    def append_at(self, topic: str, frames: bytes | memoryview, at: int | None = None) -> int:
        """Append a leader's frames verbatim to `topic`'s log (created on first use), through the group
        commit like any append; returns the first offset.

        Every frame is checked (framing, CRC, version) and must continue the log exactly: the first one at
        its next offset (or `at`, below), the next ones dense. All or nothing: `InvalidRecord` names the
        first bad frame.

        `at` past the log's next offset: the records between were lost at the source before they came here
        (a mirror's gap, docs/uplink.md). The records held stay readable and the log continues at `at`;
        the offsets between are a gap, never served (a read of one raises `CorruptRecord` naming `at`, as
        for records lost to damage). A log that holds nothing restarts at `at` instead."""
        if at is not None and not 0 <= at <= MAX_OFFSET:
            raise InvalidRecord(f"frames for {topic!r} refused: offset {at} is past what a log holds")
        topic_id = self._store._writable_id(topic, "")
        table = self._store._table
        first = table.next[topic_id]
        if at is not None and at > first:
            if table.start[topic_id] >= first:
                self.restart_at(topic, at)
            first = at
        checked = check_frames(frames, first, self._store.config.max_record_bytes)
        count = len(checked.frames)
        if checked.error is not None:
            raise InvalidRecord(
                f"frames for {topic!r} refused at offset {first + count}: {checked.error.reason} "
                f"(the log continues at {first})"
            )
        if not count:
            return first
        if first + count > MAX_OFFSET:
            end = first + count
            raise InvalidRecord(f"frames for {topic!r} refused: they end at {end}, past {MAX_OFFSET}")
        part = self._store._partitions[table.partition[topic_id]]
        if first > table.next[topic_id]:  # a gap: its marker says where the log goes on, through any restart
            part.leave_active_segment(topic_id)
            part.append_marker(topic_id, TRUNCATE, first, 0)
            table.next[topic_id] = first
        part.append_frames(topic_id, checked.frames, checked.times, checked.crcs)
        self._store._committer.appended_many(part, count, part.last_append_size)
        return first

    def read_frames(
        self, topic: str, offset: int, max_bytes: int, stop: int | None = None
    ) -> tuple[list[bytes], int]:
        """Stored frames of `topic` from `offset` towards its durable end (or `stop` before it) within
        `max_bytes` (at least one), unchecked (a replica checks them), and how many they are. Raises
        `OffsetOutOfRange` outside [start_offset, durable_end]."""
        topic_id = self._store._id(topic)
        table = self._store._table
        end = table.durable[topic_id]
        start = table.start[topic_id]
        if offset < start or offset > end:
            raise OffsetOutOfRange(topic, offset, start, end)
        if stop is not None and stop < end:
            end = stop
        if offset >= end:
            return [], 0
        part = self._store._partitions[table.partition[topic_id]]
        try:
            pieces = part.locate(topic_id, offset, end, max_bytes, True)
        except CorruptRecord:
            return [], 0
        frames = part.frames(topic_id, pieces)
        good: list[bytes] = []
        for frame in frames:
            if isinstance(frame, FrameError):
                break
            good.append(frame)
        return good, len(good)

    def next_held(self, topic: str, offset: int, stop: int | None = None) -> int:
        """``offset``, or, when the log holds no record there (a gap ``append_frames``' ``at`` left, or a
        record lost to damage), the offset of the next record it holds, at most ``stop`` (or the durable
        end): where a replica of the log goes on."""
        topic_id = self._store._id(topic)
        table = self._store._table
        end = table.durable[topic_id]
        if stop is not None and stop < end:
            end = stop
        if offset >= end or offset < table.start[topic_id]:
            return offset
        part = self._store._partitions[table.partition[topic_id]]
        try:
            part.locate(topic_id, offset, end, 1, True)
        except CorruptRecord as missing:
            return min(max(missing.next_offset, offset), end)
        return offset

    def truncate_to(self, topic: str, offset: int) -> None:
        """Drop the records of `topic` at and after `offset` (a replica's tail its new leader does not
        have), durably: a truncation marker is written and fsynced before this returns."""
        topic_id = self._store._ids.get(topic)
        if topic_id is None:
            return
        table = self._store._table
        if offset >= table.next[topic_id]:
            return
        self._store._check_settled(topic_id, topic, "truncate")
        offset = max(offset, 0)
        committed = table.end(topic_id)
        part = self._store._partitions[table.partition[topic_id]]
        self._store._settle_seals()
        dropped, _ = part.cut_live(topic_id, offset)
        segment, row = part.append_marker(topic_id, TRUNCATE, offset, dropped)
        part.hold_cut(topic_id, segment, row, offset)
        self._store._committer.touched(part)
        self._store._committer.flush()
        table.next[topic_id] = table.durable[topic_id] = offset
        if table.committed is not None:
            table.committed[topic_id] = min(table.committed[topic_id], offset)
        if table.start[topic_id] > offset:
            table.start[topic_id] = offset
            table.dropped[topic_id] = table.total[topic_id]
        self._store._read_cache.drop_topic(topic_id)
        log.warning("%r truncated to %d records", topic, offset)
        if table.end(topic_id) < committed:  # (an unclean election) the checkpoint must not overstate
            self.checkpoint()

    def restart_at(self, topic: str, offset: int) -> None:
        """Empty `topic`'s log (created if absent) and continue it at `offset` (at most `MAX_OFFSET`)."""
        _check_offset(topic, offset)
        topic_id = self._store._ids.get(topic)
        if topic_id is None:
            topic_id = self._store._create(topic, "")
        self._store._check_settled(topic_id, topic, "restart")
        table = self._store._table
        part = self._store._partitions[table.partition[topic_id]]
        self._store._settle_seals()
        part.append_marker(topic_id, RESTART, offset, 0)
        self._store._committer.touched(part)
        self._store._committer.flush()
        active = part.active
        assert active is not None
        part.restart_live(topic_id, offset, active.number)
        table.next[topic_id] = table.durable[topic_id] = table.start[topic_id] = offset
        if table.committed is not None:
            table.committed[topic_id] = offset
        self._store._read_cache.drop_topic(topic_id)
        log.warning("%r restarted empty at offset %d", topic, offset)

    def continue_at(self, ends: dict[str, int]) -> dict[str, int]:
        """Make each topic's log (created if absent) go on at its offset in `ends` where it ends below it,
        durably before this returns (one flush for all): a log that holds nothing restarts there, any other
        keeps its records and the offsets between its end and the new one are a gap, never served (as a
        mirror's). A site whose log was lost this way stops giving offsets its hub already holds. Returns
        the end each log moved had (the others, ending at or past theirs, are left as they are)."""
        store = self._store
        table = store._table
        moved: dict[str, int] = {}
        for topic, offset in ends.items():
            _check_offset(topic, offset)
            topic_id = store._ids.get(topic)
            if topic_id is None or table.next[topic_id] < offset:
                moved[topic] = 0 if topic_id is None else table.next[topic_id]
        if not moved:
            return moved
        store._committer.flush()  # what is being written goes first: the markers follow it
        store._settle_seals()
        for topic in moved:
            offset = ends[topic]
            topic_id = store._ids.get(topic)
            if topic_id is None or table.start[topic_id] >= table.next[topic_id]:
                store.import_start(topic, offset)  # it holds nothing: it starts there
            else:
                store._check_settled(topic_id, topic, "continue")
                store._continue_past_gap(topic_id, offset)
        store._committer.flush()
        for topic in moved:
            topic_id = store._ids.get(topic)
            assert topic_id is not None
            if table.committed is not None:
                table.committed[topic_id] = ends[topic]
            store._read_cache.drop_topic(topic_id)
        return moved

    def epochs_path(self, partition: int) -> str:
        """The path of a partition's leader-epoch journal (`epoch_journal`)."""
        return os.path.join(self._store._partitions[partition].directory, EPOCHS_FILE)

    def epoch_journal(self, partition: int) -> EpochJournal:
        """The leader-epoch journal of a partition, for a cluster's replicas: one per partition, synced
        before every checkpoint of the committed ends is written (none is while one cannot be). An epoch
        is recorded before the records it appends are committed, so the checkpoint never names a committed
        end whose records' epochs a crash could lose (a replica lacking them would be told to cut
        committed records, and refuse)."""
        journal = self._epoch_journals.get(partition)
        if journal is None:
            journal = self._epoch_journals[partition] = EpochJournal(self.epochs_path(partition))
        return journal

    def close(self) -> None:
        """The store closes: no more periodic checkpoints; the committed ends are saved now."""
        if self._checkpoint_timer is not None:
            self._checkpoint_timer.cancel()
        self.checkpoint()
