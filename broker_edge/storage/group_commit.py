"""The durability driver of a store: cuts appends into jobs, writes them, and syncs them in one thread.

Policies (`StorageConfig.durability`):

* `group`: the first append of a window opens it; the window ends when the event loop has run the
  callbacks ready at that moment (`group_commit_ms` 0, the default: every append handled in the same loop
  iteration joins it) or after `group_commit_ms`; then everything appended so far becomes one job. While
  a job is being synced, the loop keeps accepting appends into the next window; a window that ends
  meanwhile is cut as soon as that job completes, so the batch grows with the fsync latency instead of
  queueing, and an idle broker acknowledges after one fsync, not after a timer. With
  `group_commit_min_interval_ms`, a window that ends sooner than that after the last job's start waits out
  the rest (fewer, larger jobs under load); one that ends later is cut at once. `group_commit_max_bytes`
  cuts a window early, also while a job is in flight (the new job queues behind it), so a job, and the
  memory appends hold before their write, stay bounded. A replicated store (a cluster's, whose records
  wait for the leader's sync and then a follower's) lets two jobs be in flight (`pipeline`): a window that
  ends while one job syncs is cut at once and queues behind it, so the writer thread starts its sync as
  soon as the first is done instead of after a round trip through the loop; a broker alone keeps one.
* `fsync`: every append is its own job.
* `none`: like `group` but without fsync: durable means "written to the OS" (the page cache).

Cutting a job copies its data into the files right away, on the loop: one pwritev per dirty segment into
the page cache, microseconds, and no thread hop per file (a writer thread doing thousands of small
writes would wait for the GIL after each one while the loop is busy). The blocking part runs in one
writer thread, in order: the fdatasyncs of the dirty segments, issued all at once when there are a few
(the filesystem joins concurrent syncs into one journal commit, so a window costs about one sync, not
one per topic), or one syncfs(2) when the job touches many segments (see `fs_sync`), plus seals and new
directories. The thread drains everything queued and wakes the loop once per batch. With `none` there
is nothing to wait for: a job without seals completes on the loop right after its write.

With `inline_sync_max_bytes` set (off by default), a small job (one segment, no seal, no new directory,
at most that many bytes) cut while no job is in flight is fdatasynced on the loop instead, and completes
there at once: the loop blocks for one short fdatasync rather than handing the job to the writer and
waiting to be woken back, two thread switches that each may wait for the GIL. Nothing completes before
its fdatasync either way; larger jobs, or jobs overlapping one in flight, go to the writer thread.

Without a running event loop (scripts, tools) appends stay buffered until `flush()`, except `fsync`,
which syncs inline. A failed write or fsync is fatal: the store refuses
further appends (`StorageFailed`) and reports the error to waiting `when_durable` callers, since after a
failed fsync the kernel may have dropped the data.

Except a *passing shortage* (`shortage`, its `cause` one of `errors.SHORTAGE_CAUSES`), which is not a
failure: the process out of descriptors (EMFILE, ENFILE) once the pool's own retries are spent, or the
filesystem out of space (ENOSPC, EDQUOT) on a write. Every `when_durable` caller waiting then is told
`StorageShortage` at once (the broker refuses those publishes rather than leave every client waiting), and
the store refuses new appends while it lasts. What was appended stays the log's: the job that met it goes
to the writer thread, which retries it with a growing pause (`shortage_wait`) until it passes, and the jobs
after it follow in order, so the log keeps no hole and a publish refused this way may still be in it (at
least once: a client that sends it again makes a duplicate, never a loss). Appends are taken again as
soon as that job is durable, without a restart. Logged once per `SHORTAGE_LOG_S` while it lasts, and once
when it ends.

What is safe to retry is decided by where the error came from (`errors.passing_shortage`):

* a failed open (EMFILE, ENFILE): nothing was written or synced;
* ENOSPC or EDQUOT from a write (pwritev at the write's fixed position): the bytes did not all reach the
  page cache, and a write that passed stays done (`FileWrite.write` drops its data only once it passed),
  so writing the rest again, each failed write whole at its same position, is idempotent;
* never an error from fdatasync, fsync or syncfs, ENOSPC included: the kernel may have dropped the dirty
  pages it could not write back and marked them clean, so a later sync that passes would not write them.
  Those stay fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from broker_edge.observe import path_trace
from broker_edge.observe.histogram import COMMIT_SECONDS, Histogram
from broker_edge.observe.refusal_log import LogSummary

from .config import Durability
from .errors import ShortageCause, StorageFailed, StorageShortage, passing_shortage
from .file_pool import FileHandlePool
from .fs_sync import sync_filesystem
from .segment import FileWrite
from .shortage_wait import ShortageWait

log = logging.getLogger(__name__)


class Pending(Protocol):
    """What a write source buffered since its last take: its file writes, in order, and their bytes."""

    writes: list[FileWrite]
    bytes: int


class WriteSource(Protocol):
    """A part of the store that buffers appends (a partition log, the topic catalog)."""

    def take_pending(self) -> Any: ...

    def complete(self, pending: Any, synced: bool) -> list[tuple[int, int]]: ...

    def trace(self, pending: Any) -> list[tuple[str, int, int]]: ...


Job = list[tuple[WriteSource, Pending]]
DurableHook = Callable[[list[tuple[int, int]], Job], None]
"""Called after every completed job with (topic id, readable end before) for every topic that just became
readable further, and the job itself."""
Callback = Callable[[], object]
ErrorCallback = Callable[[BaseException], object]


SHORTAGE_LOG_S = 10.0
"""At most one line per this many seconds while a shortage lasts."""

PARALLEL_SYNCS = 8
"""Most fdatasyncs of one job issued at the same time (the rest queue behind them)."""


@dataclass(slots=True)
class SyncPlan:
    """How a job is made durable: fdatasyncs of its segments at once, or one syncfs when it touches many."""

    sync: bool
    """False with the `none` policy: write only."""
    syncfs_fd: int | None = None
    """A descriptor on the store's filesystem, when syncfs may be used."""
    syncfs_min_segments: int = 0
    """Files a job must touch for one syncfs to replace their fdatasyncs."""
    syncfs_calls: int = 0
    parallel_syncs: int = 0
    """Jobs whose segments were fdatasynced concurrently."""
    _executor: ThreadPoolExecutor | None = None

    def sync_all(self, pool: FileHandlePool, paths: list[str]) -> None:
        """fdatasync `paths` concurrently (raises the first failure once all are done)."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(PARALLEL_SYNCS, thread_name_prefix="timestone-log-sync")
        for _ in self._executor.map(pool.fdatasync, paths):
            pass
        self.parallel_syncs += 1

    def shutdown(self) -> None:
        if self._executor is not None:
            self._executor.shutdown()
            self._executor = None


def write_job(job: Job, pool: FileHandlePool) -> None:
    """Copy a job's data into its files (the page cache), one pwritev per file (on the loop)."""
    for _source, pending in job:
        for write in pending.writes:
            write.write(pool)


