"""All logs of one broker: topics in partition logs, persistence rules, durability, limits, long-polls.

The topics' records live in partition logs under `<directory>/log/` (see `partition_log`), their names and
ids in the catalog, their state in the topic table's columns; the store's own files under `<directory>/meta/`
(see `layout`, which also moves older directories into this one at open). The store is driven from one
asyncio event loop: appends are buffered, each window's data is copied into the files with one pwritev per
partition, fsyncs run in a writer thread (see `group_commit`), indexes are sealed and checkpointed in the
sealer thread (`sealer`), and reads are preads on the loop (or slices of the windows written last). Readers
only ever get durable records: a topic's `end_offset` is its high watermark. In a cluster
(`enable_replication`) it is the committed end instead, moved by `commit` once the in-sync replicas hold
the records, and saved to a checkpoint (`hw_checkpoint`); followers copy their leader's frames
(`append_frames`) and drop a diverging tail (`truncate`) through the same store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from broker_edge.bounds import MAX_OFFSET
from broker_edge.log_info import LogInfo
from broker_edge.observe import path_trace
from broker_edge.placement import partition_of
from broker_edge.protocol.topics import topic_matches

from . import record
from .catalog import EMPTY_CRC
from .catalog import HEADER as CATALOG_HEADER
from .config import LogConfig, StorageConfig
from .entry import MAX_TOPIC_ID, RESTART, TRUNCATE
from .epoch_journal import EPOCHS_FILE
from .errors import (
    CorruptRecord,
    DescriptorShortage,
    InvalidRecord,
    OffsetOutOfRange,
    StorageError,
    StorageFailed,
    TooManyTopics,
    UnknownTopic,
)
from .file_pool import FileHandlePool
from .fs_sync import syncfs_available
from .group_commit import GroupCommitter, Job
from .hw_checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from .layout import layout_of, layout_version, open_layout
from .partition_log import PartitionConfig, PartitionLog, PartitionPending
from .partition_reads import PositionOutOfRange, TopicFilters, position_for_timestamp, read_entries
from .persistence import CREATES_LOG, LOGGED, NOT_LOGGED, PersistenceRules, check_filter
from .quarantine import QUARANTINE_FILE, LogQuarantined, QuarantinedLog, set_aside
from .read_cache import BLOCK_MAX_BYTES, BLOCK_RECORDS, Block, ReadCache
from .recent import RecentWindows
from .record import FrameError, Record, RecordFields, check_frame, decode_frame
from .recovery import open_partitions
from .retention import RetentionReport, retention_pass
from .sealed_index import GroupBlocks
from .sealer import Sealer
from .segment import ROLLED, Segment, fsync_directory
from .topic_ids import TopicIds
from .topic_order import TopicOrder
from .topic_table import NO_RULE, NO_TIME, SNAPSHOT_FILE, TopicTable
from .upgrade import finish_upgrade, upgrade_layout_2

if TYPE_CHECKING:
    from .catalog import TopicCatalog
    from .frame_runs import FrameRun

log = logging.getLogger(__name__)

__all__ = ["LogInfo", "LogStore", "PartitionInfo", "PartitionRecords", "RecoveryReport", "RetentionReport"]

CLEAN_SHUTDOWN_MARKER = "CLEAN_SHUTDOWN"
REPLICATED_SYNC_PIPELINE = 2
"""Group-commit jobs a replicated store lets be in flight at once (see `GroupCommitter.pipeline`)."""

_time_ns = time.time_ns
_PartitionAppends = tuple[list[tuple[int, Sequence[RecordFields]]], list[int]]
"""A loop turn's appends to one partition, (topic id, records) each, and the index of each's batch."""


@dataclass(slots=True)
class RecoveryReport:
    """What `LogStore.open` found: totals, plus the repairs."""

    clean_shutdown: bool = False
    """The previous run closed the store (otherwise it crashed or was killed, or this is a fresh start)."""
    fresh: bool = False
    """The directory held no logs and no clean-shutdown marker: a first start, nothing to recover."""
    logs: int = 0
    records: int = 0
    """Records the topics hold (their end offsets less their start offsets)."""
    bytes_dropped: int = 0
    indexes_rebuilt: int = 0
    """Segments whose sealed index was missing or unusable (their rows loaded from their data)."""
    records_scanned: int = 0
    """Entries read and checked one by one (the tail after the last open-index checkpoint)."""
    repaired: list = field(default_factory=list)
    """Partitions whose tail was truncated or that hold damaged records (`PartitionRepair`)."""
    quarantined: list[QuarantinedLog] = field(default_factory=list)
    """Logs set aside: they could not be opened (now or at an earlier open), and are neither read nor
    written (`quarantine`)."""
    seconds: float = 0.0


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


class _Waiter:
    """One long-poll: a future resolved with the topics that have data (or a new matching log)."""

    __slots__ = ("future", "pattern", "positions")

    def __init__(self, future: asyncio.Future[list[str]], positions: Mapping[str, int], pattern: str | None):
        self.future = future
        self.positions = positions
        self.pattern = pattern

    def wake(self, topic: str) -> None:
        if not self.future.done():
            self.future.set_result([topic])


class _NewTopics:
    """Topics given ids in the catalog whose rows in the topic table and places in the listing are still to
    be added (`LogStore._add_new`), in id order."""

    __slots__ = ("names", "partitions", "rules")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.partitions = array("H")
        self.rules = array("B")


class _Catalogue:
    """The catalog as a write source of the group commit (its new entries go with the next job), and what of
    it is durable (bytes and their CRC32C, which the snapshot records)."""

    __slots__ = ("catalog", "durable", "taken")

    def __init__(self, catalog: TopicCatalog) -> None:
        self.catalog = catalog
        self.durable = (catalog.size, _file_crc(catalog.path, catalog.size))
        """(bytes, CRC32C of them): one tuple, so that the sealer thread reads a consistent pair."""
        self.taken = self.durable

    def take_pending(self) -> PartitionPending | None:
        write = self.catalog.take_write()
        if write is None:
            return None
        if len(write.data) > 1:  # a turn of new topics: their entries joined once, and one CRC over them
            write.data = [b"".join(write.data)]
        data = write.data[0]
        size, crc = self.taken
        self.taken = (size + len(data), record.crc32c(data, crc))
        return PartitionPending([write], [], [], size - write.position, self.taken)

    def complete(self, pending: PartitionPending, synced: bool) -> list[tuple[int, int]]:
        self.durable = pending.coverage
        return []

    def trace(self, pending: PartitionPending) -> list[tuple[str, int, int]]:
        return []

    def coverage(self) -> tuple[int, int]:
        return self.durable


def _file_crc(path: str, size: int) -> int:
    if size == CATALOG_HEADER.size:  # a new catalog: its header's, without loading the package
        return EMPTY_CRC
    with open(path, "rb") as file:
        return record.crc32c(file.read(size))


class LogStore:
    """The logs of one broker. Call `open()` first and `close()` at shutdown."""

    def __init__(self, directory: str | Path, config: StorageConfig | None = None) -> None:
        self.directory = str(directory)
        self.layout = layout_of(self.directory)
        """Where the partition logs (`layout.log`) and the broker's own files (`layout.meta`) live."""
        self.config = config = config or StorageConfig()
        if not 1 <= config.partitions <= 9999:
            raise ValueError(f"partitions must be within [1, 9999], got {config.partitions}")
        if not 1 <= config.segment_bytes <= 2**32 - 1:
            raise ValueError(f"segment_bytes must be within [1, 4 GiB), got {config.segment_bytes}")
        self.rules = PersistenceRules(config.persist)
        self._pool = FileHandlePool(config.max_open_files)
        self._recent = RecentWindows(config.tail_cache_total_bytes)
        self._read_cache = ReadCache(config.read_cache_bytes)
        self._groups = GroupBlocks(config.sealed_cache_bytes)
        self._committer = GroupCommitter(
            config.durability,
            config.group_commit_ms,
            config.group_commit_max_bytes,
            self._pool,
            self._on_durable,
            inline_sync_max_bytes=config.inline_sync_max_bytes,
        )
        self._partition_config = PartitionConfig(
            config.segment_bytes, config.segment_ms, config.max_record_bytes
        )
        self._table = TopicTable()
        self._catalog: TopicCatalog | None = None
        self._catalogue: _Catalogue | None = None
        self._names: list[str] = []
        self._ids = TopicIds(self._names)
        self._order = TopicOrder()
        self._filters = TopicFilters(self._names)
        self._partitions: list[PartitionLog] = []
        self._sealer: Sealer | None = None
        self._log_configs: list[LogConfig] = []
        self._created_by: dict[str, int] = {}
        self._asked: dict[str, int] = {}
        """The ids `persist_as` found for logged publishes since the last `append_batches`, which takes them
        rather than probing the name -> id table again (a topic's id never changes). The publish path appends
        what it asked about at its next loop turn; a caller that never appends holds one entry per topic."""
        self._topic_waiters: dict[str, list[_Waiter]] = {}
        self._pattern_waiters: list[_Waiter] = []
        self._directory_fd: int | None = None
        self._replicated = False
        self._checkpointed: bytes | None = None
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoints_taken = 0
        self._checkpoints_written = 0
        self._checkpoint_writing: asyncio.Future[None] | None = None
        self._syncfs_checked = False
        self._opened = False
        self._closed = False
        self._quarantined: dict[int, QuarantinedLog] = {}
        """The logs set aside at open, by topic id."""
        self.refusals = 0
        """Appends refused because `max_topics` logs exist (counted since open)."""
        self._refusals_logged = 0
        self._refusal_logged_at = float("-inf")

    # -- lifecycle -----------------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Load the catalog and the partition logs (repairing torn tails, applying unsealed segments)."""
        if self._opened:
            raise RuntimeError("store already open")
        began = time.monotonic()
        self.layout = open_layout(self.directory)
        if layout_version(self.directory) == "2":
            upgrade_layout_2(self.layout, self.config, LogStore)
        else:
            finish_upgrade(self.layout)
        marker = self.layout.meta_file(CLEAN_SHUTDOWN_MARKER)
        report = RecoveryReport(clean_shutdown=os.path.exists(marker))
        opened = open_partitions(
            self.layout.log, self.config.partitions, self._partition_config, self._pool, self._recent,
            self._groups,
        )  # fmt: skip
        self._catalog = opened.catalog
        self._quarantined = set_aside(
            opened.quarantine,
            opened.catalog.names,
            opened.catalog.ids,
            self.layout.meta_file(QUARANTINE_FILE),
        )
        report.quarantined = self.quarantined()
        self._catalogue = _Catalogue(opened.catalog)
        self._ids = opened.catalog.ids
        self._names = opened.catalog.names
        self._order = TopicOrder(self._names)
        self._filters = TopicFilters(self._names)
        self._table = opened.table
        self._partitions = opened.partitions
        self._sealer = Sealer(
            self._pool,
            self._groups,
            opened.sealed,
            opened.applied,
            os.path.join(self.layout.log, SNAPSHOT_FILE),
            self._table,
            self._catalogue.coverage,
            len(self._partitions),
            sync=self.config.durability != "none",
        )
        table = self._table
        report.logs = len(table)
        report.records = sum(table.durable) - sum(table.start)
        report.bytes_dropped = sum(r.bytes_dropped for r in opened.repairs) + opened.catalog_bytes_dropped
        report.indexes_rebuilt = opened.indexes_rebuilt
        report.records_scanned = opened.records_scanned
        report.repaired = [repair for repair in opened.repairs if repair.repaired]
        if report.clean_shutdown:
            os.unlink(marker)  # from now on a crash must not look like a clean shutdown
            fsync_directory(self.layout.meta)
        report.fresh = not report.clean_shutdown and not len(table)
        self._opened = True
        for part in self._partitions:
            for segment in part.segments[:-1]:
                if segment.rows is not None:
                    self._sealer.seal(part, segment)
        if any(part.segments for part in self._partitions):
            self._use_syncfs()
        report.seconds = time.monotonic() - began
        _log_opened(self.directory, report)
        return report

    def quarantined(self) -> list[QuarantinedLog]:
        """The logs set aside at open, neither read nor written (`quarantine`)."""
        return list(self._quarantined.values())

    def _refuse_quarantined(self, topic: str, topic_id: int) -> None:
        entry = self._quarantined.get(topic_id)
        if entry is not None:
            raise LogQuarantined(topic, entry.reason)

    def close(self) -> None:
        """Write, fsync and seal everything, save the snapshot, leave a clean-shutdown marker."""
        if self._closed:
            return
        self._closed = True
        unwritten: list[str] = []  # what a full or failing disk kept from being written: said, not raised
        try:
            self._committer.close()
        except (OSError, StorageFailed) as error:
            unwritten.append(f"buffered appends ({error})")
        if self._checkpoint_timer is not None:
            self._checkpoint_timer.cancel()
        try:
            self.checkpoint_committed()
        except OSError as error:
            unwritten.append(f"the committed ends' checkpoint ({error})")
        sealer = self._sealer
        failed = self._committer.failure is not None
        if sealer is not None and not failed:
            try:
                for part in self._partitions:
                    if part.active is not None and len(part.active.rows or ()):
                        active = part.active
                        part.active = None
                        active.state = ROLLED
                        sealer.seal(part, active)
                sealer.wait_idle()
                sealer.snapshot()
                sealer.wait_idle()
            except OSError as error:
                unwritten.append(f"sealing the active segments ({error})")
            if sealer.failure is not None:
                unwritten.append(f"the segments' seals or the snapshot ({sealer.failure})")
        if sealer is not None:
            sealer.stop()
        if self._directory_fd is not None:
            os.close(self._directory_fd)
            self._directory_fd = None
        self._pool.close()
        self._read_cache.clear()
        for waiters in [*self._topic_waiters.values(), self._pattern_waiters]:
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result([])
        if not self._opened:
            return
        failure = self._committer.failure
        if not unwritten and failure is None:
            try:
                _write_marker(self.layout.meta_file(CLEAN_SHUTDOWN_MARKER))
                return
            except OSError as error:
                unwritten.append(f"the clean-shutdown marker ({error})")
        why = "; ".join(unwritten) if unwritten else f"a write failed while running ({failure})"
        log.error(
            "store closed without its clean-shutdown marker: not written: %s. Nothing acknowledged is lost "
            "(it was synced before its acknowledgement); the next start checks every log (crash recovery)",
            why,
        )

    def __enter__(self) -> LogStore:
        if not self._opened:
            self.open()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------------

    def should_persist(self, topic: str, qos: int) -> bool:
        """Whether a publish on `topic` with `qos` goes to the log (the persistence rules decide)."""
        return self.persist_as(topic, qos) != NOT_LOGGED

    def persist_as(self, topic: str, qos: int) -> int:
        """`should_persist`, and whether appending would create the topic's log, with one lookup of the
        topic: `NOT_LOGGED`, `LOGGED` or `CREATES_LOG` (a publish handler checks a client's topic quota for
        the last only; asking `in` apart looked every topic up once more per publish)."""
        topic_id = self._ids.get(topic)
        if topic_id is None:
            return CREATES_LOG if self.rules.should_persist(topic, qos) else NOT_LOGGED
        if qos not in self.rules.rule_qos(self._rule_of(topic_id)):
            return NOT_LOGGED
        self._asked[topic] = topic_id
        return LOGGED

    def append(self, topic: str, record) -> int:
        """Append to `topic`'s log (created on first use) and return the offset; ack after `when_durable`."""
        fields = record.fields()
        return self.append_batch(topic, [fields[:7] + fields[8:]], fields[7])

    def append_message(
        self,
        topic: str,
        payload: bytes,
        qos: int = 1,
        retain: bool = False,
        client_id: str = "",
        user_properties: Sequence[tuple[str, str]] = (),
        content_type: str | None = None,
        payload_format_indicator: int | None = None,
        timestamp_ms: int | None = None,
        message_expiry_interval: int | None = None,
        response_topic: str | None = None,
        correlation_data: bytes | None = None,
    ) -> int:
        """`append` from the fields of a publish (no `AppendRecord` per publish)."""
        fields = (
            payload, qos, retain, client_id, user_properties, content_type, payload_format_indicator,
            message_expiry_interval, response_topic, correlation_data,
        )  # fmt: skip
        return self.append_batch(topic, [fields], timestamp_ms)

    def append_batch(
        self, topic: str, records: Sequence[RecordFields], timestamp_ms: int | None = None
    ) -> int:
        """Append `records` to `topic`'s log with one broker time; returns the first offset (record i gets
        it + i). All or nothing; a new log counts for the first record's client id."""
        topic_id = self._writable_id(topic, records[0][3] if records else "")
        if not records:
            return self._table.next[topic_id]
        part = self._partitions[self._table.partition[topic_id]]
        timestamp = _time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms
        first = part.append(topic_id, records, timestamp)
        self._committer.appended_many(part, len(records), part.last_append_size)
        return first

    def append_batches(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> list[int | StorageError]:
        """`append_batch` of each (topic, records), with one broker time: the first offset of each, or the
        `StorageError` that refused that batch alone (the others are appended all the same).

        A publish path with a topic per device has a batch per message: each partition takes its share in one
        call (`PartitionLog.append_many`: one loop encodes and indexes them), and the group committer learns
        of them once per partition, not once per topic. `fsync` durability (a job per append) takes them one
        by one."""
        if self.config.durability == "fsync":
            self._asked = {}
            return [self._append_or_error(topic, records, None) for topic, records in batches]
        timestamp = _time_ns() // 1_000_000
        results, groups = self._writable_groups(batches)
        committer = self._committer
        for number, (appends, indexes) in groups.items():
            part = self._partitions[number]
            firsts, count, size = part.append_many(appends, timestamp)
            if len(firsts) == len(results):  # every batch, in order: one partition, no topic refused
                results = firsts
            else:
                for index, first in zip(indexes, firsts, strict=True):
                    results[index] = first
            if count:
                committer.appended_many(part, count, size)
        return results

    def _writable_groups(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> tuple[list[int | StorageError], dict[int, _PartitionAppends]]:
        """`_writable_ids` of the batches, grouped by partition: each (topic id, records) with its batch's
        index."""
        results, appends, indexes = self._writable_ids(batches)
        if len(self._partitions) == 1:
            return results, {0: (appends, indexes)} if appends else {}
        partition_of = self._table.partition
        groups: dict[int, _PartitionAppends] = {}
        for append, index in zip(appends, indexes, strict=True):
            group = groups.setdefault(partition_of[append[0]], ([], []))
            group[0].append(append)
            group[1].append(index)
        return results, groups

    def _writable_ids(
        self, batches: Sequence[tuple[str, Sequence[RecordFields]]]
    ) -> tuple[list[int | StorageError], list[tuple[int, Sequence[RecordFields]]], list[int]]:
        """A result per batch: the `StorageError` of a topic that cannot be written now, a placeholder
        otherwise; and the others' (topic id, records) (logs created on first use) with their batch's index.
        The turn's new topics get their rows in the topic table and places in the listing together."""
        ids_get, committer = self._ids.get, self._committer
        asked, self._asked = self._asked, {}
        asked_get = asked.get
        refusing = committer.failure is not None or committer.shortage is not None or bool(self._quarantined)
        results: list[int | StorageError] = []
        appends: list[tuple[int, Sequence[RecordFields]]] = []
        indexes: list[int] = []
        new = _NewTopics()
        try:
            for index, (topic, records) in enumerate(batches):
                topic_id = asked_get(topic)
                if topic_id is None:
                    topic_id = ids_get(topic)
                try:
                    if topic_id is None:
                        topic_id = self._register(topic, records[0][3] if records else "", new)
                    elif refusing:
                        self._check_writable()
                        self._refuse_quarantined(topic, topic_id)
                except StorageError as error:
                    results.append(error)
                    continue
                results.append(topic_id)
                appends.append((topic_id, records))
                indexes.append(index)
        finally:
            if new.names:
                self._add_new(new)
        return results, appends, indexes

    def _append_or_error(
        self, topic: str, records: Sequence[RecordFields], timestamp_ms: int | None
    ) -> int | StorageError:
        try:
            return self.append_batch(topic, records, timestamp_ms)
        except StorageError as error:
            return error

    def _writable_id(self, topic: str, client_id: str) -> int:
        """`topic`'s id, its log created (counted to `client_id`) on first use; raises why an append to
        an existing log cannot be taken now (`_check_writable`: a new log's creation checks it itself)."""
        topic_id = self._ids.get(topic)
        if topic_id is None:
            return self._create(topic, client_id)
        if self._committer.failure is not None or self._committer.shortage is not None:
            self._check_writable()
        if self._quarantined:
            self._refuse_quarantined(topic, topic_id)
        return topic_id

    def _check_writable(self) -> None:
        """Raise why an append cannot be taken now: a failed write (``StorageFailed``, for good) or a
        shortage of file descriptors (``DescriptorShortage``, until the log is written)."""
        committer = self._committer
        if committer.failure is not None:
            raise committer.failure
        if committer.shortage is not None:
            raise DescriptorShortage(str(committer.shortage))

    def _create(self, topic: str, client_id: str) -> int:
        """A new topic's id (its catalog entry goes with the next job); raises `TooManyTopics`."""
        new = _NewTopics()
        topic_id = self._register(topic, client_id, new)
        self._add_new(new)
        return topic_id

    def _register(self, topic: str, client_id: str, new: _NewTopics) -> int:
        """`_create` but for the topic's row in the topic table and its place in the listing, which `new`
        keeps for `_add_new` (a loop turn's new topics at once)."""
        if not self._opened or self._closed:
            raise StorageError("the store is not open")
        self._check_writable()
        if len(self._names) >= self.config.max_topics:
            self._refused(topic)
            raise TooManyTopics(topic, self.config.max_topics)
        if not topic:
            raise InvalidRecord("an MQTT topic name is at least one character")
        if len(self._names) >= MAX_TOPIC_ID:
            raise TooManyTopics(topic, MAX_TOPIC_ID)
        assert self._catalog is not None
        partition = partition_of(topic, self.config.partitions)
        topic_id = self._catalog.add(topic, partition)
        new.names.append(topic)
        new.partitions.append(partition)
        # its rule now, while the rules still cache the answer `should_persist` gave this publish (at its
        # next publish, a topic per device later, that cache has long moved on and every rule is matched)
        new.rules.append(self.rules.rule_number(topic))
        self._created_by[client_id] = self._created_by.get(client_id, 0) + 1
        return topic_id

    def _add_new(self, new: _NewTopics) -> None:
        """The topic table's rows and the listing's places of the topics `_register` just gave ids to."""
        assert self._catalogue is not None
        self._table.add_many(new.partitions, new.rules)
        self._order.add_many(new.names)
        self._committer.touched(self._catalogue)
        if not self._syncfs_checked:
            self._use_syncfs()

    def _refused(self, topic: str) -> None:
        """Count a refusal at `max_topics`; log once per `refusal_log_interval_s` with the count since."""
        self.refusals += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= self.config.refusal_log_interval_s:
            log.warning(
                "%d appends to new topics refused: the broker keeps at most %d logs (storage.max_topics); "
                "the latest for %r",
                self.refusals - self._refusals_logged,
                self.config.max_topics,
                topic,
            )
            self._refusals_logged = self.refusals
            self._refusal_logged_at = now

    # -- replication -----------------------------------------------------------------------------------

    def enable_replication(self, checkpoint_interval_s: float = 5.0) -> None:
        """From now on readers see each log up to its committed end (`commit`), not its durable end.

        The logs found at open start committed up to the end the checkpoint saved for them (0 for a log it
        does not list); with no checkpoint at all (a store that was never replicated: everything in it was
        acknowledged alone) up to their durable end. The checkpoint is written at once, then every
        `checkpoint_interval_s` while an event loop runs (in a thread of its executor), and at close."""
        if self._replicated:
            return
        if checkpoint_interval_s <= 0:
            raise ValueError(f"checkpoint_interval_s must be positive, got {checkpoint_interval_s}")
        saved = read_checkpoint(self.layout.meta_file(CHECKPOINT_FILE)) if self._opened else None
        self._replicated = True
        self._committer.pipeline(REPLICATED_SYNC_PIPELINE)
        table = self._table
        committed = array("q", table.durable)
        if saved is not None:
            for topic_id, name in enumerate(self._names):
                committed[topic_id] = max(
                    table.start[topic_id], min(saved.get(name, 0), table.durable[topic_id])
                )
        table.committed = committed
        for part in self._partitions:
            part.replicated = True
        if self._opened:
            self.checkpoint_committed()
            self._schedule_checkpoints(checkpoint_interval_s)

    def checkpoint_committed(self) -> None:
        """Save every log's committed end (when one moved since the last checkpoint), before returning."""
        taken = self._take_checkpoint()
        if taken is not None:
            self._write_checkpoint(*taken)

    def _take_checkpoint(self) -> tuple[int, array, list[str]] | None:
        """The committed ends to save now, numbered (None: nothing moved since the last checkpoint)."""
        committed = self._table.committed
        if not self._replicated or not self._opened or committed is None:
            return None
        data = committed.tobytes()
        if data == self._checkpointed and os.path.exists(self.layout.meta_file(CHECKPOINT_FILE)):
            return None
        self._checkpointed = data
        self._checkpoints_taken += 1
        return self._checkpoints_taken, array("q", committed), self._names

    def _write_checkpoint(self, number: int, committed: array, names: list[str]) -> None:
        """Write checkpoint `number` unless a later one is written already (any thread)."""
        with self._checkpoint_lock:
            if number <= self._checkpoints_written:
                return
            if path_trace.ON:
                path_trace.mark("checkpoint", "", 0, 1)
            ends = {names[topic_id]: end for topic_id, end in enumerate(committed)}
            try:
                write_checkpoint(self.layout.meta_file(CHECKPOINT_FILE), ends)
            except OSError as error:
                log.error("cannot save the committed ends of the logs: %s", error)
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
            if self._closed:
                return
            writing = self._checkpoint_writing
            if writing is None or writing.done():
                taken = self._take_checkpoint()
                if taken is not None:
                    self._checkpoint_writing = loop.run_in_executor(None, self._write_checkpoint, *taken)
            self._checkpoint_timer = loop.call_later(interval_s, tick)

        self._checkpoint_timer = loop.call_later(interval_s, tick)

    @property
    def replicated(self) -> bool:
        return self._replicated

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

    def commit(self, topic: str, offset: int) -> int:
        """Let readers of `topic` see its records below `offset` (capped at the durable end): wakes the
        long-polls it satisfies. Returns the committed end."""
        topic_id = self._id(topic)
        table = self._table
        committed = table.committed
        if committed is None:
            return table.durable[topic_id]
        before = committed[topic_id]
        offset = min(offset, table.durable[topic_id])
        if offset > before:
            committed[topic_id] = offset
            self._wake([(topic_id, before)])
        return committed[topic_id]

    def append_frames(self, topic: str, frames: bytes | memoryview, at: int | None = None) -> int:
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
        topic_id = self._writable_id(topic, "")
        table = self._table
        first = table.next[topic_id]
        if at is not None and at > first:
            if table.start[topic_id] >= first:
                self.restart_at(topic, at)
            first = at
        view = memoryview(frames)
        size = len(view)
        max_body = self.config.max_record_bytes
        checked: list[memoryview] = []
        times: list[int] = []
        position = 0
        offset = first
        try:
            while position < size:
                end, timestamp = check_frame(view, position, offset, max_body)
                checked.append(view[position:end])
                times.append(timestamp)
                position = end
                offset += 1
        except FrameError as error:
            raise InvalidRecord(
                f"frames for {topic!r} refused at offset {offset}: {error.reason} "
                f"(the log continues at {first})"
            ) from None
        if not checked:
            return first
        if offset > MAX_OFFSET:
            raise InvalidRecord(f"frames for {topic!r} refused: they end at {offset}, past {MAX_OFFSET}")
        part = self._partitions[table.partition[topic_id]]
        if first > table.next[topic_id]:  # a gap: its marker says where the log goes on, through any restart
            part.leave_active_segment(topic_id)
            part.append_marker(topic_id, TRUNCATE, first, 0)
            table.next[topic_id] = first
        part.append_frames(topic_id, checked, times)
        self._committer.appended_many(part, len(checked), part.last_append_size)
        return first

    def import_frames(self, topic: str, offset: int, frames: list[memoryview], times: list[int]) -> None:
        """Append frames of `topic` as they are, from `offset` on, not checked (the upgrade copying a
        layout-2 log: damaged frames stay damaged, and records lost to damage leave a gap, the offsets
        between the log's end and `offset`, as they did there). A topic new here starts at `offset`."""
        topic_id = self._ids.get(topic)
        if topic_id is None:
            topic_id = self._create(topic, "")
            if offset > 0:
                self.import_start(topic, offset)
        table = self._table
        if offset < table.next[topic_id]:
            raise StorageError(f"{topic!r} continues at {table.next[topic_id]}, not {offset}")
        table.next[topic_id] = offset
        part = self._partitions[table.partition[topic_id]]
        part.append_frames(topic_id, frames, times)
        self._committer.appended_many(part, len(frames), part.last_append_size)

    def import_start(self, topic: str, offset: int) -> None:
        """Start an empty log of `topic` at `offset` (a restart marker, made durable by the next flush)."""
        _check_offset(topic, offset)
        topic_id = self._ids.get(topic)
        if topic_id is None:
            topic_id = self._create(topic, "")
        table = self._table
        part = self._partitions[table.partition[topic_id]]
        part.append_marker(topic_id, RESTART, offset, 0)
        self._committer.touched(part)
        active = part.active
        assert active is not None
        part.restart_live(topic_id, offset, active.number)
        table.next[topic_id] = table.durable[topic_id] = table.start[topic_id] = offset

    def read_frames(
        self, topic: str, offset: int, max_bytes: int, stop: int | None = None
    ) -> tuple[list[bytes], int]:
        """Stored frames of `topic` from `offset` towards its durable end (or `stop` before it) within
        `max_bytes` (at least one), unchecked (a replica checks them), and how many they are. Raises
        `OffsetOutOfRange` outside [start_offset, durable_end]."""
        topic_id = self._id(topic)
        table = self._table
        end = table.durable[topic_id]
        start = table.start[topic_id]
        if offset < start or offset > end:
            raise OffsetOutOfRange(topic, offset, start, end)
        if stop is not None and stop < end:
            end = stop
        if offset >= end:
            return [], 0
        part = self._partitions[table.partition[topic_id]]
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
        topic_id = self._id(topic)
        table = self._table
        end = table.durable[topic_id]
        if stop is not None and stop < end:
            end = stop
        if offset >= end or offset < table.start[topic_id]:
            return offset
        part = self._partitions[table.partition[topic_id]]
        try:
            part.locate(topic_id, offset, end, 1, True)
        except CorruptRecord as missing:
            return min(max(missing.next_offset, offset), end)
        return offset

    def truncate(self, topic: str, offset: int) -> None:
        """Drop the records of `topic` at and after `offset` (a replica's tail its new leader does not
        have), durably: a truncation marker is written and fsynced before this returns."""
        topic_id = self._ids.get(topic)
        if topic_id is None:
            return
        table = self._table
        if offset >= table.next[topic_id]:
            return
        self._check_settled(topic_id, topic, "truncate")
        offset = max(offset, 0)
        committed = table.end(topic_id)
        part = self._partitions[table.partition[topic_id]]
        self._settle_seals()
        dropped = part.cut_live(topic_id, offset)
        part.append_marker(topic_id, TRUNCATE, offset, dropped)
        self._committer.touched(part)
        self.flush()
        table.next[topic_id] = table.durable[topic_id] = offset
        if table.committed is not None:
            table.committed[topic_id] = min(table.committed[topic_id], offset)
        if table.start[topic_id] > offset:
            table.start[topic_id] = offset
            table.dropped[topic_id] = table.total[topic_id]
        self._read_cache.drop_topic(topic_id)
        log.warning("%r truncated to %d records", topic, offset)
        if table.end(topic_id) < committed:  # (an unclean election) the checkpoint must not overstate
            self.checkpoint_committed()

    def restart_at(self, topic: str, offset: int) -> None:
        """Empty `topic`'s log (created if absent) and continue it at `offset` (at most `MAX_OFFSET`)."""
        _check_offset(topic, offset)
        topic_id = self._ids.get(topic)
        if topic_id is None:
            topic_id = self._create(topic, "")
        self._check_settled(topic_id, topic, "restart")
        table = self._table
        part = self._partitions[table.partition[topic_id]]
        self._settle_seals()
        part.append_marker(topic_id, RESTART, offset, 0)
        self._committer.touched(part)
        self.flush()
        active = part.active
        assert active is not None
        part.restart_live(topic_id, offset, active.number)
        table.next[topic_id] = table.durable[topic_id] = table.start[topic_id] = offset
        if table.committed is not None:
            table.committed[topic_id] = offset
        self._read_cache.drop_topic(topic_id)
        log.warning("%r restarted empty at offset %d", topic, offset)

    def _check_settled(self, topic_id: int, topic: str, action: str) -> None:
        table = self._table
        if table.next[topic_id] != table.durable[topic_id]:
            raise StorageError(f"cannot {action} the log of {topic!r} while appends are being written")

    def _settle_seals(self) -> None:
        """Wait for the sealer (a truncation changes rows a seal may be reading)."""
        if self._sealer is not None:
            self._sealer.wait_idle()

    def when_durable(
        self, callback: Callable[[], object], on_error: Callable[[BaseException], object] | None = None
    ) -> None:
        """Call `callback` on the event loop once everything appended before this call is durable."""
        self._committer.when_durable(callback, on_error)

    def end_window(self) -> None:
        """End the group-commit window now (see `GroupCommitter.end_window`)."""
        self._committer.end_window()

    async def wait_durable(self) -> None:
        """Make everything appended so far durable now (cuts the current window) and wait for it."""
        await self._committer.wait_durable()

    def flush(self) -> None:
        """Write (and fsync per policy) everything buffered, blocking the caller: for tools and tests."""
        self._committer.flush()

    def wait_sealed(self) -> None:
        """Block until the sealer has sealed every rolled segment whose data is durable (tools and tests:
        retention only considers sealed segments, and the sealer works in its own thread)."""
        if self._sealer is not None:
            self._sealer.wait_idle()

    @property
    def pending_bytes(self) -> int:
        """Bytes appended but not yet handed to the writer thread (a backpressure signal)."""
        return self._committer.pending_bytes

    @property
    def committer(self) -> GroupCommitter:
        """The durability driver (its counters say how many windows were written)."""
        return self._committer

    @property
    def tail_cache_budget(self) -> RecentWindows:
        """The recently written windows kept in memory (``bytes`` of ``max_bytes`` held now)."""
        return self._recent

    @property
    def file_pool(self) -> FileHandlePool:
        return self._pool

    @property
    def read_cache(self) -> ReadCache:
        """The blocks of records shared by readers (its counters say how it is used)."""
        return self._read_cache

    @property
    def sealer(self) -> Sealer | None:
        return self._sealer

    # -- reading -------------------------------------------------------------------------------------

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

    def iter_logs(self, pattern: str | None = None, chunk: int = 2048) -> Iterator[list[LogInfo]]:
        """`logs`, a sorted chunk at a time (the offsets API yields to the event loop between chunks)."""
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
            if len(batch) >= chunk:
                yield batch
                batch = []
        yield batch

    def end_offsets(self) -> dict[str, int]:
        """Every log's end offset by topic, built without a `LogInfo` per log (the broker's sessions file)."""
        table = self._table
        ends = table.committed if table.committed is not None else table.durable
        return dict(zip(self._names, ends, strict=True))

    def logs_created_by(self, client_id: str) -> int:
        """Logs created by appends of `client_id` since the store was opened."""
        return self._created_by.get(client_id, 0)

    def topics(self) -> list[str]:
        """The topics that have a log, unsorted."""
        return list(self._names)

    def __contains__(self, topic: object) -> bool:
        return topic in self._ids

    def __len__(self) -> int:
        return len(self._names)

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

    # -- whole partitions ----------------------------------------------------------------------------

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

    def _partition_for_reads(self, partition: int) -> PartitionLog:
        if self._replicated:
            raise StorageError("a cluster's store is read by topic offsets, not by partition positions")
        if not 0 <= partition < len(self._partitions):
            raise PositionOutOfRange(partition, 0, 0, 0)
        return self._partitions[partition]

    @property
    def partition_logs(self) -> list[PartitionLog]:
        return self._partitions

    def topic_id(self, topic: str) -> int:
        """The topic's id in the catalog (raises `UnknownTopic`)."""
        return self._id(topic)

    def partition_of(self, topic: str) -> int:
        """The partition holding the topic's log (raises `UnknownTopic`)."""
        return self._table.partition[self._id(topic)]

    def epochs_path(self, partition: int) -> str:
        """The leader-epoch journal of a partition (`epoch_journal`), for a cluster's replicas."""
        return os.path.join(self._partitions[partition].directory, EPOCHS_FILE)

    # -- retention -----------------------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """One retention pass (see `retention`), run through at once."""
        report = RetentionReport()
        for report in self._retention(now_ms):  # noqa: B007 - the last one is the final report
            pass
        return report

    async def apply_retention_async(self, now_ms: int | None = None) -> RetentionReport:
        """One retention pass, yielding to the event loop between slices."""
        report = RetentionReport()
        for report in self._retention(now_ms):  # noqa: B007
            await asyncio.sleep(0)
        return report

    def _retention(self, now_ms: int | None) -> Iterator[RetentionReport]:
        now_ms = _time_ns() // 1_000_000 if now_ms is None else now_ms
        size_limits = self.config.retention_bytes is not None or any(
            rule.retention_bytes is not None for rule in self.rules.rules
        )
        report = RetentionReport()
        for report in retention_pass(
            self._partitions, self._table, self._log_config, now_ms, self._delete_segments, size_limits
        ):
            yield report
        if report.topics_moved:
            self._read_cache.drop_below(self._table.start.__getitem__)
            if not report.segments_deleted and self._sealer is not None:
                self._sealer.delete_after_snapshot([])  # the moved starts are saved now, not at the next one
        if report.segments_deleted:
            log.info(
                "retention deleted %d segments (%d bytes)", report.segments_deleted, report.bytes_deleted
            )

    def _delete_segments(self, part: PartitionLog, segments: list[Segment]) -> None:
        for segment in segments:
            part.next_base = max(part.next_base, segment.base + segment.row_count)
            part.segments.remove(segment)
            del part.by_number[segment.number]
            self._recent.forget((part.number, segment.number))
        assert self._sealer is not None
        self._sealer.delete_after_snapshot(segments)

    def retention_of(self, topic: str) -> LogConfig:
        """The retention `topic`'s log is kept under (its persist rule's, or the store's)."""
        return self._log_config(self._id(topic))

    def _log_config(self, topic_id: int) -> LogConfig:
        configs = self._log_configs
        if not configs:
            configs += [self.config.log_config(rule) for rule in self.rules.rules]
            configs.append(self.config.log_config(None))
        rule = self._rule_of(topic_id)
        return configs[rule] if rule < len(self.rules.rules) else configs[-1]  # NO_MATCH: the defaults

    def _rule_of(self, topic_id: int) -> int:
        rules = self._table.rule
        number = rules[topic_id]
        if number == NO_RULE:
            number = rules[topic_id] = self.rules.rule_number(self._names[topic_id])
        return number

    # -- internals -----------------------------------------------------------------------------------

    def _id(self, topic: str) -> int:
        topic_id = self._ids.get(topic)
        if topic_id is None:
            raise UnknownTopic(topic)
        if self._quarantined:
            self._refuse_quarantined(topic, topic_id)
        return topic_id

    def _use_syncfs(self) -> None:
        """Let the writer make windows durable with syncfs where it reaches the store's filesystem."""
        self._syncfs_checked = True
        minimum = self.config.syncfs_min_segments
        if minimum > 0 and self.config.durability != "none" and syncfs_available(self.directory):
            self._directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._committer.use_syncfs(self._directory_fd, minimum)

    def _on_durable(self, advanced: list[tuple[int, int]], job: Job) -> None:
        if advanced and (self._topic_waiters or self._pattern_waiters):
            self._wake(advanced)
        sealer = self._sealer
        if sealer is None:
            return
        threshold = self.config.index_checkpoint_bytes
        for source, _pending in job:
            if not isinstance(source, PartitionLog):
                continue
            for segment in source.ready_to_seal():
                sealer.seal(source, segment)
            active = source.active
            if active is not None and active.durable_size - active.checkpointed_size >= threshold:
                active.checkpointed_size = active.durable_size
                sealer.checkpoint(active, active.durable_rows, active.capacity)

    def _wake(self, advanced: list[tuple[int, int]]) -> None:
        topic_waiters = self._topic_waiters
        pattern_waiters = self._pattern_waiters
        if not topic_waiters and not pattern_waiters:
            return
        names, table = self._names, self._table
        for topic_id, end_before in advanced:
            topic = names[topic_id]
            end = table.end(topic_id)
            for waiter in topic_waiters.get(topic, ()):
                if end > waiter.positions[topic]:
                    waiter.wake(topic)
            if end_before == 0:
                for waiter in pattern_waiters:
                    if topic not in waiter.positions and topic_matches(waiter.pattern or "#", topic):
                        waiter.wake(topic)

    def _remove_waiter(self, waiter: _Waiter) -> None:
        for topic in waiter.positions:
            waiters = self._topic_waiters.get(topic)
            if waiters is not None:
                waiters.remove(waiter)
                if not waiters:
                    del self._topic_waiters[topic]
        if waiter.pattern is not None:
            self._pattern_waiters.remove(waiter)


def _check_offset(topic: str, offset: int) -> None:
    if not 0 <= offset <= MAX_OFFSET:
        raise StorageError(f"{topic!r} cannot go on at offset {offset}: a log ends at {MAX_OFFSET} at most")


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


def _log_opened(directory: str, report: RecoveryReport) -> None:
    """One line on what opening found: a fresh start, a clean restart, or a recovery with its counts."""
    if report.fresh:
        log.info("opened a new store in %s (no logs yet)", directory)
        return
    level = logging.WARNING if report.repaired else logging.INFO
    log.log(
        level,
        "opened %d logs (%d records) in %s after a%s shutdown in %.2f s; %d repaired, %d bytes dropped, "
        "%d indexes rebuilt, %d records scanned",
        report.logs,
        report.records,
        directory,
        " clean" if report.clean_shutdown else "n unclean",
        report.seconds,
        len(report.repaired),
        report.bytes_dropped,
        report.indexes_rebuilt,
        report.records_scanned,
    )


def _write_marker(path: str) -> None:
    with open(path, "wb") as file:
        os.fsync(file.fileno())
    fsync_directory(os.path.dirname(path))
