"""Retention's account of what it deleted, per topic (``removed_account``): the position past each topic's
newest record that went with a deleted segment, exact whatever the segment's size, kept across restarts,
and for a store written before the account, no account below what was already gone."""

from __future__ import annotations

from pathlib import Path

from broker_edge.storage import LogStore, StorageConfig
from tests.unit.broker_edge.storage.log_helpers import BASE_TIME_MS, make_record

OLD, YOUNG = BASE_TIME_MS, BASE_TIME_MS + 120_000


def _store(directory: Path) -> LogStore:
    store = LogStore(directory, StorageConfig(retention_ms=60_000, segment_bytes=16_384))
    store.open()
    return store


def _append(store: LogStore, plan: list[tuple[str, int, int]]) -> None:
    """Append `count` records of `topic` stamped `time`, for each step of `plan`."""
    for topic, time, count in plan:
        for number in range(count):
            store.append(topic, make_record(number, payload_size=8, timestamp_ms=time))
        store.flush()
    store.wait_sealed()


def _topic_at_each_position(store: LogStore) -> list[str]:
    read = store.read_partition(0, 0, 100_000, 1 << 30)
    assert read.next_position == store.partitions()[0].end
    return read.topics


def _expected(topics: list[str], deleted: set[int], bounds: dict[int, range]) -> dict[str, int]:
    """Per topic, one past its newest position in a deleted segment."""
    expected: dict[str, int] = {}
    for number in deleted:
        for position in bounds[number]:
            expected[topics[position]] = max(expected.get(topics[position], 0), position + 1)
    return expected


def _fill_then_delete(store: LogStore) -> tuple[dict[str, int], set[int]]:
    # more than 256 entries per segment (the sealed index's sparse rows): the account steps between them
    _append(store, [("old/a", OLD, 300), ("old/b", OLD, 3), ("old/a", OLD, 400), ("young", YOUNG, 2000)])
    _append(store, [("old/b", OLD, 1), ("young", YOUNG, 10)])
    topics = _topic_at_each_position(store)
    segments = store.partition_logs[0].segments
    bounds = {s.number: range(s.base, s.base + s.row_count) for s in segments}
    store.apply_retention(now_ms=YOUNG)
    deleted = set(bounds) - {s.number for s in store.partition_logs[0].segments}
    return _expected(topics, deleted, bounds), deleted


def test_each_topic_of_a_deleted_segment_is_accounted_up_to_its_newest_record_there(tmp_path: Path):
    store = _store(tmp_path)
    expected, deleted = _fill_then_delete(store)

    assert deleted and set(expected) == {"old/a", "old/b"}
    removed = store.removed_below(0, 0, None)
    assert (removed.accounted_from, removed.topics) == (0, expected)
    assert store.removed_below(0, 0, ["young"]).topics == {}
    last = max(expected, key=expected.__getitem__)
    assert store.removed_below(0, expected[last] - 1, None).topics == {last: expected[last]}
    assert store.removed_below(0, max(expected.values()), None).topics == {}
    store.close()

    reopened = _store(tmp_path)
    assert reopened.removed_below(0, 0, ["old/#"]).topics == expected
    reopened.close()


def test_a_store_without_an_account_begins_it_past_what_was_already_deleted(tmp_path: Path):
    store = _store(tmp_path)
    _fill_then_delete(store)
    start = store.partitions()[0].start
    store.close()
    (tmp_path / "log" / "removed").unlink()  # as a store written before the account was kept

    reopened = _store(tmp_path)
    removed = reopened.removed_below(0, 0, None)
    assert removed.accounted_from == start > 0
    assert removed.topics == {}
    reopened.close()


def test_a_damaged_account_is_begun_again_past_what_was_already_deleted(tmp_path: Path):
    store = _store(tmp_path)
    _fill_then_delete(store)
    start = store.partitions()[0].start
    store.close()
    path = tmp_path / "log" / "removed"
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF  # the first entry's check
    path.write_bytes(bytes(data) + bytes(data[8:24]))  # (and an entry after it: not a torn end)

    reopened = _store(tmp_path)
    assert reopened.removed_below(0, 0, None) == type(reopened.removed_below(0, 0, None))(start, {})
    reopened.close()


def test_segment_files_lost_between_runs_begin_the_account_past_them(tmp_path: Path):
    """Segments retention deleted are accounted for across restarts; one whose files went while the broker
    was stopped is not (nothing says what it held): the account begins past it."""
    store = _store(tmp_path)
    _fill_then_delete(store)
    _append(store, [("young", YOUNG, 1000)])
    store.close()
    reopened = _store(tmp_path)
    segments = reopened.partition_logs[0].segments
    assert reopened.removed_below(0, 0, None).accounted_from == 0  # (retention's deletions: accounted)
    lost, after = segments[1], segments[2]
    reopened.close()
    for suffix in (".log", ".index"):
        (tmp_path / "log" / "00" / f"{lost.number:020d}{suffix}").unlink()

    again = _store(tmp_path)
    assert again.removed_below(0, 0, None).accounted_from == after.base
    again.close()