def sync_job(job: Job, pool: FileHandlePool, plan: SyncPlan) -> None:
    """Make a written job durable per `plan`: fdatasyncs, or one syncfs (in the writer thread)."""
    writes = [write for _source, pending in job for write in pending.writes]
    if not plan.sync:
        for write in writes:
            if write.always_sync:
                write.make_durable(pool, True)
        return
    paths = list(dict.fromkeys(write.path for write in writes))
    if plan.syncfs_fd is not None and len(paths) >= plan.syncfs_min_segments:  # files, not writes
        sync_filesystem(plan.syncfs_fd)
        plan.syncfs_calls += 1
    else:
        if len(paths) > 1:
            plan.sync_all(pool, paths)
        for number, write in enumerate(writes):
            write.make_durable(pool, True, data_synced=len(paths) > 1 or number > 0)
    for path in dict.fromkeys(write.path for write in writes if write.holds_records):
        pool.check_linked(path)  # not acknowledged into a file deleted under the store (an fstat each)


@dataclass(slots=True, eq=False)
class _Flight:
    """A job handed to the writer thread; `done` once written, `handled` once its completion was processed."""

    job: Job
    upto: int
    loop: asyncio.AbstractEventLoop | None
    error: BaseException | None = None
    done: bool = False
    handled: bool = False
    unwritten: bool = False
    """Its writes did not all reach the files on the loop (the writer thread writes them first)."""
    short: ShortageCause | None = None
    """The shortage it met (it is retried until it passes)."""
    started: float = 0.0
    """When the job was cut (`time.monotonic`), for `GroupCommitter.commit_seconds`."""
    cut_ns: int = 0
    """When the job was cut and its sync done (`time.monotonic_ns`), noted only with `path_trace.ON`."""
    synced_ns: int = 0


