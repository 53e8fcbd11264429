"""The sealer thread: everything about indexes that must not hold up an acknowledgement or the event loop.

* **Seals.** A rolled segment whose data is durable is sorted by topic into its sealed index
  (`sealed_index.build`), written and fsynced; its groups are applied to the sealed state; its open index is
  deleted; the loop is told (`PartitionLog.sealed`) and drops the segment's rows.
* **Open-index checkpoints.** The rows of the active segment whose jobs completed are appended to its open
  index, and fsynced with their count every `index_checkpoint_bytes` of records.
* **Snapshots** of the sealed state (with the live start and dropped columns), after seals at most every
  `SNAPSHOT_INTERVAL_S` and on demand; segments retention gave up are deleted only after the next one. A
  snapshot that would let segments go and finds the disk full is written into the space of the disk
  reserve (`disk_reserve`), released for it; the reserve is made again after a snapshot once there is room.

Tasks run in order. Without a running event loop (tools, tests) each task runs at once in the caller.
A task that meets a passing shortage (`errors.passing_shortage`: the process out of file descriptors, the
filesystem out of space) is tried again, pausing 10 ms, 20 ms, ... up to a second, for at most
`SHORTAGE_PATIENCE_S` (once the store closes, for the cause's `closing_patience_s` more): a shortage delays
indexes, it does not fail them. Running a task again is safe even
after a failed fsync, unlike the log's: every task writes again, from memory, all it has not made durable
(a seal or a snapshot a whole new file, a checkpoint every row its header does not count yet), so no page
a failed sync may have dropped is left unwritten. A task still short after that fails as any other
(logged). A seal that failed is held with its segment in memory, and the later seals of its partition wait
behind it, so that segments are sealed and their groups applied in order; the held seals are tried again
at every retention pass (`retry_held_seals`) and at close, and the next start seals what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from .disk_reserve import DiskReserve
from .errors import DISK_FULL, passing_shortage
from .file_pool import FileHandlePool
from .open_index import OpenIndex
from .partition_log import PartitionLog
from .sealed_index import GroupBlocks, SealedIndex, build, write_index
from .segment import Segment, fsync_directory, rebuild_marker
from .segment_scan import apply_groups, remove_file
from .shortage_wait import ShortageWait
from .topic_table import SealedState, Snapshot, TopicTable, write_snapshot

__all__ = ["SNAPSHOT_INTERVAL_S", "Sealer"]

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_S = 30.0
"""At most this long after a seal before the snapshot records it."""
SHORTAGE_PATIENCE_S = 60.0
"""How long a task meeting a shortage is retried before it fails (logged, its segment kept in memory)."""


@dataclass(slots=True)
class _Seal:
    partition: PartitionLog
    segment: Segment


@dataclass(slots=True)
class _Checkpoint:
    segment: Segment
    rows: int
    capacity: int


@dataclass(slots=True)
class _Snapshot:
    done: threading.Event


@dataclass(slots=True)
class _Delete:
    segments: list[Segment]


_STOP = object()
_RETRY_HELD = object()


class Sealer:
    """Seals, open-index checkpoints, the sealed state and its snapshot, in one thread (see the module)."""

    def __init__(
        self,
        pool: FileHandlePool,
        blocks: GroupBlocks,
        state: SealedState,
        applied: dict[int, tuple[int, int]],
        snapshot_path: str,
        table: TopicTable,
        catalog_coverage: Callable[[], tuple[int, int]],
        partitions: int,
        sync: bool = True,
        reserve: DiskReserve | None = None,
    ) -> None:
        self.pool = pool
        self.blocks = blocks
        self.state = state
        self.applied = applied
        """Per partition, the newest segment the sealed state includes, and the position after it."""
        self.snapshot_path = snapshot_path
        self.table = table
        self.catalog_coverage = catalog_coverage
        self.partitions = partitions
        self.sync = sync
        """fsync what it writes (not with the `none` policy, under which nothing is promised durable)."""
        self.reserve = reserve
        """Space released for a snapshot that lets segments go on a full disk (None: none is kept)."""
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._unsnapshotted = 0
        self._last_snapshot = time.monotonic()
        self._to_delete: list[Segment] = []
        self._given_up: list[Segment] = []
        """Segments retention gave up, handed over from the loop (``_given_up_lock``): taken into
        ``_to_delete`` by their ``_Delete`` task, or sooner by a task waiting for disk space."""
        self._given_up_lock = threading.Lock()
        self._reports: deque[tuple[Callable[..., object], tuple[object, ...]]] = deque()
        self.failure: BaseException | None = None
        """The error of the last task that failed, until it is made good (a held seal made later)."""
        self._failed: object = None
        self._held: dict[int, list[_Seal]] = {}
        """Per partition, a seal that failed and the later ones waiting behind it (the thread's only)."""
        self.closing = False
        """Set by a closing store: a task meeting a shortage is tried for its ``closing_patience_s`` more."""
        self.seals = 0
        self.snapshots = 0
        self.checkpoints = 0

    # -- the loop's side ---------------------------------------------------------------------------------

    def seal(self, partition: PartitionLog, segment: Segment) -> None:
        self._submit(_Seal(partition, segment))

    def checkpoint(self, segment: Segment, rows: int, capacity: int) -> None:
        """Append the segment's rows up to `rows` (durable) to its open index and make them durable."""
        self._submit(_Checkpoint(segment, rows, capacity))

    def delete_after_snapshot(self, segments: list[Segment]) -> None:
        """Delete these segments' files once a snapshot recording the starts that passed them is durable."""
        with self._given_up_lock:
            self._given_up += segments
        self._submit(_Delete(segments))

    def retry_held_seals(self) -> None:
        """Try again the seals that failed (a retention pass, close): each partition's in order."""
        if self._held:
            self._submit(_RETRY_HELD)

    @property
    def seals_held(self) -> bool:
        """Seals wait behind one that failed (their segments are kept in memory)."""
        return bool(self._held)

    @property
    def deletions_waiting(self) -> bool:
        """Segments retention gave up wait for a snapshot that has not been written (a full disk)."""
        return bool(self._to_delete or self._given_up)

    def snapshot(self) -> None:
        """Write a snapshot now and wait for it (close)."""
        done = threading.Event()
        self._submit(_Snapshot(done))
        done.wait()

    def wait_idle(self) -> None:
        """Block until every task submitted so far is done (the loop blocks: for close and truncations)."""
        if self._thread is not None:
            done = threading.Event()
            self._queue.put(done)
            done.wait()
        self.apply_reports()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None

    def _submit(self, task: object) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        if loop is None and self._thread is None:
            self._run_task_patiently(task)
            return
        if self._thread is None:
            self._loop = loop
            self._thread = threading.Thread(target=self._run, name="timestone-log-sealer", daemon=True)
            self._thread.start()
        self._queue.put(task)

    # -- the thread's side -------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            task = self._queue.get()
            if task is _STOP:
                return
            if isinstance(task, threading.Event):
                task.set()
                continue
            if isinstance(task, _Seal) and task.partition.number in self._held:
                self._held[task.partition.number].append(task)  # behind one that failed: in order
                continue
            try:
                self._run_task_patiently(task)
            except BaseException as error:  # a failed index write: logged, the segment stays in memory
                self.failure = error
                self._failed = task
                if isinstance(task, _Seal):
                    self._held[task.partition.number] = [task]
                    log.exception(
                        "the seal of segment %d of partition %d failed: the segment stays in memory and the "
                        "partition's later seals wait behind it, tried again at the next retention pass",
                        task.segment.number,
                        task.partition.number,
                    )
                else:
                    log.exception("sealer task failed: %s", task)
                if isinstance(task, _Snapshot):
                    task.done.set()

    def _seal_held(self) -> None:
        """One more try of each partition's held seals, in order, up to the first that fails again."""
        for number, waiting in list(self._held.items()):
            while waiting:
                seal = waiting[0]
                try:
                    self._run_task(seal)
                except Exception as error:
                    self.failure, self._failed = error, seal
                    log.warning(
                        "the seal of segment %d of partition %d failed again (%s): %d seals wait, tried "
                        "again at the next retention pass",
                        seal.segment.number,
                        number,
                        error,
                        len(waiting),
                        exc_info=not isinstance(error, OSError),  # anything else is a bug: its traceback
                    )
                    break
                waiting.pop(0)
                if self._failed is seal:
                    self.failure = self._failed = None
            if not waiting:
                del self._held[number]
                log.warning("the held seals of partition %d are made", number)

    def _run_task_patiently(self, task: object) -> None:
        """``_run_task``, tried again while it meets a passing shortage (see the module docstring)."""
        wait = ShortageWait(SHORTAGE_PATIENCE_S)
        while True:
            try:
                self._run_task(task)
                return
            except OSError as error:
                cause = passing_shortage(error, syncing=False)  # each task writes again what it synced
                if cause is None or wait.gives_up(cause):
                    raise
                if cause is DISK_FULL and self._free_space_meanwhile():
                    continue  # retention's segments went: try again at once
                if not wait.waited:
                    log.warning(
                        "%s (%s): the index task %s waits (%s)",
                        cause.lacking,
                        error.strerror,
                        type(task).__name__.strip("_").lower(),
                        cause.remedy,
                    )
            wait.pause(self.closing)

    def _run_task(self, task: object) -> None:
        if task is _RETRY_HELD:
            self._seal_held()
        elif isinstance(task, _Seal):
            self._seal(task.partition, task.segment)
        elif isinstance(task, _Checkpoint):
            self._checkpoint(task)
        elif isinstance(task, _Delete):
            self._take_given_up()  # its segments, unless a task waiting for space took them already
            self._write_snapshot()
        elif isinstance(task, _Snapshot):
            self._write_snapshot()
            task.done.set()

    def _seal(self, partition: PartitionLog, segment: Segment) -> None:
        """Seal ``segment``, then write the snapshot when one is due. A seal tried again after that snapshot
        failed (a shortage) finds its groups applied already and only writes the snapshot."""
        if segment.number > self.applied.get(partition.number, (-1, 0))[0]:
            self._seal_segment(partition, segment)
        if time.monotonic() - self._last_snapshot >= SNAPSHOT_INTERVAL_S:
            self._write_snapshot()

    def _seal_segment(self, partition: PartitionLog, segment: Segment) -> None:
        rows = segment.rows
        if rows is None:
            return
        built = build(rows, segment.number, segment.base, segment.size)
        write_index(segment.index_path, built.data, self.sync)
        if self.sync:
            fsync_directory(partition.directory)
        index = SealedIndex(segment.index_path, self.pool, self.blocks)
        if not index.load(segment.number):
            raise OSError(f"{segment.index_path}: the index just written does not read back")
        apply_groups(self.state, index)
        self.applied[partition.number] = (segment.number, segment.base + index.rows)
        self.pool.forget(segment.open_path)
        remove_file(segment.open_path)
        remove_file(rebuild_marker(partition.directory, segment.number))  # (an index made again)
        self.seals += 1
        self._unsnapshotted += 1
        self._keep_reserve()
        self._report(partition.sealed, segment, index)

    def _checkpoint(self, task: _Checkpoint) -> None:
        segment = task.segment
        rows = segment.rows
        if rows is None:
            return  # sealed meanwhile
        index = segment.open_index
        if index is None:
            index = segment.open_index = OpenIndex(segment.open_path, self.pool, task.capacity)
        first = index.written
        try:
            if task.rows > first:
                index.append(rows.topic_ids[first : task.rows], rows.positions[first : task.rows],
                             rows.times[first : task.rows])  # fmt: skip
            index.checkpoint(self.sync)
        except OSError:
            index.written = index.durable  # tried again: every row not counted is written again
            raise
        self.checkpoints += 1

    def _write_snapshot(self) -> None:
        table = self.table
        catalog_bytes, catalog_crc = self.catalog_coverage()
        topics = len(self.state)
        snapshot = Snapshot(
            self.state,
            table.start[:topics],
            table.dropped[:topics],
            [self.applied.get(number, (-1, 0)) for number in range(self.partitions)],
            catalog_bytes,
            catalog_crc,
        )
        try:
            write_snapshot(self.snapshot_path, snapshot, self.sync)
        except OSError as error:
            if not self._release_reserve_for(error):
                raise
            write_snapshot(self.snapshot_path, snapshot, self.sync)
        self.snapshots += 1
        self._unsnapshotted = 0
        self._last_snapshot = time.monotonic()
        deleting, self._to_delete = self._to_delete, []
        for segment in deleting:
            segment.delete(self.pool)
            self.blocks.forget(segment.index_path)
        directories = {segment.log_path.rsplit("/", 1)[0] for segment in deleting}
        for directory in directories if self.sync else ():
            with contextlib.suppress(FileNotFoundError):
                fsync_directory(directory)
        self._keep_reserve()

    def _keep_reserve(self) -> None:
        """Make or grow the disk reserve once the log holds sealed records (an empty store keeps none)."""
        if self.reserve is not None and len(self.state):
            self.reserve.keep(self.snapshot_path)

    def _take_given_up(self) -> None:
        with self._given_up_lock:
            given_up, self._given_up = self._given_up, []
        self._to_delete += given_up

    def _free_space_meanwhile(self) -> bool:
        """A task waits for disk space while retention gave segments up: write their snapshot now (through
        the reserve) so that they go, rather than after the task, which the space they free may let pass.
        Whether they went."""
        self._take_given_up()
        if not self._to_delete or self.reserve is None or not self.reserve.held:
            return False
        try:
            self._write_snapshot()
        except OSError:
            return False
        return True

    def _release_reserve_for(self, error: OSError) -> bool:
        """Whether the reserve was released for a snapshot that met a full disk: only one that lets
        segments go (any other would only spend it)."""
        reserve = self.reserve
        if reserve is None or not self._to_delete or passing_shortage(error, syncing=False) is not DISK_FULL:
            return False
        freed = reserve.release()
        if freed:
            log.warning(
                "the disk is full: the %d bytes of the disk reserve are released for the topic table "
                "snapshot, so that retention deletes %d segments (%d bytes)",
                freed,
                len(self._to_delete),
                sum(segment.size for segment in self._to_delete),
            )
        return bool(freed)

    def _report(self, callback: Callable[..., object], *args: object) -> None:
        """Run `callback(*args)` on the loop (at once when the task ran in the caller)."""
        if threading.current_thread() is not self._thread:
            callback(*args)
            return
        self._reports.append((callback, args))
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: close() applies what is left
                loop.call_soon_threadsafe(self.apply_reports)

    def apply_reports(self) -> None:
        """Apply what the thread finished (on the loop, or after `wait_idle`)."""
        reports = self._reports
        while reports:
            callback, args = reports.popleft()
            callback(*args)
