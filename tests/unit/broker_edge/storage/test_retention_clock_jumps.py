"""Retention by age when the wall clock jumps: a box booted in 1970 until NTP sets the date, a clock stepped
by a year either way. Records are aged by the time that passed, not by the clock's step."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.clock import Clock
from tests.unit.broker_edge.storage.log_helpers import BASE_TIME_MS

DAY_MS = 86_400_000
YEAR_MS = 365 * DAY_MS
PASS_MS = 60_000
"""The time between two retention passes (`storage.retention_interval_s`'s default)."""


class SetClock(Clock):
    """A clock the test moves: `advance` is time passing, `step` sets the wall clock alone (NTP, a user)."""

    __slots__ = ("steady", "wall")

    def __init__(self, wall_ms: int) -> None:
        self.wall = wall_ms
        self.steady = 10_000

    def wall_ms(self) -> int:
        return self.wall

    def steady_ms(self) -> int:
        return self.steady

    def advance(self, ms: int) -> None:
        self.wall += ms
        self.steady += ms

    def step(self, ms: int) -> None:
        self.wall += ms

    def boot_id(self) -> str:
        return "one boot"


def _store(directory: Path, clock: SetClock) -> LogStore:
    store = LogStore(directory, StorageConfig(segment_bytes=4096, retention_ms=DAY_MS), clock=clock)
    store.open()
    return store


def _fill(store: LogStore, topic: str, segments: int) -> int:
    """Append to `topic`, stamped by the store's clock, until its partition has `segments` more segments
    (the older ones sealed); returns the topic's end."""
    partition = store.partition_logs[0]
    until = len(partition.segments) + segments
    while len(partition.segments) < until:
        store.append_message(topic, b"x" * 100)
        store.flush()
    store.wait_sealed()
    return store.log_info(topic).end_offset


@pytest.mark.parametrize(
    "booted_at_ms", [BASE_TIME_MS, 300_000], ids=["clock_stepped_a_year_forward", "booted_in_1970_then_ntp"]
)
def test_a_clock_jumping_forward_does_not_age_the_records_written_before_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, booted_at_ms: int
):
    """Before, the pass after the jump deleted every sealed segment at once (records of minutes ago looked a
    year, or 56 years, old), whether or not a reader had them yet."""
    clock = SetClock(booted_at_ms)
    store = _store(tmp_path, clock)
    _fill(store, "t", segments=3)
    store.apply_retention()
    clock.advance(PASS_MS)
    clock.step(YEAR_MS if booted_at_ms == BASE_TIME_MS else BASE_TIME_MS - booted_at_ms)

    with caplog.at_level(logging.WARNING, logger="broker_edge.storage.clock"):
        report = store.apply_retention()

    assert (report.segments_deleted, store.start_offset("t")) == (0, 0)
    assert "the wall clock jumped forward by" in caplog.text
    store.close()
    reopened = _store(tmp_path, clock)  # the jump is kept across a restart
    clock.advance(DAY_MS // 2)
    assert reopened.apply_retention().segments_deleted == 0
    clock.advance(DAY_MS // 2 + 2 * PASS_MS)  # a day has passed since they were written: they go
    assert reopened.apply_retention().segments_deleted >= 3
    assert reopened.start_offset("t") > 0
    reopened.close()


def test_records_stamped_after_a_forward_jump_are_aged_by_the_clock(tmp_path: Path):
    clock = SetClock(BASE_TIME_MS)
    store = _store(tmp_path, clock)
    before = _fill(store, "t", segments=2)
    store.apply_retention()
    clock.advance(PASS_MS)
    clock.step(YEAR_MS)
    store.apply_retention()
    _fill(store, "t", segments=2)
    clock.advance(DAY_MS // 2)
    assert store.apply_retention().segments_deleted == 0

    clock.advance(DAY_MS // 2 + PASS_MS)
    store.apply_retention()

    assert store.start_offset("t") > before  # both sides of the jump went, each by its own age
    store.close()


def _corrected_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[SetClock, LogStore, int]:
    """A store whose clock ran a year ahead while 't' got records, then was set back to the right time."""
    clock = SetClock(BASE_TIME_MS + YEAR_MS)
    store = _store(tmp_path, clock)
    ahead = _fill(store, "t", segments=2)
    store.append_message("t", b"in the active segment")
    store.flush()
    store.apply_retention()
    clock.advance(PASS_MS)
    clock.step(-YEAR_MS)
    with caplog.at_level(logging.WARNING, logger="broker_edge.storage.clock"):
        store.apply_retention()
    store.flush()  # the active segment rolled at the correction is written and sealed
    store.wait_sealed()
    return clock, store, ahead + 1


def test_records_stamped_by_a_clock_ahead_go_a_retention_after_it_is_set_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """Before, they were stamped a year in the future of the corrected clock and kept a year too long."""
    clock, store, ahead = _corrected_back(tmp_path, caplog)
    clock.advance(DAY_MS // 2)
    assert store.apply_retention().segments_deleted == 0  # not early either

    clock.advance(DAY_MS // 2 + PASS_MS)
    store.apply_retention()

    assert store.start_offset("t") == ahead  # the active segment's too: it was rolled at the correction
    assert "the wall clock jumped back by 1.0 years" in caplog.text
    store.close()


def test_records_written_after_a_clock_is_set_back_go_by_their_own_age(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """A topic's index time is the running maximum of its records' times (so that offset_for_timestamp can
    bisect it); before, the year-ahead records kept every later record of the topic a year too."""
    clock, store, _ = _corrected_back(tmp_path, caplog)
    after = _fill(store, "t", segments=2)
    clock.advance(DAY_MS + PASS_MS)

    store.apply_retention()

    assert store.start_offset("t") == after - 1  # every sealed segment went; the active one's record stays
    assert store.offset_for_timestamp("t", clock.wall - DAY_MS // 2) == after  # written a day ago
    store.close()


def test_a_group_whose_last_record_is_stamped_earlier_is_aged_by_its_newest(tmp_path: Path):
    """Times stepping back within a segment (a clock set back by less than a jump) neither age the group by
    its last record's time nor break the time lookups."""
    clock = SetClock(BASE_TIME_MS)
    store = _store(tmp_path, clock)
    for stamp in (10_000, 20_000, 5_000):
        store.append_message("t", b"x", timestamp_ms=BASE_TIME_MS + stamp)
    store.flush()
    _fill(store, "filler", segments=1)

    store.apply_retention(now_ms=BASE_TIME_MS + 20_000 + DAY_MS - 1)  # a day after 5_000 and 10_000
    assert store.start_offset("t") == 0
    assert store.offset_for_timestamp("t", BASE_TIME_MS + 15_000) == 1
    store.apply_retention(now_ms=BASE_TIME_MS + 20_000 + DAY_MS + 1)
    assert store.start_offset("t") == 3
    store.close()


def test_a_jump_while_the_broker_is_stopped_is_found_at_the_next_start_of_the_same_boot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The box booted in 1970; the broker was stopped, NTP set the date, the broker started again: before,
    its first pass deleted every record written in 1970."""
    clock = SetClock(300_000)
    store = _store(tmp_path, clock)
    _fill(store, "t", segments=2)
    store.close()
    clock.advance(PASS_MS)
    clock.step(BASE_TIME_MS)
    reopened = _store(tmp_path, clock)
    clock.advance(PASS_MS)

    with caplog.at_level(logging.WARNING, logger="broker_edge.storage.clock"):
        report = reopened.apply_retention()

    assert (report.segments_deleted, reopened.start_offset("t")) == (0, 0)
    assert "the wall clock jumped forward by 53.9 years" in caplog.text
    reopened.close()


def test_a_jump_found_while_running_is_not_found_again_after_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    """The reference of a clean close is taken once: after a crash, the next start compares with nothing
    older than the jumps already found (it would say a jump that was kept already)."""
    clock = SetClock(300_000)
    store = _store(tmp_path, clock)
    _fill(store, "t", segments=2)
    store.close()
    reopened = _store(tmp_path, clock)
    clock.advance(PASS_MS)
    clock.step(BASE_TIME_MS)
    reopened.apply_retention()  # the jump is found and kept
    reopened.file_pool.close()  # a crash: dropped without closing
    after_crash = _store(tmp_path, clock)
    clock.advance(DAY_MS + 2 * PASS_MS)
    caplog.clear()

    with caplog.at_level(logging.WARNING, logger="broker_edge.storage.clock"):
        report = after_crash.apply_retention()

    assert "jumped" not in caplog.text
    assert report.segments_deleted >= 2  # aged from the jump once
    after_crash.close()


@pytest.mark.parametrize(
    "written",
    [
        '[{"below": ["0"], "low_ms": 0, "high_ms": 1, "add_ms": 1}]',
        '[{"below": "12", "low_ms": 0, "high_ms": 1, "add_ms": 1}]',
        '[{"below": [9], "low_ms": "0", "high_ms": 1, "add_ms": 1}]',
        '[{"below": [9], "low_ms": 0, "high_ms": 1.5, "add_ms": null}]',
        "[" * 100_000,
    ],
    ids=[
        "partition_end_a_string",
        "ends_a_string",
        "time_a_string",
        "not_whole_numbers",
        "nested_past_the_parser",
    ],
)
def test_a_clock_jumps_file_of_wrong_types_is_forgotten_and_retention_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, written: str
):
    """A ``meta/clock-jumps`` written by hand or by another version, valid JSON but with values of other
    types: before, it was taken as it was and every retention pass failed on it (a TypeError, never a
    segment deleted, until the disk filled); brackets nested past the JSON parser's depth stopped the
    open (``RecursionError``)."""
    clock = SetClock(BASE_TIME_MS)
    store = _store(tmp_path, clock)
    end = _fill(store, "t", segments=3)
    store.close()
    (tmp_path / "meta" / "clock-jumps").write_text(written)
    clock.advance(2 * DAY_MS)

    with caplog.at_level(logging.ERROR, logger="broker_edge.storage.clock"):
        reopened = _store(tmp_path, clock)
        report = reopened.apply_retention()

    assert report.segments_deleted >= 2
    assert 0 < reopened.start_offset("t") <= end
    assert f"{tmp_path / 'meta' / 'clock-jumps'} cannot be read" in caplog.text
    reopened.close()
