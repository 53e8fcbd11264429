"""What the store's parts share: the topics, their state and the partition logs, and what makes a topic's log.

``LogStore`` is built from parts by job, each in its own module over this state: appending
(``store_appends``), reading and waiting for records (``store_reads``), retention and the administration of
logs (``store_admin``), and the replicated-log interface a cluster and the uplink write through
(``replicated_log``). The state is built empty here and filled by ``LogStore.open``: the topic table's columns
(by topic id), the name → id map and the names, the partition logs, the durability driver (``group_commit``),
the caches and the sealer. What more than one part needs is here too: a topic's id for reading or writing
(refused for a log set aside at open), making a new topic's log within the store's limits, the long-polls
woken when records become visible, and what happens once a write is durable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from array import array
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from broker_edge.bounds import MAX_OFFSET
from broker_edge.placement import partition_of
from broker_edge.protocol.topics import topic_matches

from . import record
from .catalog import EMPTY_CRC
from .catalog import HEADER as CATALOG_HEADER
from .clock import Clock, ClockJumps
from .config import LogConfig, StorageConfig
from .entry import MAX_TOPIC_ID, RESTART, TRUNCATE
from .errors import (
    InvalidRecord,
    StorageError,
    StorageShortage,
    TooManyTopics,
    UnknownTopic,
)
from .file_pool import FileHandlePool
from .fs_sync import syncfs_available
from .group_commit import GroupCommitter, Job
from .layout import layout_of
from .partition_log import PartitionConfig, PartitionLog, PartitionPending
from .partition_reads import TopicFilters
from .persistence import PersistenceRules
from .quarantine import LogQuarantined, QuarantinedLog
from .read_cache import ReadCache
from .recent import RecentWindows
from .removed_account import RemovedAccount
from .sealed_index import GroupBlocks
from .sealer import Sealer
from .topic_ids import TopicIds
from .topic_order import TopicOrder
from .topic_table import NO_RULE, TopicTable

if TYPE_CHECKING:
    from .catalog import TopicCatalog

log = logging.getLogger("broker_edge.storage.store")

__all__ = ["StoreState"]


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
        crc = _file_crc(catalog.path, catalog.size)
        if catalog.damaged:  # entries stepped over: a CRC no open trusts, so that each checks every entry
            crc ^= 0xFFFFFFFF
        self.durable = (catalog.size, crc)
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


class StoreState:
    """The state the store's parts share (see the module docstring)."""

    def __init__(
        self, directory: str | Path, config: StorageConfig | None = None, clock: Clock | None = None
    ) -> None:
        self.directory = str(directory)
        self._clock = clock or Clock()
        """The wall clock records are stamped and aged by, and the time passed (``clock``)."""
        self._clock_jumps: ClockJumps | None = None
        """The wall clock's jumps retention allows for, from `open` on."""
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
            min_interval_ms=config.group_commit_min_interval_ms,
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
        self._removed: RemovedAccount | None = None
        """What retention deleted, per topic (``removed_account``), set by `open`."""
        self._log_configs: list[LogConfig] = []
        self._created_by: dict[str, int] = {}
        self._asked: dict[str, int] = {}
        """The ids `persist_as` found for logged publishes, which it and `append_batches` take rather than
        probing the name -> id table again (a topic's id never changes): a fleet's devices publish on the
        same topics turn after turn. At most `ASKED_MAX` of them, emptied when full."""
        self._topic_waiters: dict[str, list[_Waiter]] = {}
        self._pattern_waiters: list[_Waiter] = []
        self._advance_listeners: list[Callable[[str], None]] = []
        """Told each topic whose readable end advanced (``Reads.watch_advances``)."""
        self._directory_fd: int | None = None
        self._replicated = False
        """Whether readers see the committed ends (``ReplicatedLog.enable``) rather than the durable ones."""
        self._syncfs_checked = False
        self._opened = False
        self._closed = False
        self._quarantined: dict[int, QuarantinedLog] = {}
        """The logs set aside at open, by topic id."""
        self.refusals = 0
        """Appends refused because `max_topics` logs exist (counted since open)."""
        self._refusals_logged = 0
        self._refusal_logged_at = float("-inf")

    def _id(self, topic: str) -> int:
        topic_id = self._ids.get(topic)
        if topic_id is None:
            raise UnknownTopic(topic)
        if self._quarantined:
            self._refuse_quarantined(topic, topic_id)
        return topic_id

    def _refuse_quarantined(self, topic: str, topic_id: int) -> None:
        entry = self._quarantined.get(topic_id)
        if entry is not None:
            raise LogQuarantined(topic, entry.reason)

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
        shortage of file descriptors or disk space (``StorageShortage``, until the log is written)."""
        committer = self._committer
        if committer.failure is not None:
            raise committer.failure
        shortage = committer.shortage
        if shortage is not None:
            raise StorageShortage(shortage.cause, shortage.detail)

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

    def _rule_of(self, topic_id: int) -> int:
        rules = self._table.rule
        number = rules[topic_id]
        if number == NO_RULE:
            number = rules[topic_id] = self.rules.rule_number(self._names[topic_id])
        return number

    def _check_settled(self, topic_id: int, topic: str, action: str) -> None:
        table = self._table
        if table.next[topic_id] != table.durable[topic_id]:
            raise StorageError(f"cannot {action} the log of {topic!r} while appends are being written")

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

    def _continue_past_gap(self, topic_id: int, end: int) -> None:
        """`topic_id`'s log, holding records, goes on at `end`: the offsets from its next one are a gap, its
        marker buffered (durable by the caller's flush) in a segment of its own after the log's records."""
        table = self._table
        part = self._partitions[table.partition[topic_id]]
        part.leave_active_segment(topic_id)
        part.append_marker(topic_id, TRUNCATE, end, 0)
        table.next[topic_id] = table.durable[topic_id] = end
        self._committer.touched(part)

    def _settle_seals(self) -> None:
        """Wait for the sealer (a truncation changes rows a seal may be reading)."""
        if self._sealer is not None:
            self._sealer.wait_idle()

    def _use_syncfs(self) -> None:
        """Let the writer make windows durable with syncfs where it reaches the store's filesystem."""
        self._syncfs_checked = True
        minimum = self.config.syncfs_min_segments
        if minimum > 0 and self.config.durability != "none" and syncfs_available(self.directory):
            self._directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._committer.use_syncfs(self._directory_fd, minimum)

    def _on_durable(self, advanced: list[tuple[int, int]], job: Job) -> None:
        if advanced and (self._topic_waiters or self._pattern_waiters or self._advance_listeners):
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
        listeners = self._advance_listeners
        if not topic_waiters and not pattern_waiters and not listeners:
            return
        names, table = self._names, self._table
        for topic_id, end_before in advanced:
            topic = names[topic_id]
            for listener in listeners:
                listener(topic)
            end = table.end(topic_id)
            for waiter in topic_waiters.get(topic, ()):
                if end > waiter.positions[topic]:
                    waiter.wake(topic)
            if end_before == 0:
                for waiter in pattern_waiters:
                    if topic not in waiter.positions and topic_matches(waiter.pattern or "#", topic):
                        waiter.wake(topic)


def _check_offset(topic: str, offset: int) -> None:
    if not 0 <= offset <= MAX_OFFSET:
        raise StorageError(f"{topic!r} cannot go on at offset {offset}: a log ends at {MAX_OFFSET} at most")
