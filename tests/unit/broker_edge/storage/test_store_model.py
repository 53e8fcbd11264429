"""The model-based crash test of the partition logs: whatever the mix of appends to many topics (a leader's
and a follower's), flushes, truncations, restarts, retention by age and by size, clean closes and crashes,
every topic reads back exactly what the model says is durable, at dense offsets and with exact bytes, over
several partitions with segments so small that they roll, seal and checkpoint all the time, and the store
logs nothing at ERROR (the model damages nothing).

A crash drops the store without closing it: what was buffered and not flushed is lost (the model forgets
it), and sometimes a torn entry is left at the end of a partition's last segment (bytes a write left
behind) or the sealer's last seal is undone (its index file removed, as if the crash came before it was
written). Reopening must repair all of that and lose nothing that was flushed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from broker_edge.storage import CorruptRecord, LogStore, OffsetOutOfRange, StorageConfig
from broker_edge.storage.record import BODY_HEAD, PREFIX_SIZE, decode_frame, encode_frames
from broker_edge.storage.topic_table import SNAPSHOT_FILE, read_snapshot
from tests.harness.log_records import KeptRecords

TOPICS = [f"plant/{n}/line-{n % 3}" for n in range(7)] + ["devices/ünï/status", "x"]
BASE_TIME = 1_700_000_000_000
DAY_MS = 86_400_000
"""`StorageConfig.segment_ms` by default."""
FRAMING = PREFIX_SIZE + BODY_HEAD.size + len("c")
"""The bytes a record of the model takes in a log besides its payload (its client id is "c")."""


def _payload(topic: str, offset: int, size: int) -> bytes:
    return (f"{topic}@{offset}:".encode() * (size // 8 + 1))[:size]


Entry = tuple[bytes, int] | None
"""A log's entry in the model at one offset: a record's (payload, time), or None for an offset of a gap."""


def _bytes_of(records: list[Entry]) -> int:
    """What a log of the model's `records` holds in bytes (`LogInfo.bytes`): a gap holds none."""
    return sum(FRAMING + len(entry[0]) for entry in records if entry is not None)


def _held(start: int, records: list[Entry]) -> list[tuple[int, bytes, int]]:
    """(offset, payload, time) of each record the log holds, the gaps left out."""
    return [(start + n, entry[0], entry[1]) for n, entry in enumerate(records) if entry is not None]


