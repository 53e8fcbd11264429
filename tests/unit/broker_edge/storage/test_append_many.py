"""`append_batches` of many topics at once (`PartitionLog.append_many`): the same offsets, bytes on disk and
index rows as appending each batch alone, and a refused batch leaves the others appended."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker_edge.storage import (
    InvalidRecord,
    LogStore,
    RecordTooLarge,
    StorageConfig,
    TooManyTopics,
    store_appends,
)
from broker_edge.storage.clock import Clock
from broker_edge.storage.persistence import CREATES_LOG, LOGGED
from tests.unit.broker_edge.storage.log_helpers import make_record, odd_record

NOW_MS = 1_700_000_123_456


class _Stopped(Clock):
    """A wall clock that stays at `NOW_MS`: the appends of one turn and of many are stamped alike."""

    __slots__ = ()

    def wall_ms(self) -> int:
        return NOW_MS


def _plain(number: int, retain: bool = False) -> tuple:
    """A record without MQTT 5 fields (what a device's QoS 1 publish is)."""
    return (
        f"reading-{number}".encode(),
        1,
        retain,
        f"device-{number % 5}",
        (),
        None,
        None,
        None,
        None,
        None,
    )


def _turns() -> list[list[tuple[str, list[tuple]]]]:
    """Loop turns of a fleet: new topics, quiet ones again, a topic that grows busy (past `HOT` rows of one
    segment) and appends twice a turn, a batch of several records, records with MQTT 5 fields, odd ones, an
    empty batch."""
    turns = []
    for turn in range(40):
        batches: list[tuple[str, list[tuple]]] = [
            (f"fleet/device-{device}", [_plain(turn * 100 + device, retain=device == 3)])
            for device in range(turn % 7, turn % 7 + 12)
        ]
        batches.append(("fleet/busy", [_plain(turn)]))
        batches.append(("fleet/busy", [_plain(turn + 1_000)]))  # twice a turn: busy within one call too
        batches.append(("fleet/several", [_plain(turn), _plain(turn + 1)]))
        batches.append((f"fleet/fields-{turn % 3}", [make_record(turn).batch_fields()]))
        batches.append((f"fleet/odd-{turn % 4}", [odd_record(turn).batch_fields()]))
        batches.append(("fleet/quiet", []))
        turns.append(batches)
    return turns


def _open(directory: Path, **settings) -> LogStore:
    store = LogStore(directory, StorageConfig(**settings), clock=_Stopped())
    store.open()
    return store


def _state(store: LogStore) -> tuple[dict[str, bytes], list[tuple], list[int]]:
    """Every file's bytes under the partition logs, every in-memory row, every topic's next offset."""
    files = {
        str(path.relative_to(store.layout.log)): path.read_bytes()
        for path in sorted(Path(store.layout.log).rglob("*"))
        if path.is_file() and not path.name.endswith(".index")
    }
    rows = []
    for part in store.partition_logs:
        for segment in part.segments:
            index = segment.rows
            if index is not None:
                columns = (index.topic_ids, index.positions, index.offsets, index.times, index.prevs)
                rows.append((part.number, segment.number, *(list(column) for column in columns)))
                rows.append(tuple(sorted((topic_id, list(hot)) for topic_id, hot in index.hot.items())))
    table = store._table
    return files, rows, [*table.next, *table.head_seg, *table.head_first, *table.head_last, *table.index_ms]


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"partitions": 3},
        {"segment_bytes": 2_000},
        {"segment_bytes": 3_000, "partitions": 2, "segment_ms": 0},
    ],
)
def test_many_topics_at_once_give_the_offsets_bytes_and_rows_of_each_batch_alone(
    tmp_path: Path, settings: dict
):
    settings = {"durability": "none", **settings}
    alone, together = _open(tmp_path / "alone", **settings), _open(tmp_path / "together", **settings)
    firsts_alone, firsts_together = [], []
    for batches in _turns():
        firsts_alone += [alone.append_batch(topic, records, NOW_MS) for topic, records in batches]
        firsts_together += together.append_batches(batches)
        alone.flush()
        together.flush()
        assert _state(together) == _state(alone)
    reads = [store.read(topic, 0, 1000) for store in (alone, together) for topic in sorted(store.topics())]
    alone.close()
    together.close()

    assert firsts_together == firsts_alone
    assert [[record.frame for record in read] for read in reads[: len(reads) // 2]] == [
        [record.frame for record in read] for read in reads[len(reads) // 2 :]
    ]
    assert len(reads[0]) == 80  # fleet/busy: past HOT rows of a segment


def test_a_refused_topic_among_many_leaves_the_others_appended(tmp_path: Path):
    store = _open(tmp_path, max_record_bytes=200, max_topics=5)
    store.append_batches([("fleet/device-0", [_plain(0)])])
    batches = [
        ("fleet/device-0", [_plain(1)]),
        ("fleet/device-1", [_plain(2)]),
        ("fleet/device-2", [(b"x" * 1_000, 1, False, "d", (), None, None, None, None, None)]),  # too large
        ("fleet/device-3", [(b"x", 1, False, "c" * 70_000, (), None, None, None, None, None)]),  # id too long
        ("fleet/device-4", [_plain(3)]),
        ("fleet/device-5", [_plain(4)]),  # a sixth topic: over max_topics
        ("fleet/device-1", [_plain(5)]),
    ]
    results = store.append_batches(batches)
    store.flush()
    held = {topic: [record.payload for record in store.read(topic, 0, 10)] for topic in store.topics()}
    store.close()

    assert results[:2] == [1, 0] and results[4:5] == [0] and results[6] == 1
    assert isinstance(results[2], RecordTooLarge)
    assert isinstance(results[3], InvalidRecord)
    assert isinstance(results[5], TooManyTopics)
    assert held == {
        "fleet/device-0": [b"reading-0", b"reading-1"],
        "fleet/device-1": [b"reading-2", b"reading-5"],
        "fleet/device-2": [],
        "fleet/device-3": [],
        "fleet/device-4": [b"reading-3"],
    }


def test_new_topics_of_one_turn_get_ids_in_order_and_survive_a_restart(tmp_path: Path):
    store = _open(tmp_path, partitions=4)
    topics = [f"fleet/device-{number}" for number in range(50)]
    results = store.append_batches([(topic, [_plain(number)]) for number, topic in enumerate(topics)])
    store.flush()
    ids = [store.topic_id(topic) for topic in topics]
    store.close()
    reopened = _open(tmp_path, partitions=4)
    held = [[record.payload for record in reopened.read(topic, 0, 10)] for topic in topics]
    created = reopened.logs_created_by("device-0")
    reopened.close()

    assert results == [0] * 50
    assert ids == list(range(50))
    assert held == [[f"reading-{number}".encode()] for number in range(50)]
    assert created == 0  # counted since open only


@pytest.mark.parametrize("durability", ["group", "fsync"])
def test_the_ids_persist_as_found_serve_the_appends_and_publishes_after_it(tmp_path: Path, durability: str):
    store = _open(tmp_path, partitions=3, durability=durability)
    topics = [f"fleet/device-{number}" for number in range(6)]
    store.append_batches([(topic, [_plain(0)]) for topic in topics])
    asked = [store.persist_as(topic, 1) for topic in reversed(topics)]
    results = store.append_batches(
        [(topic, [_plain(1)]) for topic in topics[::2]] + [("fleet/new", [_plain(1)])]
    )
    kept = dict(store._asked)
    ids = {topic: store._ids.get(topic) for topic in topics}
    asked_again = [store.persist_as(topic, 1) for topic in topics] + [store.persist_as("fleet/other", 1)]
    store.flush()
    held = {topic: [record.payload for record in store.read(topic, 0, 10)] for topic in topics}
    store.close()

    assert asked == [LOGGED] * 6
    assert results == [1, 1, 1, 0]
    assert kept == ids, "every topic asked about, with its id; the log the append made was not asked about"
    assert asked_again == [LOGGED] * 6 + [CREATES_LOG]
    assert held == {
        topic: [b"reading-0", b"reading-1"] if number % 2 == 0 else [b"reading-0"]
        for number, topic in enumerate(topics)
    }


def test_the_ids_kept_for_publishes_are_bounded_and_answers_stay_right_past_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(store_appends, "ASKED_MAX", 4)
    store = _open(tmp_path, partitions=2)
    topics = [f"fleet/device-{number}" for number in range(10)]
    store.append_batches([(topic, [_plain(0)]) for topic in topics])
    sizes = []
    answers = []
    for _ in range(2):
        for topic in topics:
            answers.append(store.persist_as(topic, 1))
            sizes.append(len(store._asked))
    results = store.append_batches([(topic, [_plain(1)]) for topic in topics])
    store.close()

    assert max(sizes) == 4, "emptied once full, never more than the bound"
    assert answers == [LOGGED] * 20
    assert results == [1] * 10, "ids found past the bound append to the right logs"