@dataclass(slots=True, eq=False)
class _Barrier:
    """Set by the writer thread once every job queued before it is done."""

    passed: threading.Event = field(default_factory=threading.Event)


_STOP = object()


class _WriterThread:
    """One thread running jobs in order; finished jobs are reported to their loop in one call per batch."""

    def __init__(
        self,
        pool: FileHandlePool,
        plan: SyncPlan,
        on_done: Callable[[list[_Flight]], None],
        on_short: Callable[[ShortageCause, OSError], None],
    ) -> None:
        self._pool = pool
        self._plan = plan
        self._on_done = on_done
        self._on_short = on_short
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.closing = False
        """Set by a closing store: a job meeting a shortage is retried for its ``closing_patience_s`` more."""

    def submit(self, item: _Flight | _Barrier) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="timestone-log-writer", daemon=True)
            self._thread.start()
        self._queue.put(item)

    def wait_idle(self) -> None:
        """Block until every job submitted so far is done."""
        if self._thread is not None:
            barrier = _Barrier()
            self._queue.put(barrier)
            barrier.passed.wait()

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get())
            finished: list[_Flight] = []
            for item in batch:
                if isinstance(item, _Flight):
                    self._run_flight(item)
                    if path_trace.ON:
                        item.synced_ns = time.monotonic_ns()
                    item.done = True
                    finished.append(item)
                elif isinstance(item, _Barrier):
                    item.passed.set()
            self._report(finished)
            if _STOP in batch:
                return

    def _run_flight(self, flight: _Flight) -> None:
        """Write (if the loop could not) and sync ``flight``'s job; a passing shortage is waited out with
        growing pauses (the loop is told once per cause), any other error is the flight's."""
        wait = ShortageWait()
        while True:
            syncing = False
            try:
                if flight.unwritten:
                    write_job(flight.job, self._pool)
                    flight.unwritten = False
                syncing = True
                sync_job(flight.job, self._pool, self._plan)
                return
            except BaseException as error:
                cause = passing_shortage(error, syncing=syncing)
                if cause is None or wait.gives_up(cause):
                    flight.error = error
                    return
                assert isinstance(error, OSError)
                if flight.short is not cause:
                    flight.short = cause
                    if flight.loop is not None:
                        with contextlib.suppress(RuntimeError):
                            flight.loop.call_soon_threadsafe(self._on_short, cause, error)
            wait.pause(self.closing)

    def _report(self, finished: list[_Flight]) -> None:
        loop = finished[-1].loop if finished else None
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # a closed loop: flush() or close() processes them
                loop.call_soon_threadsafe(self._on_done, finished)