class PartitionLogsMachine(RuleBasedStateMachine):
    """The store against a model: per topic, the payloads of its durable records from its start."""

    @initialize(
        partitions=st.integers(1, 3),
        segment_bytes=st.integers(200, 3000),
        checkpoint=st.integers(100, 2000),
        segment_ms=st.sampled_from([DAY_MS, None, 20, 100]),
    )
    def open_store(
        self, partitions: int, segment_bytes: int, checkpoint: int, segment_ms: int | None = DAY_MS
    ) -> None:
        self.directory = tempfile.mkdtemp(prefix="store-model-")
        self.config = StorageConfig(
            partitions=partitions,
            segment_bytes=segment_bytes,
            segment_ms=segment_ms,  # with a time, appends roll by age and retention rolls quiet partitions
            index_checkpoint_bytes=checkpoint,
            retention_ms=None,
            durability="none",  # the logic under test is the same; fsync latency is not
        )
        self.store = LogStore(self.directory, self.config)
        self.store.open()
        self.durable: dict[str, list[Entry]] = {}
        """Per topic: the entry at every offset from `start` (a record's payload and time, or a gap)."""
        self.pending: dict[str, list[tuple[bytes, int]]] = {}
        self.starts: dict[str, int] = {}
        self.clock = BASE_TIME
        self.errors = KeptRecords(logging.ERROR)
        """What the store logs at ERROR: nothing, as the model damages nothing (a crash's torn end and an
        undone seal are repairs, WARNING)."""
        logging.getLogger("broker_edge").addHandler(self.errors)

    def teardown(self) -> None:
        store = getattr(self, "store", None)
        if store is not None:
            store.close()
        errors = getattr(self, "errors", None)
        if errors is not None:
            logging.getLogger("broker_edge").removeHandler(errors)
        shutil.rmtree(getattr(self, "directory", ""), ignore_errors=True)

    def _end(self, topic: str) -> int:
        return self.starts.get(topic, 0) + len(self.durable.get(topic, []))

    @rule(
        topic=st.sampled_from(TOPICS),
        # up to 10 records: a batch of more than a fresh segment's rows (7 at 200 bytes) rolls into a
        # segment it fills to its last row, so that the next truncation's marker starts one of its own;
        # some records larger than a small segment
        sizes=st.lists(st.one_of(st.integers(0, 120), st.integers(121, 700)), min_size=1, max_size=10),
        follower=st.booleans(),
    )
    def append_batch(self, topic: str, sizes: list[int], follower: bool = False) -> None:
        """Append records of `sizes` as a leader, or (`follower`) a leader's frames taken verbatim."""
        self.clock += 7
        offset = self._end(topic) + len(self.pending.get(topic, []))
        payloads = [_payload(topic, offset + n, size) for n, size in enumerate(sizes)]
        records = [(payload, 1, False, "c", (), None, None, None, None, None) for payload in payloads]
        if follower:
            frames = b"".join(encode_frames(offset, self.clock, records))
            assert self.store.replicated_log.append_at(topic, frames) == offset
        else:
            assert self.store.append_batch(topic, records, self.clock) == offset
        self.pending.setdefault(topic, []).extend((payload, self.clock) for payload in payloads)

    @rule()
    def flush(self) -> None:
        self.store.flush()
        for topic, records in self.pending.items():
            self.durable.setdefault(topic, []).extend(records)
        self.pending = {}

    @precondition(lambda self: not self.pending)
    @rule(topic=st.sampled_from(TOPICS), back=st.integers(0, 5), under=st.integers(0, 3))
    def truncate(self, topic: str, back: int, under: int) -> None:
        """Cut the log `back` records from its end, or (`under`) that far below its start, as a replica
        whose retention went past what its new leader has is cut: its log is then empty from there."""
        if topic not in self.store:
            return
        start = self.starts.get(topic, 0)
        offset = max(start - under, 0) if under else max(start, self._end(topic) - back)
        self.store.replicated_log.truncate_to(topic, offset)
        if offset < start:
            self.starts[topic] = offset
            self.durable[topic] = []
        else:
            del self.durable.setdefault(topic, [])[offset - start :]

    @precondition(lambda self: not self.pending)
    @rule(topic=st.sampled_from(TOPICS), ahead=st.integers(1, 20))
    def continue_past_gap(self, topic: str, ahead: int) -> None:
        """Go on `ahead` offsets past the log's end, as a site whose log was lost does (`continue_at`): the
        offsets between are a gap, never served; a log that holds nothing starts there instead."""
        assert not self.pending
        end = self._end(topic)
        moved = self.store.replicated_log.continue_at({topic: end + ahead})
        assert moved == {topic: end}, moved  # the end it had (0 for a log not made yet)
        if self.durable.get(topic):  # offsets from its start to its end, records or a gap's
            self.durable[topic] += [None] * ahead
        else:
            self.starts[topic] = end + ahead
            self.durable[topic] = []

    @precondition(lambda self: not self.pending)
    @rule(topic=st.sampled_from(TOPICS), ahead=st.integers(0, 20))
    def restart(self, topic: str, ahead: int) -> None:
        offset = self._end(topic) + ahead
        self.store.replicated_log.restart_at(topic, offset)
        self.starts[topic] = offset
        self.durable[topic] = []

    @rule(age=st.integers(0, 400))
    def retention(self, age: int) -> None:
        """Keep records newer than `age` ms before the clock (whole groups go: the model follows)."""
        for records, cut in self._retention_pass("retention_ms", age):
            assert all(time < self.clock - age for _offset, _payload, time in _held(0, records[:cut]))

    @rule(limit=st.integers(0, 400))
    def retention_by_size(self, limit: int) -> None:
        """Keep at most `limit` bytes of each log (its oldest sealed groups go first): a log within the limit
        keeps every record, and the bytes of what stays are what the store then says."""
        for records, _cut in self._retention_pass("retention_bytes", limit):
            assert _bytes_of(records) > limit

    def _retention_pass(self, setting: str, value: int) -> list[tuple[list[Entry], int]]:
        """One retention pass with the store's `setting` at `value` for it (its per-rule settings are cached:
        cleared). For each log whose start moved: its durable records before the pass and how many of them
        the pass dropped, which the model then forgets (the store says where each log starts)."""
        setattr(self.store.config, setting, value)
        self.store._log_configs.clear()
        self.store.apply_retention(now_ms=self.clock)
        setattr(self.store.config, setting, None)
        self.store._log_configs.clear()
        moved: list[tuple[list[Entry], int]] = []
        for topic in list(self.durable):
            if topic not in self.store:
                continue
            start = self.store.start_offset(topic)
            old_start = self.starts.get(topic, 0)
            assert start >= old_start
            if start > old_start:
                moved.append((self.durable[topic][:], start - old_start))
                del self.durable[topic][: start - old_start]
                self.starts[topic] = start
        return moved

    @rule()
    def close_and_reopen(self) -> None:
        self.store.close()
        for topic, records in self.pending.items():
            self.durable.setdefault(topic, []).extend(records)
        self.pending = {}
        self._reopen(clean=True)

    @rule(torn=st.booleans(), unseal=st.booleans())
    def crash(self, torn: bool, unseal: bool) -> None:
        store = self.store
        store.file_pool.close()
        self.pending = {}
        if torn or unseal:
            for part in store.partition_logs:
                if not part.segments:
                    continue
                last = part.segments[-1]
                if torn and last.rows is not None and os.path.exists(last.log_path):  # (never a sealed one)
                    with open(last.log_path, "ab") as file:
                        file.write(b"\x07\x00\x00\x00torn entry")
                if unseal:  # only a seal the snapshot does not count yet can be lost with a crash
                    sealed = [s for s in part.segments if s.sealed is not None]
                    snapshot = read_snapshot(os.path.join(self.directory, "log", SNAPSHOT_FILE))
                    applied = snapshot.applied if snapshot is not None else []
                    covered = applied[part.number][0] if part.number < len(applied) else -1
                    if sealed and sealed[-1].number > covered and os.path.exists(sealed[-1].index_path):
                        os.unlink(sealed[-1].index_path)
        self._reopen(clean=False)

    def _reopen(self, clean: bool) -> None:
        self.store = LogStore(self.directory, self.config)
        report = self.store.open()
        assert report.clean_shutdown == clean
        if clean:
            assert report.records_scanned == 0 and report.indexes_rebuilt == 0

    @rule()
    def read_partitions(self) -> None:
        """Reading every partition by position serves each topic's durable records, in offset order, and
        nothing that a truncation, a restart or retention removed."""
        served: dict[str, list[tuple[int, bytes]]] = {}
        for info in self.store.partitions():
            position = info.start
            while position < info.end:
                read = self.store.read_partition(info.partition, position, 50, 700)
                for topic, frame in zip(read.topics, read.frames, strict=True):
                    offset = int.from_bytes(frame[9:17], "little")
                    record = decode_frame(frame, offset, 1 << 20)
                    served.setdefault(topic, []).append((offset, record.payload))
                assert read.damaged == 0
                assert read.next_position > position
                position = read.next_position
        held = {topic: _held(self.starts.get(topic, 0), records) for topic, records in self.durable.items()}
        expected = {
            topic: [(offset, payload) for offset, payload, _time in records]
            for topic, records in held.items()
            if records
        }
        assert served == expected

    @invariant()
    def every_topic_reads_back_what_is_durable(self) -> None:
        store = getattr(self, "store", None)
        if store is None:
            return
        assert not self.errors.records, self.errors.lines()
        for topic, records in self.durable.items():
            start = self.starts.get(topic, 0)
            end = start + len(records)
            info = store.log_info(topic)
            assert (info.start_offset, info.end_offset) == (start, end), topic
            assert info.bytes == _bytes_of(records), info
            held = _held(start, records)
            got = _read_over_gaps(store, topic, start, end)
            assert [(r.offset, r.payload) for r in got] == [(offset, p) for offset, p, _time in held], topic
            if held:
                offset, payload, _time = held[len(held) // 2]
                assert store.read(topic, offset, 1)[0].payload == payload
                newest = held[-1][2]
                expected = next(offset for offset, _p, time in held if time >= newest)
                assert store.offset_for_timestamp(topic, newest) == expected
            try:
                store.read(topic, end + 1, 1)
            except OffsetOutOfRange:
                pass
            else:
                raise AssertionError(f"{topic}: a read past the end must be refused")


def _read_over_gaps(store: LogStore, topic: str, start: int, end: int) -> list:
    """Every record of `topic` from `start` to `end`, a read at a gap told where the log goes on."""
    got: list = []
    offset = start
    while offset < end:
        try:
            batch = store.read(topic, offset, 10_000, 1 << 30)
        except CorruptRecord as gap:
            assert gap.next_offset > offset, gap
            offset = gap.next_offset
            continue
        assert batch, (topic, offset)
        got += batch
        offset = batch[-1].offset + 1
    return got


PartitionLogsMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("STORE_MODEL_EXAMPLES", "40")),
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_partition_logs_read_back_what_is_durable = PartitionLogsMachine.TestCase


