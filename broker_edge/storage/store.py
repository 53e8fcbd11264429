"""All logs of one broker: topics in partition logs, persistence rules, durability, limits, long-polls.

The topics' records live in partition logs under `<directory>/log/` (see `partition_log`), their names and
ids in the catalog, their state in the topic table's columns; the store's own files under `<directory>/meta/`
(see `layout`, which also moves older directories into this one at open). The store is driven from one
asyncio event loop: appends are buffered, each window's data is copied into the files with one pwritev per
partition, fsyncs run in a writer thread (see `group_commit`), indexes are sealed and checkpointed in the
sealer thread (`sealer`), and reads are preads on the loop (or slices of the windows written last). Readers
only ever get durable records: a topic's `end_offset` is its high watermark; on a replicated store its
committed end (`replicated_log`).

`LogStore` is its parts by job over one shared state (`store_state`): appending (`store_appends`), reading
and waiting (`store_reads`), retention and administration (`store_admin`), and the replicated-log interface
(`replicated_log`, the `replicated_log` attribute), through which a cluster's replicas and the uplink append
at an offset, truncate, commit and read frames. This module opens and closes the store and drives its
durability.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from broker_edge.log_info import LogInfo

from .clock import Clock, ClockJumps
from .config import StorageConfig
from .disk_reserve import RESERVE_FILE, DiskReserve
from .errors import (
    StorageFailed,
)
from .file_pool import FileHandlePool
from .group_commit import GroupCommitter
from .layout import layout_version, open_layout
from .partition_reads import TopicFilters
from .quarantine import QUARANTINE_FILE, QuarantinedLog, set_aside
from .read_cache import ReadCache
from .recent import RecentWindows
from .recovery import open_partitions
from .removed_account import ACCOUNT_FILE, RemovedAccount
from .replicated_log import ReplicatedLog
from .retention import RetentionReport
from .sealer import Sealer
from .segment import ROLLED, fsync_directory
from .store_admin import Admin
from .store_appends import Appends
from .store_identity import ensure_store_id
from .store_reads import PartitionInfo, PartitionRecords, Reads
from .store_state import _Catalogue
from .topic_order import TopicOrder
from .topic_table import SNAPSHOT_FILE
from .upgrade import finish_upgrade, upgrade_layout_2

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)

__all__ = ["LogInfo", "LogStore", "PartitionInfo", "PartitionRecords", "RecoveryReport", "RetentionReport"]

CLEAN_SHUTDOWN_MARKER = "CLEAN_SHUTDOWN"


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
    records_lost: int = 0
    """Records the indexes or the snapshot counted that are gone from disk (a segment file missing or cut):
    their offsets answer that they are missing, and are never given again."""
    quarantined: list[QuarantinedLog] = field(default_factory=list)
    """Logs set aside: they could not be opened (now or at an earlier open), and are neither read nor
    written (`quarantine`)."""
    seconds: float = 0.0


class LogStore(Appends, Reads, Admin):
    """The logs of one broker. Call `open()` first and `close()` at shutdown."""

    def __init__(
        self, directory: str | Path, config: StorageConfig | None = None, clock: Clock | None = None
    ) -> None:
        super().__init__(directory, config, clock)
        self.replicated_log = ReplicatedLog(self)
        """The replicated-log interface (a cluster's replicas, the uplink): see ``replicated_log``."""
        self.store_id: str | None = None
        """The data directory's identity, set by `open` (``store_identity``): it never changes."""

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
        self.store_id = ensure_store_id(self.layout.meta, log_is_new=self.layout.log_is_empty())
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
        self._asked = {}
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
            reserve=self._reserve_at_open(),
        )
        self._removed = RemovedAccount(
            os.path.join(self.layout.log, ACCOUNT_FILE), self.config.durability != "none", self._partitions
        )
        self._removed.open()
        for part in self._partitions:  # (what a read in a gap walks past says nothing)
            part.retention_deleted = partial(self._removed.deleted_segment, part.number)
        table = self._table
        report.logs = len(table)
        report.records = sum(table.durable) - sum(table.start)
        report.bytes_dropped = sum(r.bytes_dropped for r in opened.repairs) + opened.catalog_bytes_dropped
        report.indexes_rebuilt = opened.indexes_rebuilt
        report.records_scanned = opened.records_scanned
        report.repaired = [repair for repair in opened.repairs if repair.repaired]
        report.records_lost = sum(repair.records_lost for repair in opened.repairs)
        if report.clean_shutdown:
            os.unlink(marker)  # from now on a crash must not look like a clean shutdown
            fsync_directory(self.layout.meta)
        report.fresh = not report.clean_shutdown and not len(table)
        self._opened = True
        for part in self._partitions:
            for segment in part.segments[:-1]:
                if segment.rows is not None:
                    self._sealer.seal(part, segment)
        self._keep_gaps(opened.gaps, opened.orphan_indexes)
        if any(part.segments for part in self._partitions):
            self._use_syncfs()
        self._clock_jumps = ClockJumps(self.layout.meta, self._clock)
        self._clock_jumps.start(self._clock.wall_ms())  # the reference the first pass compares with
        report.seconds = time.monotonic() - began
        _log_opened(self.directory, report)
        return report

    def _keep_gaps(self, gaps: list[tuple[int, int, int]], orphan_indexes: list[str]) -> None:
        """Make each lost end of a log a gap before any append (a marker: the log goes on at the offset it
        had reached, durably, so no offset is given twice), then remove the sealed indexes left without
        their segment (the evidence of those ends)."""
        for topic_id, _next, end in gaps:
            self._continue_past_gap(topic_id, end)
        if gaps:
            self._committer.flush()
        for path in orphan_indexes:
            os.unlink(path)
        for directory in {os.path.dirname(path) for path in orphan_indexes}:
            fsync_directory(directory)

    def _reserve_at_open(self) -> DiskReserve:
        """The disk reserve (``disk_reserve``): the one a previous run left, made or grown to what the
        snapshot there needs when the store holds logs (the sealer makes it once it seals the first)."""
        reserve = DiskReserve(os.path.join(self.layout.log, RESERVE_FILE), self.config.disk_reserve_bytes)
        reserve.adopt()
        if len(self._table):
            reserve.keep(os.path.join(self.layout.log, SNAPSHOT_FILE))
        return reserve

    def close(self) -> None:
        """Write, fsync and seal everything, save the snapshot, leave a clean-shutdown marker."""
        if self._closed:
            return
        self._closed = True
        unwritten: list[str] = []  # what a full or failing disk kept from being written: said, not raised
        if self._sealer is not None:
            self._sealer.closing = True
        try:
            self._committer.close()
        except (OSError, StorageFailed) as error:
            unwritten.append(f"buffered appends ({error})")
        try:
            self.replicated_log.close()
        except OSError as error:
            unwritten.append(f"the committed ends' checkpoint ({error})")
        sealer = self._sealer
        failed = self._committer.failure is not None
        if sealer is not None and not failed:
            try:
                sealer.retry_held_seals()  # before the active segments, which would wait behind them
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
            if sealer.failure is not None or sealer.seals_held:
                unwritten.append(f"the segments' seals or the snapshot ({sealer.failure})")
        if sealer is not None:
            sealer.stop()
        if self._directory_fd is not None:
            os.close(self._directory_fd)
            self._directory_fd = None
        try:
            self._pool.close()
        except OSError as error:
            unwritten.append(f"the log files' last writes ({error})")
        self._read_cache.clear()
        for waiters in [*self._topic_waiters.values(), self._pattern_waiters]:
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result([])
        if not self._opened:
            return
        failure = self._committer.failure
        if self._clock_jumps is not None:
            self._clock_jumps.save_reference()
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


def _log_opened(directory: str, report: RecoveryReport) -> None:
    """One line on what opening found: a fresh start, a clean restart, or a recovery with its counts."""
    if report.fresh:
        log.info("opened a new store in %s (no logs yet)", directory)
        return
    level = logging.WARNING if report.repaired else logging.INFO
    log.log(
        level,
        "opened %d logs (%d records) in %s after a%s shutdown in %.2f s; %d repaired, %s%d bytes dropped, "
        "%d indexes rebuilt, %d records scanned",
        report.logs,
        report.records,
        directory,
        " clean" if report.clean_shutdown else "n unclean",
        report.seconds,
        len(report.repaired),
        f"{report.records_lost} records lost, " if report.records_lost else "",
        report.bytes_dropped,
        report.indexes_rebuilt,
        report.records_scanned,
    )


def _write_marker(path: str) -> None:
    with open(path, "wb") as file:
        os.fsync(file.fileno())
    fsync_directory(os.path.dirname(path))
