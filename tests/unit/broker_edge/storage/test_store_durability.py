"""Durability policies: when_durable fires on the loop only after the data is written (and fsynced).

A spy wraps `os.fdatasync` (the real call still happens) to see what was synced before a callback ran; a
second LogStore opened on a copy of the directory, taken inside the callback, proves the records are in the
files (a store opened on the live directory would seal its segments when it closes).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

import pytest

from broker_edge.storage import Durability, LogStore, StorageConfig, StorageFailed, group_commit
from broker_edge.storage.fs_sync import syncfs_available
from tests.unit.broker_edge.storage.log_helpers import assert_matches, make_record

TOPIC = "plant/line-1/temp"


class FsyncSpy:
    """Records the size of every file fdatasync'ed and the thread that did it, then syncs it for real."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sizes: list[int] = []
        self.threads: set[threading.Thread] = set()
        real = os.fdatasync

        def spying(fd: int) -> None:
            self.sizes.append(os.fstat(fd).st_size)
            self.threads.add(threading.current_thread())
            real(fd)

        monkeypatch.setattr(os, "fdatasync", spying)


def _open(directory: Path, durability: Durability, **settings) -> LogStore:
    store = LogStore(directory, StorageConfig(durability=durability, **settings))
    store.open()
    return store


def _copy_of_files(directory: Path) -> LogStore:
    """A store opened on a copy of what the files of `directory` hold now."""
    copy = directory.with_name(directory.name + "-copy")
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(directory, copy)
    return _open(copy, "none")


def _records_on_disk(directory: Path) -> list:
    other = _copy_of_files(directory)
    try:
        return other.read(TOPIC, 0, max_records=10_000, max_bytes=10**9)
    finally:
        other.close()


async def _append_and_wait(
    store: LogStore, directory: Path, count: int, spy: FsyncSpy, first: int = 0
) -> dict:
    seen: dict = {}
    done = asyncio.Event()

    def on_durable() -> None:
        seen["thread"] = threading.current_thread()
        seen["synced_sizes"] = list(spy.sizes)
        seen["syncing_threads"] = set(spy.threads)
        seen["end_offset"] = store.log_info(TOPIC).end_offset
        seen["bytes"] = store.log_info(TOPIC).bytes
        seen["on_disk"] = _records_on_disk(directory)
        done.set()

    for number in range(first, first + count):
        store.append(TOPIC, make_record(number))
    store.when_durable(on_durable)
    await asyncio.wait_for(done.wait(), 10)
    return seen


@pytest.mark.parametrize("durability", ["group", "fsync"])
def test_when_durable_fires_on_the_loop_after_fsync(tmp_path: Path, monkeypatch, durability: Durability):
    spy = FsyncSpy(monkeypatch)
    # the fdatasync path: a new topic's window touches three files, which the default makes one syncfs
    store = _open(tmp_path, durability, group_commit_ms=5, syncfs_min_segments=0)

    seen = asyncio.run(_append_and_wait(store, tmp_path, 30, spy))

    assert seen["thread"] is threading.main_thread()
    assert threading.main_thread() not in seen["syncing_threads"]  # the loop never blocks on fsync
    assert seen["end_offset"] == 30
    assert max(seen["synced_sizes"]) >= seen["bytes"]
    assert len(seen["on_disk"]) == 30
    for number, record in enumerate(seen["on_disk"]):
        assert_matches(record, number)
    store.close()


def test_fsync_policy_syncs_every_append_and_group_policy_batches(tmp_path: Path, monkeypatch):
    spy = FsyncSpy(monkeypatch)
    fsync_store = _open(tmp_path / "fsync", "fsync", syncfs_min_segments=0)  # fdatasyncs only, counted
    asyncio.run(_append_and_wait(fsync_store, tmp_path / "fsync", 20, spy))
    per_append = len(spy.sizes)
    fsync_store.close()
    spy.sizes.clear()

    group_store = _open(tmp_path / "group", "group", group_commit_ms=50, syncfs_min_segments=0)
    asyncio.run(_append_and_wait(group_store, tmp_path / "group", 200, spy))
    grouped = len(spy.sizes)
    group_store.close()

    assert per_append >= 20
    assert grouped <= 3  # one window: the segment, its open index and the catalog (a new topic) once each