@contextlib.contextmanager
def _machine() -> Iterator[PartitionLogsMachine]:
    """The machine on a store of one partition with tiny segments, for a case it found, step by step."""
    machine = PartitionLogsMachine()
    try:
        machine.open_store(partitions=1, segment_bytes=200, checkpoint=100)
        yield machine
    finally:
        machine.teardown()


def test_a_log_cut_below_its_start_keeps_its_start_after_a_crash() -> None:
    """A log whose start retention moved up is cut below it, and the segment with the cut is sealed before a
    crash: recovery kept the snapshot's start above the log's end (a record appended at the cut's offset
    could never be read) and its bytes dropped before the cut (negative bytes)."""
    with _machine() as machine:
        machine.append_batch(topic="plant/5/line-2", sizes=[10, 10])
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.close_and_reopen()
        machine.retention(age=0)
        assert machine.store.start_offset("plant/5/line-2") == 2
        machine.truncate(topic="plant/5/line-2", back=0, under=1)
        machine.append_batch(topic="plant/5/line-2", sizes=[10])
        machine.append_batch(topic="plant/0/line-0", sizes=[0, 0, 0, 0, 0])
        machine.flush()
        machine.crash(torn=False, unseal=False)
        info = machine.store.log_info("plant/5/line-2")
        assert (info.start_offset, info.end_offset) == (1, 2)
        machine.every_topic_reads_back_what_is_durable()


