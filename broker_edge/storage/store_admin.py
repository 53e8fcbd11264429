"""The store's retention and administration: retention passes, each log's retention rule, the logs set aside
at open, and the import of records as they are (the upgrade of an older layout).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .clock import ClockJumps
from .config import LogConfig
from .errors import (
    StorageError,
)
from .partition_log import PartitionLog
from .quarantine import QuarantinedLog
from .record import PREFIX
from .removed_account import removed_positions
from .retention import RetentionReport, retention_pass
from .segment import Segment
from .store_state import StoreState, _check_offset

if TYPE_CHECKING:
    pass

log = logging.getLogger("broker_edge.storage.store")

__all__ = ["Admin"]


class Admin(StoreState):
    """Retention and the administration of logs (see the module docstring)."""

    def quarantined(self) -> list[QuarantinedLog]:
        """The logs set aside at open, neither read nor written (`quarantine`)."""
        return list(self._quarantined.values())

    @property
    def partition_logs(self) -> list[PartitionLog]:
        return self._partitions

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
        jumps = self._clock_jumps
        if now_ms is None:
            now_ms = self._clock.wall_ms()
            if jumps is not None:
                self._watch_clock(jumps, now_ms)
        self._roll_old_segments(now_ms)
        size_limits = self.config.retention_bytes is not None or any(
            rule.retention_bytes is not None for rule in self.rules.rules
        )
        report = RetentionReport()
        deleting: list[tuple[PartitionLog, list[Segment]]] = []
        for report in retention_pass(
            self._partitions,
            self._table,
            self._log_config,
            now_ms,
            lambda part, segments: deleting.append((part, segments)),
            size_limits,
            self._shortest_age(),
            jumps,
        ):
            yield report
            while deleting:
                yield from self._delete_accounted(*deleting.pop(0), report)
        if jumps is not None and jumps.jumps:
            jumps.forget_before([part.segments[0].number if part.segments else part.next_number
                                 for part in self._partitions])  # fmt: skip
        if report.topics_moved:
            self._read_cache.drop_below(self._table.start.__getitem__)
        sealer = self._sealer
        if sealer is not None:
            sealer.retry_held_seals()  # seals a full disk held: segments retention may delete next time
            if not report.segments_deleted and (report.topics_moved or sealer.deletions_waiting):
                # the moved starts are saved now, not at the next snapshot; segments given up on a full
                # disk are tried again
                sealer.delete_after_snapshot([])
        if report.segments_deleted:
            log.info(
                "retention deleted %d segments (%d bytes)", report.segments_deleted, report.bytes_deleted
            )

    def _watch_clock(self, jumps: ClockJumps, now_ms: int) -> None:
        """Keep a jump of the wall clock since the last pass (`clock`): records from before it are aged by
        the time that passed. Back, the active segments are rolled first, so that no segment holds records
        stamped on both sides of it, and the topics' index times (a running maximum) start again from the
        corrected clock, so that the records after it are aged by their own times."""
        step, passed = jumps.step(now_ms)
        if not step:
            return
        ends = [part.next_number for part in self._partitions]
        if step < 0:
            if self._committer.failure is None and self._committer.shortage is None:
                self._roll_partitions(lambda part: part.roll_now())
                index_ms = self._table.index_ms
                for topic_id, stamp in enumerate(index_ms):
                    if stamp > now_ms:
                        index_ms[topic_id] = now_ms
            # an active segment (not rolled: it goes on taking records) is left out: kept late, never early
            ends = [part.active.number if part.active else part.next_number for part in self._partitions]
        jumps.record(now_ms, step, passed, ends)
        for part in self._partitions:
            for segment in part.segments:
                segment.oldest_group_ms = None  # their records' ages changed: judged again

    def _shortest_age(self) -> int | None:
        """The shortest `retention_ms` a log is kept under (None: no log has an age bound)."""
        ages = [self.config.log_config(rule).retention_ms for rule in self.rules.rules]
        finite = [age for age in (*ages, self.config.retention_ms) if age is not None]
        return min(finite) if finite else None

    def _roll_old_segments(self, now_ms: int) -> None:
        """Roll each partition whose active segment is `segment_ms` old though no append came to roll it;
        once written and sealed, a later pass judges its records."""
        committer = self._committer
        if committer.failure is not None or committer.shortage is not None:
            return
        self._roll_partitions(lambda part: part.roll_if_old(now_ms))

    def _roll_partitions(self, roll: Callable[[PartitionLog], bool]) -> None:
        """`roll` each partition (whether it rolled), then write the new segments of those that did."""
        committer = self._committer
        rolled = False
        for part in self._partitions:
            if roll(part):
                committer.touched(part)
                rolled = True
        if rolled:
            committer.write_touched()

    def _delete_segments(self, part: PartitionLog, segments: list[Segment]) -> None:
        for segment in segments:
            part.next_base = max(part.next_base, segment.base + segment.row_count)
            part.segments.remove(segment)
            del part.by_number[segment.number]
            self._recent.forget((part.number, segment.number))
        assert self._sealer is not None
        self._sealer.delete_after_snapshot(segments)

    def _delete_accounted(
        self, part: PartitionLog, segments: list[Segment], report: RetentionReport
    ) -> Iterator[RetentionReport]:
        """Record what the topics of `segments` lose with them (``removed_account``), durably, a slice of
        groups at a time (yielding `report` between), then delete them; when the account cannot be written,
        keep them (a later pass deletes them once it is)."""
        account = self._removed
        assert account is not None
        removed: list[tuple[int, int]] = []
        unknown: list[tuple[int, int]] = []  # a segment whose records cannot be placed: no account below
        for segment in segments:
            try:
                removed += yield from removed_positions(part, segment, report)
            except OSError:
                unknown.append((part.number, segment.base + segment.row_count))
        try:
            account.record(removed, unknown, [(part.number, segment.number) for segment in segments])
        except OSError as error:
            log.error(
                "retention keeps %d segments of partition %d: the account of what they hold (%s) cannot be "
                "written: %s",
                len(segments), part.number, account.path, error.strerror or error,
            )  # fmt: skip
            report.segments_deleted -= len(segments)
            report.bytes_deleted -= sum(segment.size for segment in segments)
            return
        self._delete_segments(part, segments)

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
        _check_offset(topic, offset + len(frames))
        table.next[topic_id] = offset
        part = self._partitions[table.partition[topic_id]]
        part.append_frames(topic_id, frames, times, [PREFIX.unpack_from(frame, 0)[1] for frame in frames])
        self._committer.appended_many(part, len(frames), part.last_append_size)