def test_default_window_closes_with_its_loop_iteration_and_grows_while_a_sync_runs(
    tmp_path: Path, monkeypatch
):
    gate = threading.Event()
    real = os.fdatasync

    def slow_sync(fd: int) -> None:
        gate.wait(10)  # holds the first job in its fsync until the loop has queued more appends
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)

    async def scenario() -> tuple[list[int], int, int]:
        store = _open(tmp_path, "group", syncfs_min_segments=0)  # no timer; fdatasyncs, held by the gate
        durable_at: list[int] = []
        for number in range(5):  # one loop iteration: one window
            store.append(TOPIC, make_record(number))
        store.when_durable(lambda: durable_at.append(store.committer.jobs_completed))
        for _ in range(3):
            await asyncio.sleep(0)  # the window closed: its job waits in fsync
        in_flight = store.committer.in_flight
        for number in range(5, 50):  # while it syncs, these gather in the next window
            store.append(TOPIC, make_record(number))
            await asyncio.sleep(0)
        store.when_durable(lambda: durable_at.append(store.committer.jobs_completed))
        gate.set()
        await store.wait_durable()
        jobs = store.committer.jobs_completed
        store.close()
        return durable_at, in_flight, jobs

    durable_at, in_flight, jobs = asyncio.run(scenario())

    assert in_flight == 1
    assert durable_at == [1, 2]
    assert jobs == 2  # 50 appends over 46 loop iterations: two jobs, the second cut when the first synced


def test_a_least_interval_between_jobs_holds_a_busy_window_and_never_an_idle_one(tmp_path: Path, monkeypatch):
    """``group_commit_min_interval_ms``: appends that follow a job within the interval wait out its rest and
    share one job; after a pause longer than it, an append is cut at once (one fsync, no wait). The disk's
    syncs return at once here (syncfs turned off: a new topic's first job, three files, would sync the whole
    filesystem, which on a busy machine took seconds): the windows' times are the point. The interval is the
    most allowed (1 s): an idle append's job, cut at once, takes a small part of it however busy the
    machine, one that waited it out all of it."""
    interval_s = 1.0
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    monkeypatch.setattr(os, "fdatasync", lambda fd: None)

    async def scenario() -> tuple[float, float, int, float]:
        store = _open(
            tmp_path, "group", group_commit_min_interval_ms=interval_s * 1000, syncfs_min_segments=0
        )
        loop = asyncio.get_running_loop()

        async def durable() -> float:  # (wait_durable would end the window at once)
            done = asyncio.Event()
            store.when_durable(done.set)
            await asyncio.wait_for(done.wait(), 10)
            return loop.time()

        started = loop.time()
        store.append(TOPIC, make_record(0))
        first = await durable() - started  # idle before: cut at once
        for number in range(1, 30):  # within the interval of the first job: all held for one job
            store.append(TOPIC, make_record(number))
            await asyncio.sleep(0.001)
        held = await durable() - started
        jobs = store.committer.jobs_completed
        await asyncio.sleep(interval_s * 1.5)  # idle again, for longer than the interval
        again = loop.time()
        store.append(TOPIC, make_record(30))
        idle = await durable() - again
        store.close()
        return first, held, jobs, idle

    first, held, jobs, idle = asyncio.run(scenario())
    assert first < interval_s / 2 and idle < interval_s / 2  # no wait after a pause longer than the interval
    assert held >= interval_s - 0.01  # the second job was cut once the interval from the first had passed
    assert jobs == 2  # the first append's job, then the 29 that came within its interval