def test_a_log_restarted_after_retention_has_no_bytes_after_a_crash() -> None:
    """A case the model found: a log whose bytes retention dropped restarts empty, and the segment with its
    restart is sealed before a crash. Recovery took the bytes dropped before the restart from the snapshot
    and the total since it from the sealed index, and reported -30 bytes."""
    with _machine() as machine:
        machine.append_batch(topic="plant/5/line-2", sizes=[0])
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.close_and_reopen()
        machine.retention(age=0)
        machine.restart(topic="plant/5/line-2", ahead=0)
        machine.append_batch(topic="plant/0/line-0", sizes=[0, 0, 0, 0, 0])
        machine.flush()
        machine.crash(torn=False, unseal=False)
        assert machine.store.log_info("plant/5/line-2").bytes == 0
        machine.every_topic_reads_back_what_is_durable()


def test_a_cut_replayed_at_open_takes_off_the_bytes_it_cut() -> None:
    """A truncation found in a segment replayed at open cut its records by their sizes, the last one's
    taken against the segment's size before the scan had set it: the log's bytes came back wrong (negative
    once the segment was sealed)."""
    with _machine() as machine:
        machine.restart(topic="plant/1/line-1", ahead=1)
        machine.append_batch(topic="plant/1/line-1", sizes=[0])
        machine.flush()
        machine.truncate(topic="plant/1/line-1", back=0, under=1)
        assert machine.store.log_info("plant/1/line-1").bytes == 0
        machine.crash(torn=False, unseal=False)
        assert machine.store.log_info("plant/1/line-1").bytes == 0
        machine.close_and_reopen()
        assert machine.store.log_info("plant/1/line-1").bytes == 0
        machine.every_topic_reads_back_what_is_durable()