class GroupCommitter:
    """Turns appends into ordered write jobs per the durability policy and reports their completion."""

    def __init__(
        self,
        policy: Durability,
        window_ms: float,
        max_pending_bytes: int,
        pool: FileHandlePool,
        on_durable: DurableHook,
        inline_sync_max_bytes: int = 0,
        min_interval_ms: float = 0.0,
    ) -> None:
        if policy not in ("fsync", "group", "none"):
            raise ValueError(f"unknown durability policy {policy!r}")
        self.policy = policy
        self._per_append = policy == "fsync"
        self._sync = policy != "none"
        self._window_s = window_ms / 1000
        self._min_interval_s = min_interval_ms / 1000
        self._last_cut = float("-inf")  # (time.monotonic) when the last job was cut
        self._max_pending_bytes = max_pending_bytes
        self._inline_sync_max_bytes = inline_sync_max_bytes if policy == "group" else 0
        self._pool = pool
        self._on_durable = on_durable
        self.sync_plan = SyncPlan(self._sync)
        self._writer = _WriterThread(pool, self.sync_plan, self._finished, self._short)
        self._dirty: dict[WriteSource, None] = {}
        self._pending_bytes = 0
        self._appended = 0
        self._durable = 0
        self._callbacks: deque[tuple[int, Callback, ErrorCallback | None]] = deque()
        self._flights: deque[_Flight] = deque()
        self._timer: asyncio.Handle | None = None
        self._window_over = False
        self._max_flights = 1
        self.failure: StorageFailed | None = None
        self.shortage: StorageShortage | None = None
        """Set while a job waits out a passing shortage (its ``cause``): appends are refused meanwhile."""
        self.shortages: Counter[str] = Counter()
        """Shortages ridden out (or being) since the start, by their cause's ``reason``."""
        self._shortage_log = LogSummary(log, SHORTAGE_LOG_S)
        self.jobs_completed = 0
        """Jobs written so far (with `group`, the number of windows)."""
        self.inline_syncs = 0
        """Jobs fdatasynced on the loop (see the module's docstring)."""
        self.bytes_written = 0
        self.commit_seconds = Histogram(COMMIT_SECONDS)
        """Each job's seconds from its cut to its completion on the loop (write, sync and the hand-offs:
        what its appends waited for after their window), in the broker's ``log_commit_seconds``."""

    @property
    def pending_bytes(self) -> int:
        """Bytes appended and not yet handed to the writer (a backpressure signal for the broker)."""
        return self._pending_bytes

    def use_syncfs(self, fd: int, min_segments: int) -> None:
        """Sync jobs touching at least `min_segments` segments with one syncfs on `fd`'s filesystem."""
        self.sync_plan.syncfs_fd = fd
        self.sync_plan.syncfs_min_segments = min_segments

    def pipeline(self, depth: int) -> None:
        """Let a window that ends while fewer than `depth` jobs are in flight be cut at once and queue behind
        them, instead of waiting for the job in flight to complete (1, the default: wait). The writer thread
        then starts the next job's sync as soon as the previous one is done, without a round trip through
        the loop in between."""
        if depth < 1:
            raise ValueError(f"pipeline depth must be at least 1, got {depth}")
        self._max_flights = depth

    def short_of(self, cause: ShortageCause) -> bool:
        """Whether appends are refused now for a shortage of ``cause``."""
        return self.shortage is not None and self.shortage.cause is cause

    @property
    def in_flight(self) -> int:
        """Jobs handed to the writer thread and not yet completed."""
        return len(self._flights)

    def appended(self, source: WriteSource, size: int) -> None:
        """Note one append of `size` bytes buffered by `source` (a partition log, the catalog)."""
        self._dirty[source] = None
        self._appended += 1
        self._pending_bytes += size
        if self._per_append:
            self._cut()
        elif self._timer is None and not self._window_over:
            self._start_window()
        elif self._pending_bytes >= self._max_pending_bytes:
            self._cut()

    def appended_many(self, source: WriteSource, count: int, size: int) -> None:
        """Note `count` appends of `size` bytes in all buffered by `source`."""
        self._appended += count - 1
        self.appended(source, size)

    def touched(self, source: WriteSource) -> None:
        """`source` buffered something to write with the next job (a new topic's catalog entry)."""
        self._dirty[source] = None

    def write_touched(self) -> None:
        """Write what `touched` sources buffered though nothing was appended (a segment rolled by age): cut
        a job now, or once the job in flight completes; without a running loop, the next `flush` does."""
        if not self._dirty or self.failure is not None or _running_loop() is None:
            return
        if len(self._flights) >= self._max_flights:
            self._window_over = True
        else:
            self._cut()

    def when_durable(self, callback: Callback, on_error: ErrorCallback | None = None) -> None:
        """Call `callback` on the loop once everything appended before this call is durable."""
        refusal = self.failure or self.shortage
        if refusal is not None:
            if on_error is not None:
                _call_soon(partial(on_error, refusal))
            return
        if self._appended <= self._durable:
            _call_soon(callback)
            return
        self._callbacks.append((self._appended, callback, on_error))

    async def wait_durable(self) -> None:
        """End the current window now (`end_window`) and wait until everything appended so far is durable."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def succeed() -> None:
            if not done.done():
                done.set_result(None)

        def fail(error: BaseException) -> None:
            if not done.done():
                done.set_exception(error)

        self.when_durable(succeed, fail)
        self.end_window()
        await done

    def end_window(self) -> None:
        """End the current window now rather than with the loop iteration (the caller appended a whole
        batch): cut it at once when no job is in flight, else as soon as that job completes. A job synced on
        the loop completes before this returns, so call it where `when_durable` callbacks may run."""
        if not self._dirty or self._per_append or self.failure is not None:
            return
        if len(self._flights) >= self._max_flights:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._window_over = True
            return
        if _running_loop() is not None:
            self._cut(complete_now=True)

    def flush(self) -> None:
        """Write everything buffered in the calling thread, after any job in flight (tools, shutdown)."""
        self._writer.wait_idle()
        self._finished(list(self._flights))
        if self.failure is not None:
            raise self.failure
        job, upto = self._take_job()
        if job:
            try:
                write_job(job, self._pool)
                sync_job(job, self._pool, self.sync_plan)
            except OSError as error:
                raise self._fail(error) from error
        self._complete(job, upto)

    def close(self) -> None:
        """Flush and stop the writer thread; pending callbacks fire (everything is durable after close)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._writer.closing = True
        try:
            if self.failure is None:
                self.flush()
        finally:
            self._writer.stop()
            self.sync_plan.shutdown()

    # -- internals -----------------------------------------------------------------------------------

    def _start_window(self) -> None:
        loop = _running_loop()
        if loop is not None:
            wait = max(self._window_s, self._last_cut + self._min_interval_s - time.monotonic())
            if wait > 0:
                self._timer = loop.call_later(wait, self._window_ended)
            else:
                self._timer = loop.call_soon(self._window_ended)

    def _window_ended(self) -> None:
        self._timer = None
        if len(self._flights) >= self._max_flights:
            self._window_over = True
        else:
            self._cut(complete_now=True)

    def _take_job(self) -> tuple[Job, int]:
        job: Job = []
        for source in self._dirty:
            pending = source.take_pending()
            if pending is not None:
                job.append((source, pending))
        self._dirty = {}
        self._pending_bytes = 0
        self._window_over = False
        return job, self._appended

    def _cut(self, complete_now: bool = False) -> None:
        """Write the pending appends as one job and hand it on; `complete_now`: the caller is a loop
        callback of this committer, where a job synced on the loop may complete synchronously."""
        if self.failure is not None:
            return
        loop = _running_loop()
        if loop is None:
            if self._per_append:
                self.flush()
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        job, upto = self._take_job()
        flight = _Flight(job, upto, loop, started=time.monotonic())
        self._last_cut = flight.started
        try:
            write_job(job, self._pool)
        except OSError as error:
            cause = passing_shortage(error, syncing=False)
            if cause is None:
                self._fail(error)
                return
            flight.unwritten = True
            self._retry_in_writer(flight, cause, error)
            return
        if path_trace.ON:
            flight.cut_ns = time.monotonic_ns()
        always = any(write.always_sync for _source, pending in job for write in pending.writes)
        if not self._sync and not always and all(earlier.done for earlier in self._flights):
            flight.done = True  # `none`: the write to the OS was the whole job
            self._flights.append(flight)
            loop.call_soon(self._finished, [flight])
            return
        if not self._flights and self._syncs_inline(job):
            try:
                sync_job(job, self._pool, self.sync_plan)
            except OSError as error:
                cause = passing_shortage(error, syncing=True)
                if cause is None:
                    self._fail(error)
                    return
                self._retry_in_writer(flight, cause, error)
                return
            self.inline_syncs += 1
            if path_trace.ON:
                flight.synced_ns = time.monotonic_ns()
            flight.done = True
            self._flights.append(flight)
            if complete_now:
                self._finished([flight])
            else:
                loop.call_soon(self._finished, [flight])
            return
        self._flights.append(flight)
        self._writer.submit(flight)

    def _retry_in_writer(self, flight: _Flight, cause: ShortageCause, error: OSError) -> None:
        """The loop met a passing shortage with ``flight``'s job: the writer thread retries it until it
        passes."""
        flight.short = cause
        self._short(cause, error)
        self._flights.append(flight)
        self._writer.submit(flight)

    def _short(self, cause: ShortageCause, error: OSError) -> None:
        """A job met a passing shortage (told on the loop): its waiting callers are told, appends are
        refused until it is durable."""
        shortage = self.shortage
        if shortage is None or shortage.cause is not cause:
            self.shortages[cause.reason] += 1
            shortage = self.shortage = StorageShortage(cause, error.strerror or str(error))
        self._fail_callbacks(shortage)
        self._shortage_log.log(
            logging.WARNING,
            cause.reason,
            "%s writing the log (%s): refusing appends and retrying what it holds (%s)",
            cause.lacking,
            error.strerror,
            cause.remedy,
        )

    def _shortage_over(self) -> None:
        """Every job that met the shortage is durable: take appends again."""
        shortage = self.shortage
        if shortage is not None and not any(flight.short for flight in self._flights):
            self.shortage = None
            log.warning("%s: the log is written, appends are taken again", shortage.cause.back)

    def _syncs_inline(self, job: Job) -> bool:
        """Whether `job` is small enough to be fdatasynced on the loop (the writer being idle)."""
        limit = self._inline_sync_max_bytes
        if not limit or len(job) != 1:
            return False
        _source, pending = job[0]
        if pending.bytes > limit or len(pending.writes) != 1:
            return False
        return not pending.writes[0].directories_to_sync

    def _finished(self, flights: list[_Flight]) -> None:
        """Process completions in order (on the loop, or in `flush` after the writer went idle)."""
        for flight in flights:
            if flight.handled or not flight.done:
                continue
            while self._flights and not flight.handled:
                earlier = self._flights.popleft()
                earlier.handled = True
                if earlier.error is not None:
                    self._fail(earlier.error)
                elif self.failure is None:
                    self._complete(earlier.job, earlier.upto, earlier)
                    if earlier.short is not None:
                        self._shortage_over()
        if self._dirty and len(self._flights) < self._max_flights and self.failure is None:
            if self._window_over or self._pending_bytes >= self._max_pending_bytes:
                self._cut(complete_now=True)
            elif self._timer is None and not self._per_append:
                self._start_window()

    def _complete(self, job: Job, upto: int, flight: _Flight | None = None) -> None:
        advanced: list[tuple[int, int]] = []
        for source, pending in job:
            advanced += source.complete(pending, self._sync)
            self.bytes_written += pending.bytes
            if path_trace.ON and flight is not None and flight.cut_ns:
                for topic, before, end in source.trace(pending):
                    path_trace.mark_at("cut", topic, before, end, flight.cut_ns)
                    path_trace.mark_at("synced", topic, before, end, flight.synced_ns or flight.cut_ns)
                    path_trace.mark("durable", topic, before, end)
        if job:
            self.jobs_completed += 1
            if flight is not None:
                self.commit_seconds.observe(time.monotonic() - flight.started)
        self._durable = max(self._durable, upto)
        self._on_durable(advanced, job)
        callbacks = self._callbacks
        while callbacks and callbacks[0][0] <= self._durable:
            _, callback, _ = callbacks.popleft()
            try:
                callback()
            except Exception:
                log.exception("when_durable callback failed")

    def _fail(self, error: BaseException) -> StorageFailed:
        """Refuse appends from now on and fail every waiting callback; returns the failure."""
        failure = self.failure
        if failure is None:
            log.error("log write failed, refusing further appends: %s", error)
            failure = self.failure = StorageFailed(f"log write failed: {error}")
            failure.__cause__ = error
        self._fail_callbacks(failure)
        return failure

    def _fail_callbacks(self, error: StorageFailed | StorageShortage) -> None:
        """Tell every waiting `when_durable` caller ``error`` instead."""
        callbacks, self._callbacks = self._callbacks, deque()
        for _, _, on_error in callbacks:
            if on_error is not None:
                try:
                    on_error(error)
                except Exception:
                    log.exception("when_durable error callback failed")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _call_soon(callback: Callback) -> None:
    loop = _running_loop()
    if loop is None:
        callback()
    else:
        loop.call_soon(callback)