def test_a_window_over_its_byte_bound_is_cut_even_while_a_sync_runs(tmp_path: Path, monkeypatch):
    gate = threading.Event()
    real = os.fdatasync

    def slow_sync(fd: int) -> None:
        gate.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)

    async def scenario() -> tuple[int, int, int]:
        store = _open(tmp_path, "group", group_commit_max_bytes=4096, syncfs_min_segments=0)  # held below
        store.append(TOPIC, make_record(0))
        for _ in range(3):
            await asyncio.sleep(0)  # the first window is in its (held) fsync
        for number in range(1, 200):  # 200 frames of about 100 bytes: several windows' worth
            store.append(TOPIC, make_record(number))
        queued, pending = store.committer.in_flight, store.pending_bytes
        gate.set()
        await store.wait_durable()
        end = store.log_info(TOPIC).end_offset
        store.close()
        return queued, pending, end

    queued, pending, end = asyncio.run(scenario())

    assert queued >= 4  # cut at the bound and queued behind the held job, not one growing window
    assert pending < 4096
    assert end == 200


def test_none_policy_writes_records_without_fsync_and_syncs_only_a_new_topics_catalog_entry(
    tmp_path: Path, monkeypatch
):
    spy = FsyncSpy(monkeypatch)
    store = _open(tmp_path, "none", group_commit_ms=5)

    seen = asyncio.run(_append_and_wait(store, tmp_path, 10, spy))
    catalog_size = (tmp_path / "log" / "catalog").stat().st_size

    assert seen["synced_sizes"] == [catalog_size]  # the topic exists after a power cut; its records may not
    assert len(seen["on_disk"]) == 10
    store.close()


def test_reads_see_only_durable_records(tmp_path: Path):
    async def scenario() -> tuple[list, list]:
        store = _open(tmp_path, "group", group_commit_ms=60_000)
        store.append(TOPIC, make_record(0))
        before = store.read(TOPIC, 0)
        await store.wait_durable()
        after = store.read(TOPIC, 0)
        store.close()
        return before, after

    before, after = asyncio.run(scenario())

    assert before == []
    assert [record.offset for record in after] == [0]


def test_callbacks_fire_in_order_and_only_for_what_was_appended_before(tmp_path: Path):
    async def scenario() -> list[tuple[str, int]]:
        store = _open(tmp_path, "group", group_commit_ms=1)
        fired: list[tuple[str, int]] = []
        store.append(TOPIC, make_record(0))
        store.when_durable(lambda: fired.append(("first", store.log_info(TOPIC).end_offset)))
        store.append(TOPIC, make_record(1))
        store.when_durable(lambda: fired.append(("second", store.log_info(TOPIC).end_offset)))
        await store.wait_durable()
        store.when_durable(lambda: fired.append(("nothing pending", store.log_info(TOPIC).end_offset)))
        await asyncio.sleep(0)
        store.close()
        return fired

    fired = asyncio.run(scenario())

    assert [name for name, _ in fired] == ["first", "second", "nothing pending"]
    assert all(end >= 1 for _, end in fired)
    assert fired[1][1] == 2


def assert_stopped_after_record_0(errors: list[BaseException], store: LogStore) -> None:
    """A failed sync reported StorageFailed once to its waiter, the store refuses appends, record 0 stays."""
    assert len(errors) == 1 and isinstance(errors[0], StorageFailed)
    with pytest.raises(StorageFailed):
        store.append(TOPIC, make_record(2))
    assert [record.offset for record in store.read(TOPIC, 0)] == [0]


def test_a_failed_write_is_reported_and_stops_appends(tmp_path: Path):
    async def scenario() -> tuple[list, LogStore]:
        store = _open(tmp_path, "group", group_commit_ms=20, segment_bytes=100)  # a segment per record
        store.append(TOPIC, make_record(0))
        await store.wait_durable()
        errors: list[BaseException] = []
        store.append(TOPIC, make_record(1))
        store.append("other/topic", make_record(0))
        shutil.rmtree(tmp_path / "log" / "00")  # the next write cannot create its segment
        store.when_durable(lambda: errors.append(AssertionError("must not be called")), errors.append)
        with pytest.raises(StorageFailed):
            await store.wait_durable()
        return errors, store

    errors, store = asyncio.run(scenario())

    assert_stopped_after_record_0(errors, store)


def test_without_an_event_loop_appends_wait_for_flush(tmp_path: Path):
    store = _open(tmp_path, "group")
    store.append(TOPIC, make_record(0))

    assert store.read(TOPIC, 0) == []
    store.flush()
    assert [record.offset for record in store.read(TOPIC, 0)] == [0]
    store.close()