def test_a_segment_after_one_retention_deleted_keeps_its_positions_after_a_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Retention deletes a segment whose records a truncation cut (not the oldest one), and a crash loses
    the next segment's seal: its positions were taken to follow the segment loaded before it, one too low,
    and a whole-partition read met a damaged entry. The open also said the deleted segment's records were
    lost: the truncation that cut them was in the segment replayed after that was reported."""
    with _machine() as machine:
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.close_and_reopen()
        machine.append_batch(topic="plant/2/line-2", sizes=[0])
        machine.close_and_reopen()
        machine.truncate(topic="plant/2/line-2", back=1, under=0)
        machine.crash(torn=False, unseal=False)
        machine.retention(age=7)
        machine.flush()
        with caplog.at_level(logging.ERROR, logger="broker_edge.storage.recovery"):
            machine.crash(torn=False, unseal=True)
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        machine.read_partitions()
        machine.every_topic_reads_back_what_is_durable()


def test_a_cut_whose_records_retention_deleted_takes_off_their_bytes_after_a_crash() -> None:
    """A case the model found: a log is cut to nothing, retention then deletes the sealed segment that held
    the records cut, and a crash comes before the segment with the cut is sealed. The replayed cut found no
    segment to take the records' bytes from, so the log came back empty with 30 bytes; the marker carries
    them."""
    with _machine() as machine:
        machine.append_batch(topic="plant/3/line-0", sizes=[0])
        machine.close_and_reopen()
        machine.truncate(topic="plant/3/line-0", back=0, under=1)
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.retention(age=0)
        machine.crash(torn=False, unseal=False)
        assert machine.store.log_info("plant/3/line-0").bytes == 0
        machine.close_and_reopen()
        assert machine.store.log_info("plant/3/line-0").bytes == 0
        machine.every_topic_reads_back_what_is_durable()


def test_a_crash_after_a_cut_keeps_the_bytes_of_the_segments_sealed_before_it() -> None:
    """A case the model found: a log cut to nothing, then two crashes. The first undoes the seal of the
    segment with the records cut (which the sealer made durable before the cut's marker: a store must come
    back right all the same), so the open replays them and the cut, and seals that segment again without
    them; after the second, the replayed cut took the records' bytes off once more (-139 bytes)."""
    with _machine() as machine:
        machine.append_batch(topic="plant/0/line-0", sizes=[0, 0, 49])
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.flush()
        machine.truncate(topic="plant/0/line-0", back=0, under=1)
        machine.crash(torn=False, unseal=True)
        assert machine.store.log_info("plant/0/line-0").bytes == 0
        machine.crash(torn=False, unseal=False)
        assert machine.store.log_info("plant/0/line-0").bytes == 0
        machine.every_topic_reads_back_what_is_durable()


def test_a_cut_whose_marker_starts_a_segment_keeps_its_bytes_through_retention_and_crashes() -> None:
    """A log is cut to nothing while the active segment, which holds its newest records, has no row left:
    the marker starts the next segment, and the segment it leaves is sealed without the records cut. The
    cut's bytes come off once whatever follows: the sealed segment with its older records deleted by
    retention, then crashes that undo the seals not yet in a snapshot."""
    with _machine() as machine:
        machine.append_batch(topic="plant/3/line-0", sizes=[0])
        machine.close_and_reopen()
        machine.append_batch(topic="x", sizes=[0])
        machine.append_batch(topic="plant/3/line-0", sizes=[0] * 7)  # a segment of its own, every row taken
        machine.flush()
        store = machine.store
        (part,) = store.partition_logs
        full = part.active
        assert full is not None and full.rows is not None and len(full.rows) == full.capacity
        machine.truncate(topic="plant/3/line-0", back=0, under=1)
        assert part.active is not full and full.sealed is not None
        assert store.log_info("plant/3/line-0").bytes == 0
        machine.crash(torn=False, unseal=True)
        assert machine.store.log_info("plant/3/line-0").bytes == 0
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.flush()
        machine.retention(age=14)  # the segment with the log's first record goes, the cut one stays
        assert [s.number for s in machine.store.partition_logs[0].segments if s.number <= full.number] == [
            full.number - 1,
            full.number,
        ]
        machine.crash(torn=False, unseal=True)
        assert machine.store.log_info("plant/3/line-0").bytes == 0
        machine.close_and_reopen()
        machine.every_topic_reads_back_what_is_durable()
        machine.read_partitions()


