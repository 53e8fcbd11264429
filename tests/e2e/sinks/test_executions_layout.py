"""``action_executions`` laid out by action: once maintenance has clustered it, a read or a merge filtered on
one action opens the files that can hold that action, not the table's history, and reads the right rows.

Real Delta tables on disk, written through the engine's own table code (``EngineTables``: a fanout merge per
action, then report merges touching the actions in flight, each narrowed to the actions it writes), then
maintained by the store's compaction and by the jobs' background scheduler while the writes go on.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from random import Random

import pytest
from deltalake import DeltaTable

from pipelines.actions.engine_tables import EXECUTIONS, EngineTables
from pipelines.actions.states import Execution
from pipelines.maintenance.config import MaintenanceConfig
from pipelines.maintenance.scheduler import MaintenanceScheduler
from sinks import open_table_store
from sinks.clustering import DataFile, plan
from sinks.delta_rs import DeltaRsTableStore
from sinks.store import Matching

ACTIONS = 24
DEVICES = 30
IN_FLIGHT = 3
#: Small files, so that the table's 720 rows make several packs (a pack of ~10 actions each).
TARGET = 24 << 10


def action_ids(count: int, seed: int = 7) -> list[str]:
    """Random UUIDs, as users name actions: no order follows the time they were written in."""
    rng = Random(seed)
    return [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(count)]


def executions(action_id: str, state: str, version: int, devices: range = range(DEVICES)) -> list[Execution]:
    return [
        Execution(
            action_id, f"d{i:03}", state, version, version, f"{state} v{version}", 1_000, 1_000 + version
        )
        for i in devices
    ]


class History:
    """Writes like the engine: each action fanned out, then reports for the actions in flight."""

    def __init__(self, store: DeltaRsTableStore) -> None:
        self.tables = EngineTables(store)
        self.batch = 0
        self.expected: dict[str, dict[str, int]] = {}  # action -> device -> version

    def write(self, rows: list[Execution]) -> None:
        self.tables.write_executions(rows, "job", self.batch)
        self.batch += 1
        for row in rows:
            self.expected.setdefault(row.action_id, {})[row.device_id] = row.version

    def run(self, actions: list[str]) -> None:
        for k, action in enumerate(actions):
            self.write(executions(action, "QUEUED", 1))
            in_flight = actions[max(0, k - IN_FLIGHT + 1) : k + 1]
            self.write([row for a in in_flight for row in executions(a, "IN_PROGRESS", 2 + k, range(10))])


@pytest.fixture
def store(tmp_path) -> DeltaRsTableStore:
    opened = open_table_store(None, str(tmp_path / "tables"), backend="delta-rs")
    assert isinstance(opened, DeltaRsTableStore)
    return opened


def rows_in(store: DeltaRsTableStore, paths: list[str]) -> int:
    actions = DeltaTable(store.location(EXECUTIONS)).get_add_actions(flatten=True)
    listed, records = actions.column("path").to_pylist(), actions.column("num_records").to_pylist()
    counted = dict(zip(listed, records, strict=True))
    return sum(counted[p] for p in paths)


def read_back(store: DeltaRsTableStore, action: str) -> dict[str, int]:
    table = store.read_arrow(EXECUTIONS, where=[Matching("action_id", (action,))])
    assert set(table["action_id"].to_pylist()) == {action}
    return dict(zip(table["device_id"].to_pylist(), table["version"].to_pylist(), strict=True))


def test_a_read_filtered_on_one_action_opens_only_the_files_that_can_hold_it(store):
    history = History(store)
    actions = action_ids(ACTIONS)
    assert store.read_arrow(EXECUTIONS, where=[Matching("action_id", (actions[0],))]).num_rows == 0  # no file
    history.run(actions)
    total = rows_in(store, store.files_read(EXECUTIONS))
    assert total == ACTIONS * DEVICES
    early = actions[2]
    # merges rewrite whole files: the in-flight actions' rows drag the finished ones along, file after file
    assert rows_in(store, store.files_read(EXECUTIONS, [Matching("action_id", (early,))])) > total // 2

    removed = store.compact(EXECUTIONS, TARGET, min_files=2, settle_s=0)

    assert removed >= 1
    files = store.data_files(EXECUTIONS)
    assert files >= 3
    for action in actions:
        opened = store.files_read(EXECUTIONS, [Matching("action_id", (action,))])
        assert 1 <= len(opened) <= 2, (action, opened)
        assert rows_in(store, opened) <= total // 4  # a pack of a few actions, not the table
        assert read_back(store, action) == history.expected[action]
    assert store.compact(EXECUTIONS, TARGET, min_files=2, settle_s=0) == 0  # laid out: nothing to do


def test_the_read_never_touches_the_files_it_rules_out(store):
    history = History(store)
    actions = action_ids(ACTIONS)
    history.run(actions)
    store.compact(EXECUTIONS, TARGET, min_files=2, settle_s=0)
    wanted = actions[5]
    opened = set(store.files_read(EXECUTIONS, [Matching("action_id", (wanted,))]))
    others = set(store.files_read(EXECUTIONS)) - opened
    assert others
    for path in others:  # a read that opened one of these would fail
        with open(f"{store.location(EXECUTIONS)}/{path}", "wb") as handle:
            handle.write(b"not parquet")
    assert read_back(store, wanted) == history.expected[wanted]


def test_a_merge_into_one_action_scans_only_its_files(store):
    history = History(store)
    actions = action_ids(ACTIONS)
    history.run(actions)
    store.compact(EXECUTIONS, TARGET, min_files=2, settle_s=0)
    files = store.data_files(EXECUTIONS)

    history.write(executions(actions[0], "SUCCEEDED", 100, range(5)))

    metrics = DeltaTable(store.location(EXECUTIONS)).history(1)[0]["operationMetrics"]
    assert metrics["num_target_files_scanned"] <= 2
    assert metrics["num_target_files_skipped_during_scan"] >= files - 2
    assert read_back(store, actions[0]) == history.expected[actions[0]]


def test_clustering_changes_no_row_marker_or_change_feed(store):
    history = History(store)
    history.run(action_ids(8))
    version = store.version(EXECUTIONS)
    before = store.read_arrow(EXECUTIONS).sort_by([("action_id", "ascending"), ("device_id", "ascending")])

    assert store.compact(EXECUTIONS, TARGET, min_files=2, settle_s=0) >= 1

    after = store.read_arrow(EXECUTIONS).sort_by([("action_id", "ascending"), ("device_id", "ascending")])
    assert after.equals(before)
    assert store.committed_batch(EXECUTIONS, "job") == history.batch - 1
    assert not store.merge(EXECUTIONS, before.slice(0, 1), "job", history.batch - 1)  # a replay: skipped
    changes = DeltaTable(store.location(EXECUTIONS)).load_cdf(starting_version=version + 1).read_all()
    assert changes.num_rows == 0  # readers of the change feed see nothing


def test_the_jobs_maintenance_lays_the_table_out_while_the_engine_writes(store):
    config = MaintenanceConfig(compact_interval_s=0.001, target_file_mb=1, min_files=2, settle_s=0)
    scheduler = MaintenanceScheduler(store, [EXECUTIONS], config)
    scheduler.policy = replace(scheduler.policy, target_bytes=TARGET)
    history = History(store)
    actions = action_ids(ACTIONS, seed=11)
    stop = threading.Event()

    def maintain() -> None:
        while not stop.is_set():
            scheduler.poke()
            scheduler.wait()

    background = threading.Thread(target=maintain)
    background.start()
    try:
        history.run(actions)  # every merge may race a pass; neither may lose or repeat a row
    finally:
        stop.set()
        background.join()
    scheduler.close()
    assert [u for u in scheduler.upkeep if u.error] == []
    assert sum(u.count or 0 for u in scheduler.upkeep if u.operation == "compact") > 0
    scheduler.run_now(vacuum=False)  # the in-flight actions' rows settled since

    for action in actions:
        assert read_back(store, action) == history.expected[action]
        assert len(store.files_read(EXECUTIONS, [Matching("action_id", (action,))])) <= 2


def data_file(name: str, low: str, high: str, size: int = 100, modified_ms: int = 0) -> DataFile:
    return DataFile(name, size, 10, low, high, modified_ms)


def test_a_plan_splits_files_of_several_values_and_packs_only_what_settled():
    loose = data_file("part-1.parquet", "a", "f")
    young = data_file("part-2.parquet", "c", "c", modified_ms=2**62)  # written just now: still its own
    singles = [data_file(f"split-{v}.parquet", v, v) for v in "bdeg"]
    planned = plan([loose, young, *singles], target_bytes=1000, min_files=3, settle_ms=60_000)
    assert planned.split == [loose]
    assert planned.packs == [singles]  # the four in one run, the young one left out

    packed = [data_file("packed-1.parquet", "a", "m", size=900), data_file("packed-2.parquet", "n", "z")]
    assert plan(packed, 1000, 2, 0).packs == []  # packs alone stay as they are
    assert plan([*packed, data_file("split-c.parquet", "c", "c")], 1000, 2, 0).packs == [
        [packed[0], DataFile("split-c.parquet", 100, 10, "c", "c", 0)]
    ]