class SyncfsSpy:
    """Counts syncfs calls made by the writer thread (the real call still happens)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = group_commit.sync_filesystem

        def spying(fd: int) -> None:
            self.calls += 1
            real(fd)

        monkeypatch.setattr(group_commit, "sync_filesystem", spying)


async def _one_record_per_topic(store: LogStore, directory: Path, topics: list[str], spies) -> dict:
    fsync_spy, syncfs_spy = spies
    seen: dict = {}
    done = asyncio.Event()

    def on_durable() -> None:
        seen["fdatasyncs"] = len(fsync_spy.sizes)
        seen["syncfs"] = syncfs_spy.calls
        other = _copy_of_files(directory)
        seen["on_disk"] = {topic: len(other.read(topic, 0)) for topic in topics}
        other.close()
        done.set()

    for number, topic in enumerate(topics):
        store.append(topic, make_record(number))
    store.when_durable(on_durable)
    await asyncio.wait_for(done.wait(), 10)
    return seen


def test_a_window_touching_many_files_is_made_durable_by_one_syncfs(tmp_path: Path, monkeypatch):
    """A cluster member's window may touch many partitions (and each new segment's open index)."""
    assert syncfs_available()  # Linux >= 5.8, as on every machine this project targets
    spies = FsyncSpy(monkeypatch), SyncfsSpy(monkeypatch)
    topics = [f"device/{number}/telemetry" for number in range(10)]
    store = _open(tmp_path, "group", group_commit_ms=20, syncfs_min_segments=4, partitions=8)

    seen = asyncio.run(_one_record_per_topic(store, tmp_path, topics, spies))

    assert (seen["syncfs"], seen["fdatasyncs"]) == (1, 0)
    assert seen["on_disk"] == dict.fromkeys(topics, 1)
    store.close()


def test_by_default_a_window_of_two_files_or_more_is_one_syncfs_and_a_window_of_one_file_an_fdatasync(
    tmp_path: Path, monkeypatch
):
    """A cluster member's windows touch a few partitions' segments each: one syncfs costs less CPU than
    their fdatasyncs at once (bench/sync_window_bench.py). The window of a topic's first record touches its
    segment, the segment's new open index and the catalog; a later window of that topic, the segment alone."""
    assert syncfs_available()
    spies = FsyncSpy(monkeypatch), SyncfsSpy(monkeypatch)
    store = _open(tmp_path, "group", group_commit_ms=20)
    assert store.config.syncfs_min_segments == 2

    first = asyncio.run(_one_record_per_topic(store, tmp_path, ["device/1/telemetry"], spies))
    later = asyncio.run(_one_record_per_topic(store, tmp_path, ["device/1/telemetry"], spies))

    assert (first["syncfs"], first["fdatasyncs"]) == (1, 0)
    assert (later["syncfs"], later["fdatasyncs"]) == (1, 1)
    assert later["on_disk"] == {"device/1/telemetry": 2}
    store.close()


def test_a_window_touching_few_files_fdatasyncs_them_all_at_once(tmp_path: Path, monkeypatch):
    """Ten topics in one partition: one segment (and its open index, new) and the catalog (new topics)."""
    spies = FsyncSpy(monkeypatch), SyncfsSpy(monkeypatch)
    topics = [f"device/{number}/telemetry" for number in range(10)]
    store = _open(tmp_path, "group", group_commit_ms=20, syncfs_min_segments=4)

    seen = asyncio.run(_one_record_per_topic(store, tmp_path, topics, spies))

    assert (seen["syncfs"], seen["fdatasyncs"]) == (0, 3)
    assert store.committer.sync_plan.parallel_syncs == 1  # one window: its three syncs issued together
    assert all(thread.name.startswith("timestone-log-sync") for thread in spies[0].threads)
    assert seen["on_disk"] == dict.fromkeys(topics, 1)
    store.close()


