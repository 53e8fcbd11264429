"""wait_for_data: long-polls wake when a record becomes durable or a new matching log appears."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_edge.storage import LogStore, StorageConfig
from tests.unit.broker_edge.storage.log_helpers import make_record


def _run(directory: Path, scenario, **settings):
    async def main():
        store = LogStore(directory, StorageConfig(**{"group_commit_ms": 1, **settings}))
        store.open()
        try:
            return await scenario(store)
        finally:
            store.close()

    return asyncio.run(main())


async def _later(store: LogStore, topic: str, delay_s: float = 0.02) -> None:
    await asyncio.sleep(delay_s)
    store.append(topic, make_record(0))


def test_a_waiting_reader_wakes_when_its_topic_gets_a_record(tmp_path: Path):
    async def scenario(store: LogStore):
        store.append("a", make_record(0))
        await store.wait_durable()
        appender = asyncio.create_task(_later(store, "a"))
        woke = await store.wait_for_data({"a": 1}, timeout_s=10)
        await appender
        return woke, store.read("a", 1)

    woke, records = _run(tmp_path, scenario)

    assert woke == ["a"]
    assert [record.offset for record in records] == [1]


def test_data_already_there_returns_at_once(tmp_path: Path):
    async def scenario(store: LogStore):
        store.append("a", make_record(0))
        await store.wait_durable()
        return await store.wait_for_data({"a": 0, "b": 0}, timeout_s=10)

    assert _run(tmp_path, scenario) == ["a"]


def test_a_wait_times_out_empty(tmp_path: Path):
    async def scenario(store: LogStore):
        store.append("a", make_record(0))
        await store.wait_durable()
        return await store.wait_for_data({"a": 1}, timeout_s=0.05)

    assert _run(tmp_path, scenario) == []


def test_a_record_that_is_not_durable_yet_does_not_wake_readers(tmp_path: Path):
    async def scenario(store: LogStore):
        store.append("a", make_record(0))
        not_yet = await store.wait_for_data({"a": 0}, timeout_s=0.05)
        waiting = asyncio.create_task(store.wait_for_data({"a": 0}, timeout_s=10))
        await asyncio.sleep(0)
        await store.wait_durable()
        return not_yet, await waiting

    not_yet, woke = _run(tmp_path, scenario, group_commit_ms=60_000)

    assert not_yet == []
    assert woke == ["a"]


def test_a_topic_without_a_log_can_be_waited_on(tmp_path: Path):
    async def scenario(store: LogStore):
        appender = asyncio.create_task(_later(store, "new/topic"))
        woke = await store.wait_for_data({"new/topic": 0}, timeout_s=10)
        await appender
        return woke

    assert _run(tmp_path, scenario) == ["new/topic"]


def test_a_new_log_matching_the_pattern_wakes_the_reader(tmp_path: Path):
    async def scenario(store: LogStore):
        store.append("plant/1", make_record(0))
        await store.wait_durable()
        positions = {"plant/1": 1}
        unrelated = asyncio.create_task(_later(store, "office/1", 0.01))
        matching = asyncio.create_task(_later(store, "plant/2", 0.05))
        woke = await store.wait_for_data(positions, timeout_s=10, pattern="plant/+")
        await asyncio.gather(unrelated, matching)
        return woke

    assert _run(tmp_path, scenario) == ["plant/2"]


def test_a_watcher_of_appends_hears_each_log_once_durable_until_it_stops_watching(tmp_path: Path):
    async def scenario(store: LogStore) -> tuple[list[str], list[str]]:
        heard: list[str] = []
        unwatch = store.watch_advances(heard.append)
        store.append("a", make_record(0))
        store.append("b/c", make_record(0))
        await store.wait_durable()
        before_unwatch = sorted(heard)
        unwatch()
        store.append("a", make_record(1))
        await store.wait_durable()
        return before_unwatch, heard

    before_unwatch, heard = _run(tmp_path, scenario)

    assert before_unwatch == ["a", "b/c"]
    assert sorted(heard) == ["a", "b/c"]
