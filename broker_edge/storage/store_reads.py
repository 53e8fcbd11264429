"""The store's reads: records by topic and offset (durable or committed ones only), by partition position,
the logs' listing, and long-polls that wait for new records.

A topic's visible end is its durable end, or its committed end on a replicated store; reads never go past
it. Blocks of decoded records are shared by readers (``read_cache``), the windows written last are read from
memory (``recent``), older records by preads.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from broker_edge.log_info import LogInfo
from broker_edge.protocol.topics import topic_matches

from .errors import (
    CorruptRecord,
    OffsetOutOfRange,
    StorageError,
)
from .partition_log import PartitionLog
from .partition_reads import PositionOutOfRange, position_for_timestamp, read_entries
from .persistence import check_filter
from .read_cache import BLOCK_MAX_BYTES, BLOCK_RECORDS, Block
from .record import FrameError, Record, decode_frame
from .store_state import StoreState, _Waiter
from .topic_table import NO_TIME

if TYPE_CHECKING:
    from .frame_runs import FrameRun

log = logging.getLogger("broker_edge.storage.store")

__all__ = ["PartitionInfo", "PartitionRecords", "Reads", "RemovedSince"]


@dataclass(frozen=True, slots=True)
class PartitionRecords:
    """One read of a partition (`LogStore.read_partition`): the frames of the records served, in log order,
    with their topics; the position to go on from; per topic, the records passed over because retention
    moved the topic's start past them (data loss for a reader that had not read them); entries passed over
    because they failed their checks."""

    next_position: int
    topics: list[str]
    frames: list[memoryview]
    lost: dict[str, int]
    damaged: int
    removed: int
    """Positions of segments retention deleted (every record in them below its topic's start)."""


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    """One partition log's bounds in positions (entries of the partition, every topic's)."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class RemovedSince:
    """`Reads.removed_below`'s answer."""

    accounted_from: int
    """Deleted positions at or past it are accounted for; below it, not known."""
    topics: dict[str, int]
    """Topic -> one past the position of its newest record deleted with a segment."""


class Reads(StoreState):
    """Reading records and waiting for them (see the module docstring)."""

    def durable_end(self, topic: str) -> int:
        """Offset after the last record of `topic` durable here (0 when it has no log)."""
        topic_id = self._ids.get(topic)
        return self._table.durable[topic_id] if topic_id is not None else 0

    def start_offset(self, topic: str) -> int:
        """Oldest offset `topic`'s log still stores (0 when it has no log)."""
        topic_id = self._ids.get(topic)
        return self._table.start[topic_id] if topic_id is not None else 0

    def committed_end(self, topic: str) -> int:
        """Offset after the last record readers of `topic` may see (0 when it has no log)."""
        topic_id = self._ids.get(topic)
        return self._table.end(topic_id) if topic_id is not None else 0

    def span(self, topic: str) -> tuple[int, int]:
        """`start_offset` and `committed_end` of `topic` with one look-up of its id ((0, 0) when it has no
        log): a walk over a site's every log reads both of each."""
        topic_id = self._ids.get(topic)
        if topic_id is None:
            return 0, 0
        table = self._table
        return table.start[topic_id], table.end(topic_id)

    def read(
        self, topic: str, offset: int, max_records: int = 1000, max_bytes: int = 1024 * 1024
    ) -> list[Record]:
        """Durable records of `topic` from `offset`: at most `max_records` and `max_bytes` of frames (but at
        least one record). `[]` at the end, `OffsetOutOfRange` outside [start, end], `CorruptRecord` when
        the record at `offset` is damaged (a read stops before a damaged record otherwise)."""
        topic_id = self._id(topic)
        stop = self._read_stop(topic_id, topic, offset, max_records, max_bytes)
        if offset == stop:
            return []
        if not self._read_cache.enabled:
            return self._read_direct(topic_id, topic, offset, stop, max_bytes)
        records: list[Record] = []
        budget = max_bytes
        while offset < stop and budget > 0:
            block = self._block(topic_id, topic, offset)
            if block is None:
                records += self._read_direct(topic_id, topic, offset, stop, budget, at_least_one=not records)
                break
            batch, size = block.take(offset, stop, budget, not records)
            records += batch
            offset += len(batch)
            budget -= size
            if not batch or offset < min(stop, block.end):
                break
        return records

    def _read_direct(
        self, topic_id: int, topic: str, offset: int, stop: int, max_bytes: int, at_least_one: bool = True
    ) -> list[Record]:
        records, error = self._decode(topic_id, topic, offset, stop, max_bytes, at_least_one)
        if error is not None and not records and at_least_one:
            raise error
        return records

    def _decode(
        self, topic_id: int, topic: str, offset: int, stop: int, max_bytes: int, at_least_one: bool
    ) -> tuple[list[Record], CorruptRecord | None]:
        """Records from `offset` (checked: CRC, version, offset), and the error that stopped them early."""
        part = self._partitions[self._table.partition[topic_id]]
        try:
            pieces = part.locate(topic_id, offset, stop, max_bytes, at_least_one)
        except CorruptRecord as error:
            return [], CorruptRecord(topic, error.offset, error.next_offset, error.reason)
        frames = part.frames(topic_id, pieces)
        max_body = self.config.max_record_bytes
        records: list[Record] = []
        for piece, frame in zip(pieces, frames, strict=True):
            try:
                if isinstance(frame, FrameError):
                    raise frame
                records.append(decode_frame(bytes(frame), piece.offset, max_body))
            except FrameError as error:
                log.error("record %d of %r is damaged (%s)", piece.offset, topic, error.reason)
                return records, CorruptRecord(topic, piece.offset, piece.offset + 1, error.reason)
        return records, None

    def _block(self, topic_id: int, topic: str, offset: int) -> Block | None:
        """The shared block holding `offset`, read on first use (None: read it directly). The block at the
        log's end grows as readers reach past it; a block cut short by its byte bound or by damage stays."""
        cache = self._read_cache
        number = offset // BLOCK_RECORDS
        block_end = (number + 1) * BLOCK_RECORDS
        block = cache.get(topic_id, number)
        if block is not None:
            if block.covers(offset):
                return block
            if not block.growing or offset != block.end:
                return None
            first, known, budget = block.first, block.records, BLOCK_MAX_BYTES - block.size
        else:
            first, known, budget = (
                max(number * BLOCK_RECORDS, self._table.start[topic_id]),
                [],
                BLOCK_MAX_BYTES,
            )
        stop = min(block_end, self._table.end(topic_id))
        if budget <= 0 or first + len(known) >= stop:
            return None
        more, _error = self._decode(topic_id, topic, first + len(known), stop, budget, True)
        if not more:
            return None
        block = Block(first, known + more, growing=first + len(known) + len(more) == stop < block_end)
        cache.put(topic_id, number, block)
        cache.fills += 1
        return block if block.covers(offset) else None

    def read_runs(
        self, topic: str, offset: int, max_records: int = 1000, max_bytes: int = 1024 * 1024
    ) -> list[FrameRun]:
        """The records `read` would return, as checked runs of frames (see `frame_runs`)."""
        from .frame_runs import checked_run, run_of_records

        topic_id = self._id(topic)
        stop = self._read_stop(topic_id, topic, offset, max_records, max_bytes)
        if offset == stop:
            return []
        part = self._partitions[self._table.partition[topic_id]]
        try:
            pieces = part.locate(topic_id, offset, stop, max_bytes, True)
        except CorruptRecord as error:
            raise CorruptRecord(topic, error.offset, error.next_offset, error.reason) from None
        frames = part.frames(topic_id, pieces)
        good = [frame for frame in frames if not isinstance(frame, FrameError)]
        if len(good) == len(frames):
            data = b"".join(good)
            positions = [0]
            for frame in good:
                positions.append(positions[-1] + len(frame))
            run = checked_run(data, positions, offset, self.config.max_record_bytes)
            if run is not None:
                return [run]
        records = self._read_direct(topic_id, topic, offset, stop, max_bytes)
        return [run_of_records(records, offset)] if records else []

    def _read_stop(self, topic_id: int, topic: str, offset: int, max_records: int, max_bytes: int) -> int:
        if max_records < 1 or max_bytes < 1:
            raise ValueError("max_records and max_bytes must be positive")
        table = self._table
        end = table.end(topic_id)
        start = table.start[topic_id]
        if offset < start or offset > end:
            raise OffsetOutOfRange(topic, offset, start, end)
        return min(end, offset + max_records)

    def offset_for_timestamp(self, topic: str, timestamp_ms: int) -> int:
        """First readable offset of `topic` appended at or after `timestamp_ms` (the end offset if none)."""
        topic_id = self._id(topic)
        table = self._table
        end = table.end(topic_id)
        start = table.start[topic_id]
        if start >= end:
            return end
        part = self._partitions[table.partition[topic_id]]
        found = end
        upto = end
        for step in part._steps(topic_id, start):
            segment = step[0]
            end, upto = upto, min(upto, step[2] if len(step) == 3 else step[1].first_offset)
            if len(step) == 3:
                rows = segment.rows
                assert rows is not None
                row_ids, _previous = rows.rows_of(topic_id, step[1], max(start, step[2]), end)
                times = [rows.times[row] for row in row_ids]
                offsets = [rows.offsets[row] for row in row_ids]
            else:
                group = step[1]
                low = max(start - group.first_offset, 0)
                high = min(end - group.first_offset, group.count)
                entries = segment.sealed.entries_of(group, low, high)
                times = list(entries[1::2])
                offsets = list(range(group.first_offset + low, group.first_offset + high))
            if not times:
                continue
            if times[0] >= timestamp_ms:
                found = offsets[0]
                continue
            index = _bisect_left(times, timestamp_ms)
            if index < len(times):
                found = offsets[index]
            break
        return min(found, table.end(topic_id))

    def log_info(self, topic: str) -> LogInfo:
        """The state of one log (raises `UnknownTopic`)."""
        return self._info(self._id(topic))

    def _info(self, topic_id: int) -> LogInfo:
        table = self._table
        newest = table.durable_ms[topic_id]
        return LogInfo(
            self._names[topic_id],
            table.start[topic_id],
            table.end(topic_id),
            table.total[topic_id] - table.dropped[topic_id],
            None if newest == NO_TIME else newest,
        )

    def logs(self, pattern: str | None = None) -> list[LogInfo]:
        """Every log (or those whose topic matches the MQTT filter `pattern`), sorted by topic."""
        return [info for chunk in self.iter_logs(pattern) for info in chunk]

    def iter_logs(
        self, pattern: str | None = None, chunk: int = 2048, every_scan: bool = False
    ) -> Iterator[list[LogInfo]]:
        """`logs`, a sorted chunk at a time (the offsets API yields to the event loop between chunks).

        With `every_scan`, also a shorter (or empty) chunk after each run of names scanned (at most
        `topic_order.CHUNK`), so that a caller may serve the loop between them however few names match."""
        if pattern is not None:
            check_filter(pattern)
        ids = self._ids
        hidden = self._quarantined
        if pattern is not None and "+" not in pattern and "#" not in pattern:
            topic_id = ids.get(pattern)
            yield [] if topic_id is None or topic_id in hidden else [self._info(topic_id)]
            return
        prefix = _literal_prefix(pattern)
        suffix = "" if pattern is None or "#" in pattern else pattern[pattern.rfind("+") + 1 :]
        batch: list[LogInfo] = []
        for names in self._order.chunks_from(prefix):
            for name in names:
                if pattern is None or (name.endswith(suffix) and topic_matches(pattern, name)):
                    topic_id = ids[name]
                    if not hidden or topic_id not in hidden:
                        batch.append(self._info(topic_id))
            if len(batch) >= chunk or every_scan:
                yield batch
                batch = []
        yield batch

    def end_offsets(self) -> dict[str, int]:
        """Every log's end offset by topic, built without a `LogInfo` per log (the broker's sessions file)."""
        table = self._table
        ends = table.committed if table.committed is not None else table.durable
        return dict(zip(self._names, ends, strict=True))

    def topics(self) -> list[str]:
        """The topics that have a log, unsorted."""
        return list(self._names)

    def __contains__(self, topic: object) -> bool:
        return topic in self._ids

    def __len__(self) -> int:
        return len(self._names)

    def topic_id(self, topic: str) -> int:
        """The topic's id in the catalog (raises `UnknownTopic`)."""
        return self._id(topic)

    def partition_of(self, topic: str) -> int:
        """The partition holding the topic's log (raises `UnknownTopic`)."""
        return self._table.partition[self._id(topic)]

    async def wait_for_data(
        self, positions: Mapping[str, int], timeout_s: float, pattern: str | None = None
    ) -> list[str]:
        """Long-poll: wait until a topic in `positions` has a durable record at or after its offset.

        With `pattern`, also wake when a log matching it that is not in `positions` gets its first record.
        Returns the topics that woke the call ([] on timeout). Topics without a log yet may be waited on.
        """
        ids, table = self._ids, self._table
        ready = [
            topic
            for topic, offset in positions.items()
            if (topic_id := ids.get(topic)) is not None and table.end(topic_id) > offset
        ]
        if ready or self._closed:
            return ready
        waiter = _Waiter(asyncio.get_running_loop().create_future(), positions, pattern)
        for topic in positions:
            self._topic_waiters.setdefault(topic, []).append(waiter)
        if pattern is not None:
            self._pattern_waiters.append(waiter)
        try:
            return await asyncio.wait_for(waiter.future, timeout_s)
        except TimeoutError:
            return []
        finally:
            self._remove_waiter(waiter)

    def watch_advances(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Call ``listener(topic)`` on the event loop each time ``topic``'s readable end advances (durable,
        or committed when replicated), until the returned function is called: a watcher of many logs
        registers once, where ``wait_for_data`` takes every log it watches at each call."""
        self._advance_listeners.append(listener)

        def unwatch() -> None:
            if listener in self._advance_listeners:
                self._advance_listeners.remove(listener)

        return unwatch

    def _remove_waiter(self, waiter: _Waiter) -> None:
        for topic in waiter.positions:
            waiters = self._topic_waiters.get(topic)
            if waiters is not None:
                waiters.remove(waiter)
                if not waiters:
                    del self._topic_waiters[topic]
        if waiter.pattern is not None:
            self._pattern_waiters.remove(waiter)

    def partitions(self) -> list[PartitionInfo]:
        """Every partition's bounds in positions."""
        return [PartitionInfo(p.number, p.start_position, p.end_position) for p in self._partitions]

    def read_partition(
        self,
        partition: int,
        position: int,
        max_entries: int = 100_000,
        max_bytes: int = 4 * 1024 * 1024,
        patterns: Sequence[str] | None = None,
    ) -> PartitionRecords:
        """The durable records of topics matching `patterns` (MQTT filters; None: every topic) among the
        partition's entries `[position, position + max_entries)`, in log order, frames totalling at most
        `max_bytes` but at least one (see `partition_reads`). Raises `PositionOutOfRange`; refused
        (`StorageError`) on a cluster's store, whose replicas interleave topics differently."""
        if max_entries < 1 or max_bytes < 1:
            raise ValueError("max_entries and max_bytes must be positive")
        for pattern in patterns or ():
            check_filter(pattern)
        part = self._partition_for_reads(partition)
        wanted = self._filters.matcher(patterns)
        if self._quarantined:  # logs set aside are not served, by partition either
            hidden, matches = self._quarantined, wanted
            wanted = lambda topic_id: topic_id not in hidden and matches(topic_id)  # noqa: E731
        read = read_entries(
            part, self._table, position, position + max_entries, max_bytes, wanted,
            self.config.max_record_bytes,
        )  # fmt: skip
        names = self._names
        return PartitionRecords(
            read.next_position,
            [names[topic_id] for topic_id in read.topic_ids],
            read.frames,
            {names[topic_id]: count for topic_id, count in read.lost.items()},
            read.damaged,
            read.removed,
        )

    def position_for_timestamp(self, partition: int, timestamp_ms: int) -> int:
        """The position of the partition's first record appended at or after `timestamp_ms` (its end if
        none)."""
        return position_for_timestamp(
            self._partition_for_reads(partition), timestamp_ms, self.config.max_record_bytes
        )

    def removed_below(self, partition: int, since: int, patterns: Sequence[str] | None) -> RemovedSince:
        """Topics of `partition` matching `patterns` (None: every topic) whose records retention deleted
        with their segments at or past position `since` (each with `removed_below`, see
        ``removed_account``), and the position the account begins at: below it, what was deleted is not
        known. Raises `ValueError` for a malformed filter."""
        account = self._removed
        assert account is not None
        part = self._partition_for_reads(partition)
        for pattern in patterns or ():
            check_filter(pattern)
        matches = self._filters.matcher(patterns)
        column, partitions = account.removed_below, self._table.partition
        topics = {
            self._names[topic_id]: below
            for topic_id, below in enumerate(column)
            if below > since
            and topic_id < len(partitions)
            and partitions[topic_id] == part.number
            and matches(topic_id)
        }
        return RemovedSince(account.from_position(partition), topics)

    def _partition_for_reads(self, partition: int) -> PartitionLog:
        if self._replicated:
            raise StorageError("a cluster's store is read by topic offsets, not by partition positions")
        if not 0 <= partition < len(self._partitions):
            raise PositionOutOfRange(partition, 0, 0, 0)
        return self._partitions[partition]


def _literal_prefix(pattern: str | None) -> str:
    """The start of a filter before its first wildcard (`a/#` matches `a` too: the `/` is left out)."""
    if pattern is None:
        return ""
    cuts = [index for index in (pattern.find("+"), pattern.find("#")) if index >= 0]
    if not cuts:
        return pattern
    return pattern[: min(cuts)].rstrip("/")


def _bisect_left(values: list[int], value: int) -> int:
    low, high = 0, len(values)
    while low < high:
        middle = (low + high) // 2
        if values[middle] < value:
            low = middle + 1
        else:
            high = middle
    return low