def test_the_none_policy_acknowledges_a_window_without_the_writer_thread(tmp_path: Path, monkeypatch):
    """Records are only written; a new topic's catalog entry would be synced (by the writer thread), so the
    topic is created by an earlier run."""
    earlier = _open(tmp_path, "none")
    earlier.append(TOPIC, make_record(0))
    earlier.close()
    spy = FsyncSpy(monkeypatch)
    writers_before = _writer_threads()
    store = _open(tmp_path, "none", group_commit_ms=1)

    seen = asyncio.run(_append_and_wait(store, tmp_path, 5, spy, first=1))

    assert len(seen["on_disk"]) == 6  # written to the OS: another reader of the files sees them
    assert spy.sizes == []
    assert threading.main_thread() is seen["thread"]
    assert _writer_threads() == writers_before
    store.close()


def _writer_threads() -> set[threading.Thread]:
    return {thread for thread in threading.enumerate() if thread.name == "timestone-log-writer"}


async def _one_more_and_wait(store: LogStore, directory: Path, count: int, spy: FsyncSpy) -> dict:
    """Append a first record and wait (the new segment and its directories go through the writer), then
    append `count` more in one window and wait for them."""
    store.append(TOPIC, make_record(0))
    await store.wait_durable()
    spy.sizes.clear()
    spy.threads.clear()
    before = store.committer.inline_syncs
    seen: dict = {}
    done = asyncio.Event()

    def on_durable() -> None:
        seen["synced_sizes"] = list(spy.sizes)
        seen["syncing_threads"] = set(spy.threads)
        seen["bytes"] = store.log_info(TOPIC).bytes
        seen["on_disk"] = _records_on_disk(directory)
        done.set()

    for number in range(1, count + 1):
        store.append(TOPIC, make_record(number))
    store.when_durable(on_durable)
    await asyncio.wait_for(done.wait(), 10)
    seen["inline"] = store.committer.inline_syncs - before
    return seen


def test_a_small_window_is_fdatasynced_on_the_loop_while_the_writer_is_idle(tmp_path: Path, monkeypatch):
    spy = FsyncSpy(monkeypatch)
    store = _open(tmp_path, "group", inline_sync_max_bytes=16384)

    seen = asyncio.run(_one_more_and_wait(store, tmp_path, 1, spy))

    assert seen["inline"] == 1
    assert seen["syncing_threads"] == {threading.main_thread()}
    assert max(seen["synced_sizes"]) >= seen["bytes"]  # synced before it was acknowledged
    assert len(seen["on_disk"]) == 2
    store.close()


@pytest.mark.parametrize("settings", [{}, {"inline_sync_max_bytes": 256}])
def test_a_larger_window_or_inline_syncs_off_goes_to_the_writer_thread(tmp_path: Path, monkeypatch, settings):
    spy = FsyncSpy(monkeypatch)
    store = _open(tmp_path, "group", **settings)

    seen = asyncio.run(_one_more_and_wait(store, tmp_path, 20, spy))  # 20 records: over 256 bytes

    assert seen["inline"] == 0
    assert threading.main_thread() not in seen["syncing_threads"]
    assert max(seen["synced_sizes"]) >= seen["bytes"]
    assert len(seen["on_disk"]) == 21
    store.close()


def test_a_failed_fdatasync_on_the_loop_is_reported_and_stops_appends(tmp_path: Path, monkeypatch):
    real = os.fdatasync

    async def scenario() -> tuple[list, LogStore]:
        store = _open(tmp_path, "group", inline_sync_max_bytes=16384)
        store.append(TOPIC, make_record(0))
        await store.wait_durable()

        def failing(fd: int) -> None:
            if threading.current_thread() is threading.main_thread():
                raise OSError(5, "Input/output error")
            real(fd)

        monkeypatch.setattr(os, "fdatasync", failing)
        errors: list[BaseException] = []
        store.append(TOPIC, make_record(1))
        store.when_durable(lambda: errors.append(AssertionError("must not be called")), errors.append)
        with pytest.raises(StorageFailed):
            await store.wait_durable()
        return errors, store

    errors, store = asyncio.run(scenario())

    assert_stopped_after_record_0(errors, store)