def test_a_batch_of_more_rows_than_an_empty_active_segment_holds_goes_to_a_segment_of_its_own() -> None:
    """A case the model found: retention rolls a partition's segment, leaving an empty active one with room
    for 7 rows (200 bytes), and a batch of 8 records came: only a segment holding records was rolled for a
    batch too many for its rows, so the 8 went into the empty one and its open index refused them at the
    next checkpoint (`more rows than the segment can hold`), failing the close. The batch now starts a
    segment made for it, the empty one sealed with no rows."""
    with _machine() as machine:
        machine.restart(topic="plant/0/line-0", ahead=0)
        machine.crash(torn=False, unseal=False)
        machine.retention(age=0)
        (part,) = machine.store.partition_logs
        empty = part.active
        assert empty is not None and empty.size == 0 and empty.capacity == 7
        machine.append_batch(topic="plant/0/line-0", sizes=[0] * 8)
        assert part.active is not empty and part.active.capacity == 8
        machine.close_and_reopen()
        machine.read_partitions()
        machine.every_topic_reads_back_what_is_durable()
        machine.crash(torn=True, unseal=True)
        machine.read_partitions()
        machine.every_topic_reads_back_what_is_durable()


def test_a_crash_after_a_partial_cut_keeps_the_bytes_of_the_records_before_it() -> None:
    """A case the model found: a log is cut by two records, one from a sealed segment and one from the
    active one, then two crashes. The first undoes the seal of the segment before the cut's, so the open
    replays its rows and the cut, and seals it again without the record cut; after the second, the
    replayed cut took that record's bytes off once more (90 where 120 is right): no segment gave them back
    and the log still held more than them, so the bound of a log cut to nothing did not hold them."""
    with _machine() as machine:
        machine.append_batch(topic="plant/0/line-0", sizes=[0, 0, 0, 0, 0])
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.flush()
        machine.truncate(topic="plant/0/line-0", back=2, under=0)
        machine.crash(torn=False, unseal=True)
        assert machine.store.log_info("plant/0/line-0").bytes == 4 * FRAMING
        machine.crash(torn=False, unseal=False)
        assert machine.store.log_info("plant/0/line-0").bytes == 4 * FRAMING
        machine.every_topic_reads_back_what_is_durable()


def test_a_log_restarted_then_cut_below_its_start_keeps_the_cut_start_after_a_crash() -> None:
    """A case the model found: retention moves a log's start to 5, it restarts empty at 6, and a cut below
    its start empties it from 4; records 4 and 5 follow, and a crash comes after the segment with the
    restart and the cut is sealed but before a snapshot counts it. That segment's group says the log
    restarted at 4 (the cut's offset), and the open kept the snapshot's start of 5, higher: record 4 was
    never served again."""
    with _machine() as machine:
        machine.append_batch(topic="plant/0/line-0", sizes=[0, 0, 0, 0, 0])
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.flush()
        machine.retention(age=0)
        assert machine.store.start_offset("plant/0/line-0") == 5
        machine.restart(topic="plant/0/line-0", ahead=0)
        machine.restart(topic="plant/0/line-0", ahead=0)  # one more marker: the next records roll
        machine.truncate(topic="plant/0/line-0", back=0, under=2)
        machine.append_batch(topic="plant/0/line-0", sizes=[0, 0])
        machine.flush()
        machine.crash(torn=False, unseal=False)
        info = machine.store.log_info("plant/0/line-0")
        assert (info.start_offset, info.end_offset) == (4, 6)
        machine.every_topic_reads_back_what_is_durable()


def test_a_log_continued_past_two_gaps_keeps_its_end_and_offsets_once_sealed() -> None:
    """A case the model found once it went on past gaps (`continue_at`, as a site whose log was lost): a
    log continued twice with no record between has both markers in one segment, and its seal kept the
    first one's offset as the group's start. A clean restart gave the log the end of the first gap (2, not
    3), so offsets were handed out again, and records appended after the second gap were indexed one
    offset too low."""
    with _machine() as machine:
        machine.append_batch(topic="plant/0/line-0", sizes=[0])
        machine.close_and_reopen()
        machine.continue_past_gap(topic="plant/0/line-0", ahead=1)
        machine.continue_past_gap(topic="plant/0/line-0", ahead=1)
        machine.append_batch(topic="plant/0/line-0", sizes=[5, 6])
        machine.flush()
        machine.close_and_reopen()
        info = machine.store.log_info("plant/0/line-0")
        assert (info.start_offset, info.end_offset) == (0, 5)
        held = _held(0, machine.durable["plant/0/line-0"])
        assert [(r.offset, r.payload) for r in machine.store.read("plant/0/line-0", 3, 2)] == [
            (offset, payload) for offset, payload, _time in held[1:]
        ]
        machine.every_topic_reads_back_what_is_durable()
        machine.crash(torn=False, unseal=True)
        machine.every_topic_reads_back_what_is_durable()
