"""All logs of one broker: persistence rules, durability (group commit), pooled files, tail caches, limits.

One directory per topic under `<directory>/topics/` (see `topic_names`), the store's own files under
`<directory>/meta/` (see `layout`, which also moves an older directory into that layout at open). The store
is driven from one asyncio event loop: appends are buffered, each window's data is copied into the files
with one pwritev per segment, fsyncs run in a writer thread (see `group_commit`), and reads are preads on
the loop (or come straight from the tail caches for caught-up readers). Readers only ever get durable
records: `end_offset` of a log is its high watermark. In a cluster (`enable_replication`) it is the
committed end instead, moved by `commit` once the in-sync replicas hold the records, and saved to a
checkpoint (`hw_checkpoint`) so that a restart starts each log committed no further than it was; followers
copy their leader's frames (`append_frames`) and drop a diverging tail (`truncate`) through the same store.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from broker_edge.log_info import LogInfo
from broker_edge.observe import path_trace
from broker_edge.protocol.topics import topic_matches

from .commitlog import CommitLog, LogRecovery
from .config import StorageConfig
from .errors import StorageError, TooManyTopics, UnknownTopic
from .file_pool import FileHandlePool
from .fs_sync import syncfs_available
from .group_commit import GroupCommitter
from .hw_checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from .layout import layout_of, open_layout
from .persistence import PersistenceRules, check_filter
from .read_cache import ReadCache
from .record import AppendRecord, Record, RecordFields
from .segment import fsync_directory
from .tail_cache import TailCacheBudget
from .topic_names import is_hashed, topic_directory_name, topic_from_directory, write_topic_file

if TYPE_CHECKING:
    from .frame_runs import FrameRun

log = logging.getLogger(__name__)

CLEAN_SHUTDOWN_MARKER = "CLEAN_SHUTDOWN"
REPLICATED_SYNC_PIPELINE = 2
"""Group-commit jobs a replicated store lets be in flight at once (see `GroupCommitter.pipeline`)."""
INDEX_AT_CLOSE_MIN_BYTES = 1024 * 1024
"""At close, only active segments at least this large get their index written; smaller ones are rescanned
at open (cheaper than one index write and fsync per log when thousands of logs shut down)."""


@dataclass(slots=True)
class RecoveryReport:
    """What `LogStore.open` found: totals, plus the logs that needed repair."""

    clean_shutdown: bool = False
    """The previous run closed the store (otherwise it crashed or was killed, or this is a fresh start)."""
    fresh: bool = False
    """The directory held no logs and no clean-shutdown marker: a first start, nothing to recover."""
    logs: int = 0
    records: int = 0
    bytes_dropped: int = 0
    indexes_rebuilt: int = 0
    repaired: list[LogRecovery] = field(default_factory=list)
    """Logs whose tail was truncated or that have damaged segments or records."""
    skipped_directories: list[str] = field(default_factory=list)
    """Directories that are not logs (or whose topic name could not be recovered)."""


@dataclass(slots=True)
class RetentionReport:
    """What one `apply_retention` pass removed."""

    segments_deleted: int = 0
    bytes_deleted: int = 0


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


class LogStore:
    """The logs of one broker. Call `open()` first and `close()` at shutdown."""

    def __init__(self, directory: str | Path, config: StorageConfig | None = None) -> None:
        self.directory = str(directory)
        self.layout = layout_of(self.directory)
        """Where the topic logs (`layout.topics`) and the broker's own files (`layout.meta`) live."""
        self.config = config or StorageConfig()
        self.rules = PersistenceRules(self.config.persist)
        self._pool = FileHandlePool(self.config.max_open_files)
        self._cache_budget = TailCacheBudget(self.config.tail_cache_total_bytes)
        self._read_cache = ReadCache(self.config.read_cache_bytes)
        self._committer = GroupCommitter(
            self.config.durability,
            self.config.group_commit_ms,
            self.config.group_commit_max_bytes,
            self._pool,
            self._on_durable,
            inline_sync_max_bytes=self.config.inline_sync_max_bytes,
        )
        self._logs: dict[str, CommitLog] = {}
        self._created_by: dict[str, int] = {}
        self._topic_waiters: dict[str, list[_Waiter]] = {}
        self._pattern_waiters: list[_Waiter] = []
        self._directory_fd: int | None = None
        self._replicated = False
        self._checkpointed: dict[str, int] = {}
        self._checkpoint_timer: asyncio.TimerHandle | None = None
        self._checkpoint_lock = threading.Lock()
        self._checkpoints_taken = 0
        self._checkpoints_written = 0
        self._checkpoint_writing: asyncio.Future[None] | None = None
        self._syncfs_checked = False
        self._opened = False
        self._closed = False

    # -- lifecycle -----------------------------------------------------------------------------------

    def open(self) -> RecoveryReport:
        """Recover every log found in the directory (truncating torn tails, rebuilding unclean indexes)."""
        if self._opened:
            raise RuntimeError("store already open")
        self.layout = open_layout(self.directory)
        marker = self.layout.meta_file(CLEAN_SHUTDOWN_MARKER)
        report = RecoveryReport(clean_shutdown=os.path.exists(marker))
        with os.scandir(self.layout.topics) as entries:
            directories = sorted(entry.path for entry in entries if entry.is_dir())
        for path in directories:
            try:
                topic = topic_from_directory(path)
            except ValueError as error:
                log.error("skipping %s: %s", path, error)
                report.skipped_directories.append(path)
                continue
            recovery = self._make_log(topic, path).recovery
            report.logs += 1
            report.records += recovery.records
            report.bytes_dropped += recovery.bytes_dropped
            report.indexes_rebuilt += recovery.indexes_rebuilt
            if recovery.repaired:
                report.repaired.append(recovery)
        if report.clean_shutdown:
            os.unlink(marker)  # from now on a crash must not look like a clean shutdown
            fsync_directory(self.layout.meta)
        report.fresh = not report.clean_shutdown and not directories
        self._opened = True
        _log_opened(self.directory, report)
        return report

    def close(self) -> None:
        """Write and fsync everything, leave a clean-shutdown marker; pending `when_durable` calls fire."""
        if self._closed:
            return
        self._closed = True
        self._committer.close()
        if self._checkpoint_timer is not None:
            self._checkpoint_timer.cancel()
        self.checkpoint_committed()
        if self._directory_fd is not None:
            os.close(self._directory_fd)
            self._directory_fd = None
        for commit_log in self._logs.values():
            commit_log.close(write_index=commit_log.active_segment_bytes >= INDEX_AT_CLOSE_MIN_BYTES)
        self._pool.close()
        for waiters in [*self._topic_waiters.values(), self._pattern_waiters]:
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_result([])
        if self._opened and self._committer.failure is None:
            _write_marker(self.layout.meta_file(CLEAN_SHUTDOWN_MARKER))

    def __enter__(self) -> LogStore:
        if not self._opened:
            self.open()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------------------

    def should_persist(self, topic: str, qos: int) -> bool:
        """Whether a publish on `topic` with `qos` goes to the log (the persistence rules decide)."""
        return self.rules.should_persist(topic, qos)

    def append(self, topic: str, record: AppendRecord) -> int:
        """Append to `topic`'s log (created on first use) and return the offset; ack after `when_durable`."""
        return self.append_message(topic, *record.fields())

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
        commit_log = self._writable_log(topic, client_id)
        offset = commit_log.append_message(
            payload,
            qos,
            retain,
            client_id,
            user_properties,
            content_type,
            payload_format_indicator,
            timestamp_ms,
            message_expiry_interval,
            response_topic,
            correlation_data,
        )
        self._committer.appended(commit_log, commit_log.last_append_size)
        return offset

    def append_batch(self, topic: str, records: Sequence[RecordFields]) -> int:
        """Append `records` to `topic`'s log with one broker time; returns the first offset (record i gets
        it + i). All or nothing (see `CommitLog.append_batch`); a new log counts for the first record's
        client id."""
        commit_log = self._writable_log(topic, records[0][3] if records else "")
        offset = commit_log.append_batch(records)
        if records:
            self._committer.appended_many(commit_log, len(records), commit_log.last_append_size)
        return offset

    # -- replication -----------------------------------------------------------------------------------

    def enable_replication(self, checkpoint_interval_s: float = 5.0) -> None:
        """From now on readers see each log up to its committed end (`commit`), not its durable end.

        The logs found at open start committed up to the end the checkpoint saved for them (0 for a log it
        does not list); with no checkpoint at all (a store that was never replicated: everything in it was
        acknowledged alone) up to their durable end. The checkpoint is written at once, then every
        `checkpoint_interval_s` while an event loop runs (in a thread of its executor, so that the
        checkpoint's fsyncs do not hold up the loop), and at close."""
        if self._replicated:
            return
        if checkpoint_interval_s <= 0:
            raise ValueError(f"checkpoint_interval_s must be positive, got {checkpoint_interval_s}")
        saved = read_checkpoint(self.layout.meta_file(CHECKPOINT_FILE)) if self._opened else None
        self._replicated = True
        # A replicated record waits for the syncs of two stores in a row (the leader's, then a follower's):
        # its window is cut as soon as it ends, behind at most one job in flight, rather than after that job.
        self._committer.pipeline(REPLICATED_SYNC_PIPELINE)
        for topic, commit_log in self._logs.items():
            commit_log.set_replicated(True)
            if saved is not None:
                commit_log.restore_committed(saved.get(topic, 0))
        if self._opened:
            self.checkpoint_committed()
            self._schedule_checkpoints(checkpoint_interval_s)

    def checkpoint_committed(self) -> None:
        """Save every log's committed end (when one moved since the last checkpoint), before returning."""
        taken = self._take_checkpoint()
        if taken is not None:
            self._write_checkpoint(*taken)

    def _take_checkpoint(self) -> tuple[int, dict[str, int]] | None:
        """The committed ends to save now, numbered (None: nothing moved since the last checkpoint)."""
        if not self._replicated or not self._opened:
            return None
        committed = {topic: commit_log.end_offset for topic, commit_log in self._logs.items()}
        if committed == self._checkpointed and os.path.exists(self.layout.meta_file(CHECKPOINT_FILE)):
            return None
        self._checkpoints_taken += 1
        return self._checkpoints_taken, committed

    def _write_checkpoint(self, number: int, committed: dict[str, int]) -> None:
        """Write checkpoint `number` unless a later one is written already (any thread: the periodic one is
        written in a thread of the loop's executor, so that its fsyncs never hold up the loop; the others,
        at close or after a truncation, in the caller's). A later checkpoint is never replaced by an
        earlier one, whichever thread gets there first."""
        with self._checkpoint_lock:
            if number <= self._checkpoints_written:
                return
            if path_trace.ON:
                path_trace.mark("checkpoint", "", 0, 1)
            try:
                write_checkpoint(self.layout.meta_file(CHECKPOINT_FILE), committed)
            except OSError as error:
                log.error("cannot save the committed ends of the logs: %s", error)
                return
            if path_trace.ON:
                path_trace.mark("checkpointed", "", 0, 1)
            self._checkpoints_written = number
            self._checkpointed = committed

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
        commit_log = self._logs.get(topic)
        return commit_log.durable_end if commit_log is not None else 0

    def start_offset(self, topic: str) -> int:
        """Oldest offset `topic`'s log still stores (0 when it has no log)."""
        commit_log = self._logs.get(topic)
        return commit_log.start_offset if commit_log is not None else 0

    def committed_end(self, topic: str) -> int:
        """Offset after the last record readers of `topic` may see (0 when it has no log)."""
        commit_log = self._logs.get(topic)
        return commit_log.end_offset if commit_log is not None else 0

    def commit(self, topic: str, offset: int) -> int:
        """Let readers of `topic` see its records below `offset` (capped at the durable end): wakes the
        long-polls it satisfies. Returns the committed end."""
        commit_log = self._log(topic)
        before = commit_log.end_offset
        after = commit_log.commit(offset)
        if after > before:
            self._on_durable([(commit_log, before)])
        return after

    def append_frames(self, topic: str, frames: bytes) -> int:
        """Append a leader's frames verbatim to `topic`'s log (created on first use), through the group
        commit like any append; returns the first offset. See `CommitLog.append_frames` for the checks."""
        commit_log = self._writable_log(topic, "")
        before = commit_log.next_offset
        first = commit_log.append_frames(frames)
        if commit_log.next_offset > before:
            self._committer.appended_many(
                commit_log, commit_log.next_offset - before, commit_log.last_append_size
            )
        return first

    def read_frames(
        self, topic: str, offset: int, max_bytes: int, stop: int | None = None
    ) -> tuple[list[bytes], int]:
        """Stored frames of `topic` from `offset` up to its durable end (or `stop`): see
        `CommitLog.read_frames`."""
        return self._log(topic).read_frames(offset, max_bytes, stop)

    def truncate(self, topic: str, offset: int) -> None:
        """Drop the records of `topic` at and after `offset` (see `CommitLog.truncate`)."""
        commit_log = self._logs.get(topic)
        if commit_log is not None:
            committed = commit_log.end_offset
            commit_log.truncate(offset)
            if commit_log.end_offset < committed:  # (an unclean election) the checkpoint must not overstate
                self.checkpoint_committed()

    def restart_at(self, topic: str, offset: int) -> None:
        """Empty `topic`'s log (created if absent) and continue it at `offset`."""
        self._writable_log(topic, "").restart_at(offset)

    def log_directory(self, topic: str) -> str:
        """The directory of `topic`'s log (raises `UnknownTopic`)."""
        return self._log(topic).directory

    def _writable_log(self, topic: str, client_id: str) -> CommitLog:
        """`topic`'s log, created on first use (counted for `client_id`); raises once writing has failed."""
        commit_log = self._logs.get(topic)
        if commit_log is None:
            commit_log = self._create_log(topic)
            self._created_by[client_id] = self._created_by.get(client_id, 0) + 1
        if self._committer.failure is not None:
            raise self._committer.failure
        return commit_log

    def when_durable(
        self, callback: Callable[[], object], on_error: Callable[[BaseException], object] | None = None
    ) -> None:
        """Call `callback` on the event loop once everything appended before this call is durable.

        Durable means fsynced with `fsync` and `group`, and written to the OS with `none` (the callback
        fires after the next window's write). If writing fails, `on_error(StorageFailed)` is called instead.
        """
        self._committer.when_durable(callback, on_error)

    def end_window(self) -> None:
        """End the group-commit window now (see `GroupCommitter.end_window`): for a caller that appended a
        whole batch and waits for it, such as a replica applying its leader's push."""
        self._committer.end_window()

    async def wait_durable(self) -> None:
        """Make everything appended so far durable now (cuts the current window) and wait for it."""
        await self._committer.wait_durable()

    def flush(self) -> None:
        """Write (and fsync per policy) everything buffered, blocking the caller: for tools and tests."""
        self._committer.flush()

    @property
    def pending_bytes(self) -> int:
        """Bytes appended but not yet handed to the writer thread (a backpressure signal)."""
        return self._committer.pending_bytes

    @property
    def committer(self) -> GroupCommitter:
        """The durability driver (its counters say how many windows were written)."""
        return self._committer

    @property
    def tail_cache_budget(self) -> TailCacheBudget:
        """The bound on the memory all tail caches hold (``bytes`` of ``max_bytes`` held now)."""
        return self._cache_budget

    @property
    def file_pool(self) -> FileHandlePool:
        return self._pool

    @property
    def read_cache(self) -> ReadCache:
        """The blocks of older records shared by readers catching up (its counters say how it is used)."""
        return self._read_cache

    # -- reading -------------------------------------------------------------------------------------

    def read(
        self, topic: str, offset: int, max_records: int = 1000, max_bytes: int = 1024 * 1024
    ) -> list[Record]:
        """Durable records of `topic` from `offset` (see `CommitLog.read` for limits and errors)."""
        return self._log(topic).read(offset, max_records, max_bytes)

    def read_runs(
        self, topic: str, offset: int, max_records: int = 1000, max_bytes: int = 1024 * 1024
    ) -> list[FrameRun]:
        """The records `read` would return, as checked runs of frames (see `CommitLog.read_runs`)."""
        return self._log(topic).read_runs(offset, max_records, max_bytes)

    def offset_for_timestamp(self, topic: str, timestamp_ms: int) -> int:
        """First durable offset of `topic` appended at or after `timestamp_ms` (the end offset if none)."""
        return self._log(topic).offset_for_timestamp(timestamp_ms)

    def log_info(self, topic: str) -> LogInfo:
        """The state of one log (raises `UnknownTopic`)."""
        return _info(self._log(topic))

    def logs(self, pattern: str | None = None) -> list[LogInfo]:
        """Every log (or those whose topic matches the MQTT filter `pattern`), sorted by topic."""
        logs = self._logs
        if pattern is None:
            return [_info(logs[topic]) for topic in sorted(logs)]
        check_filter(pattern)
        return [_info(logs[topic]) for topic in sorted(_matching(logs, pattern))]

    def logs_created_by(self, client_id: str) -> int:
        """Logs created by appends of `client_id` since the store was opened (for per-client topic limits;
        a client's identity outlives its connections and sessions)."""
        return self._created_by.get(client_id, 0)

    def topics(self) -> list[str]:
        """The topics that have a log, unsorted (cheaper than `logs()` for a pass over all of them)."""
        return list(self._logs)

    def __contains__(self, topic: object) -> bool:
        return topic in self._logs

    def __len__(self) -> int:
        return len(self._logs)

    async def wait_for_data(
        self, positions: Mapping[str, int], timeout_s: float, pattern: str | None = None
    ) -> list[str]:
        """Long-poll: wait until a topic in `positions` has a durable record at or after its offset.

        With `pattern`, also wake when a log matching it that is not in `positions` gets its first record
        (a new topic appeared). Returns the topics that woke the call ([] on timeout). Topics without a log
        yet may be waited on too.
        """
        ready = [
            topic
            for topic, offset in positions.items()
            if (commit_log := self._logs.get(topic)) is not None and commit_log.end_offset > offset
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

    # -- retention -----------------------------------------------------------------------------------

    def apply_retention(self, now_ms: int | None = None) -> RetentionReport:
        """Delete whole segments past each log's age and size limits (call periodically)."""
        report = RetentionReport()
        for commit_log in self._logs.values():
            result = commit_log.apply_retention(now_ms)
            report.segments_deleted += result.segments_deleted
            report.bytes_deleted += result.bytes_deleted
        return report

    # -- internals -----------------------------------------------------------------------------------

    def _use_syncfs(self) -> None:
        """Let the writer make windows durable with syncfs where it reaches the store's filesystem (asked
        when the first log opens: a store without logs has nothing to sync, and opens without ctypes)."""
        self._syncfs_checked = True
        minimum = self.config.syncfs_min_segments
        if minimum > 0 and self.config.durability != "none" and syncfs_available(self.directory):
            self._directory_fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._committer.use_syncfs(self._directory_fd, minimum)

    def _log(self, topic: str) -> CommitLog:
        commit_log = self._logs.get(topic)
        if commit_log is None:
            raise UnknownTopic(topic)
        return commit_log

    def _create_log(self, topic: str) -> CommitLog:
        if not self._opened or self._closed:
            raise StorageError("the store is not open")
        if len(self._logs) >= self.config.max_topics:
            raise TooManyTopics(topic, self.config.max_topics)
        name = topic_directory_name(topic)
        path = os.path.join(self.layout.topics, name)
        try:
            commit_log = self._make_log(topic, path)
            if is_hashed(name):
                write_topic_file(path, topic)
        except OSError as error:
            self._logs.pop(topic, None)
            raise StorageError(f"cannot create the log of {topic!r}: {error}") from error
        return commit_log

    def _make_log(self, topic: str, path: str) -> CommitLog:
        config = self.config.log_config(self.rules.rule_for(topic))
        commit_log = CommitLog(
            topic,
            path,
            config,
            pool=self._pool,
            cache_budget=self._cache_budget,
            read_cache=self._read_cache,
        )
        if self._replicated:
            commit_log.set_replicated(True)
        self._logs[topic] = commit_log
        if not self._syncfs_checked:
            self._use_syncfs()
        return commit_log

    def _on_durable(self, advanced: list[tuple[CommitLog, int]]) -> None:
        topic_waiters = self._topic_waiters
        pattern_waiters = self._pattern_waiters
        if not topic_waiters and not pattern_waiters:
            return
        for commit_log, end_before in advanced:
            topic = commit_log.topic
            for waiter in topic_waiters.get(topic, ()):
                if commit_log.end_offset > waiter.positions[topic]:
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


def _matching(topics: dict[str, CommitLog], pattern: str) -> list[str]:
    """The topics the MQTT filter `pattern` matches, unsorted. A filter without wildcards is one lookup (a
    device subscribing to its own topic from an offset); otherwise a topic is matched level by level only
    when it has the filter's literal start and end, which a string test rules out for most of them."""
    if "+" not in pattern and "#" not in pattern:
        return [pattern] if pattern in topics else []
    first = min(index for index in (pattern.find("+"), pattern.find("#")) if index >= 0)
    prefix = pattern[:first].rstrip("/")  # `a/#` matches `a` too
    suffix = "" if "#" in pattern else pattern[pattern.rfind("+") + 1 :]
    return [
        topic
        for topic in topics
        if topic.startswith(prefix) and topic.endswith(suffix) and topic_matches(pattern, topic)
    ]


def _log_opened(directory: str, report: RecoveryReport) -> None:
    """One line on what opening found: a fresh start, a clean restart, or a recovery with its counts."""
    if report.fresh:
        log.info("opened a new store in %s (no logs yet)", directory)
        return
    level = logging.WARNING if report.repaired else logging.INFO
    log.log(
        level,
        "opened %d logs (%d records) in %s after a%s shutdown; %d repaired, %d bytes dropped, "
        "%d indexes rebuilt",
        report.logs,
        report.records,
        directory,
        " clean" if report.clean_shutdown else "n unclean",
        len(report.repaired),
        report.bytes_dropped,
        report.indexes_rebuilt,
    )


def _write_marker(path: str) -> None:
    with open(path, "wb") as file:
        os.fsync(file.fileno())
    fsync_directory(os.path.dirname(path))


def _info(commit_log: CommitLog) -> LogInfo:
    return LogInfo(
        commit_log.topic,
        commit_log.start_offset,
        commit_log.end_offset,
        commit_log.size_bytes,
        commit_log.last_append_ms,
    )