def test_ending_a_window_syncs_it_at_once_or_right_after_the_job_in_flight(tmp_path: Path, monkeypatch):
    gate = threading.Event()
    gate.set()
    real = os.fdatasync

    def gated(fd: int) -> None:
        gate.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", gated)

    async def scenario() -> tuple[list[str], list[str], int]:
        store = _open(tmp_path, "group", inline_sync_max_bytes=1024)
        store.append(TOPIC, make_record(0))
        await store.wait_durable()
        idle: list[str] = []
        store.append(TOPIC, make_record(1))
        store.when_durable(lambda: idle.append("durable"))
        store.end_window()  # the writer is idle: synced on the loop, complete before it returns
        idle.append("returned")

        gate.clear()
        busy: list[str] = []
        for number in range(2, 40):  # over the inline bound: this window goes to the (held) writer
            store.append(TOPIC, make_record(number))
        store.end_window()
        store.append(TOPIC, make_record(40))  # joins the next window
        store.when_durable(lambda: busy.append("durable"))
        store.end_window()  # a job is in flight: this window is cut once it completes
        busy.append("returned")
        await asyncio.sleep(0.05)
        gate.set()
        await asyncio.wait_for(store.wait_durable(), 10)
        jobs = store.committer.jobs_completed
        store.close()
        return idle, busy, jobs

    idle, busy, jobs = asyncio.run(scenario())

    assert idle == ["durable", "returned"]
    assert busy == ["returned", "durable"]
    assert jobs == 4  # the first record, record 1, records 2-39, record 40


def test_a_replicated_store_cuts_a_window_behind_one_job_in_flight_but_not_two(tmp_path: Path, monkeypatch):
    gate = threading.Event()
    real = os.fdatasync

    def slow_sync(fd: int) -> None:
        gate.wait(10)  # holds every job in its fsync until the end
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_sync)

    async def scenario() -> tuple[list[int], list[int], list[int]]:
        # fdatasyncs only: the first job (a new segment and the catalog) would be one syncfs, not held
        store = _open(tmp_path, "group", syncfs_min_segments=0)
        store.replicated_log.enable()
        in_flight: list[int] = []
        pending: list[int] = []
        durable_at: list[int] = []
        for window in range(3):  # one window per loop iteration
            store.append(TOPIC, make_record(window))
            store.when_durable(lambda: durable_at.append(store.committer.jobs_completed))
            for _ in range(3):
                await asyncio.sleep(0)
            in_flight.append(store.committer.in_flight)
            pending.append(store.pending_bytes)
        gate.set()
        await asyncio.wait_for(store.wait_durable(), 10)
        store.close()
        return in_flight, pending, durable_at

    in_flight, pending, durable_at = asyncio.run(scenario())

    assert in_flight == [1, 2, 2]  # the second window queued behind the first, the third waits
    assert pending[:2] == [0, 0] and pending[2] > 0
    assert durable_at == [1, 2, 3]  # in order, the third cut once a job completed


def test_a_pipeline_depth_below_one_is_refused(tmp_path: Path):
    store = _open(tmp_path, "group")
    try:
        with pytest.raises(ValueError, match="at least 1"):
            store.committer.pipeline(0)
    finally:
        store.close()


@pytest.mark.parametrize(
    ("durability", "settings"),
    [
        ("group", {}),  # the writer thread
        ("group", {"inline_sync_max_bytes": 1 << 20}),  # a small window: fdatasynced on the loop
        ("group", {"syncfs_min_segments": 1}),  # one syncfs
        ("fsync", {}),
    ],
)
def test_a_store_whose_directory_was_removed_acknowledges_nothing_more(
    tmp_path: Path, durability: Durability, settings: dict
):
    """Its descriptors still write into the deleted files: a sync that passes there is no durability."""

    async def scenario() -> LogStore:
        store = _open(tmp_path, durability, **settings)
        store.append(TOPIC, make_record(0))
        await store.wait_durable()
        shutil.rmtree(tmp_path)
        store.append(TOPIC, make_record(1))
        with pytest.raises(StorageFailed, match="deleted while the broker ran") as failed:
            await store.wait_durable()
        assert str(tmp_path / "log" / "00") in str(failed.value)
        return store

    store = asyncio.run(scenario())
    with pytest.raises(StorageFailed):
        store.append(TOPIC, make_record(2))
    assert store.log_info(TOPIC).end_offset == 1  # record 1 never readable
    store.close()
