"""QoS 2 ids a crash left in the log only: the records since the snapshot against the journal's lines."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from broker_edge.engine.sessions.snapshot import SnapshotError, parse
from broker_edge.runtime import qos2_log_ids
from broker_edge.runtime.qos2_journal import Qos2Journal
from broker_edge.runtime.qos2_log_ids import hold_logged_ids
from broker_edge.runtime.session_store import SESSIONS_FILE, SessionStore
from broker_edge.settings.broker import SessionsConfig
from broker_edge.storage import LogStore
from broker_edge.storage.config import StorageConfig
from broker_edge.storage.record import RecordFields, qos_with_packet_id
from broker_edge.storage.replicated_log import ReplicatedLog
from tests.unit.broker_edge.runtime.test_qos2_journal import restored_router


def _record(client_id: str, packet_id: int | None, payload: bytes = b"m") -> RecordFields:
    """A QoS 2 record keeping ``packet_id`` (version 2), or none (version 1, an older broker's)."""
    qos = 2 if packet_id is None else qos_with_packet_id(2, packet_id)
    return (payload, qos, False, client_id, (), None, None, None, None, None)


def _append_qos2(store: LogStore, topic: str, client_id: str, packet_id: int | None) -> None:
    store.append_batch(topic, [_record(client_id, packet_id)])


@pytest.mark.parametrize("columnar", [True, False])
def test_an_id_with_more_records_than_releases_and_no_held_line_is_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, columnar: bool
) -> None:
    """Read as runs of frames, or as records (a broker without numpy): the same ids."""
    monkeypatch.setattr(qos2_log_ids, "COLUMNAR", columnar)
    store = LogStore(tmp_path / "data", StorageConfig())
    store.open()
    try:
        _append_qos2(store, "t/before", "dev", 1)  # before the snapshot: not looked at
        store.flush()
        since = store.end_offsets()
        _append_qos2(store, "t/a", "dev", 2)  # answered and released, then reused: the crash came first
        _append_qos2(store, "t/b", "dev", 2)
        _append_qos2(store, "t/a", "dev", 3)  # answered, released
        _append_qos2(store, "t/a", "dev", 4)  # answered (held)
        _append_qos2(store, "t/a", "dev", 5)  # appended, then the crash
        _append_qos2(store, "t/a", "dev", None)  # a record without an id (an older broker's)
        _append_qos2(store, "t/a", "other", 6)  # a client without a persistent session
        store.flush()
        journals = tmp_path / "meta"
        journals.mkdir()
        journal = Qos2Journal(journals)
        for packet_id, held in ((2, True), (2, False), (3, True), (3, False), (4, True)):
            journal.record("dev", packet_id, held)
        journal.close()
        router = restored_router("dev")
        replayed = Qos2Journal(journals)
        state = replayed.replay(router, None)
        router.qos2_journal = replayed.record
        assert hold_logged_ids(router, store, since, state) == 2
        assert router.sessions["dev"].incoming_qos2 == {2, 4, 5}
        assert not router.sessions["dev"].reused(5, dup=True)  # its resend: answered, not logged again
        replayed.close()
        again = restored_router("dev")
        assert Qos2Journal(journals).replay(again, None).held == 3  # written: a second crash has them
    finally:
        store.close()


def _partition_ends(store: LogStore) -> list[int]:
    return [partition.end for partition in store.partitions()]


def _damage(data: Path, payload: bytes) -> None:
    """Flip a byte of the one record carrying ``payload`` in the log's files (its frame fails its CRC)."""
    for path in (data / "log").rglob("*.log"):
        content = bytearray(path.read_bytes())
        at = content.find(payload)
        if at >= 0:
            content[at] ^= 0xFF
            path.write_bytes(bytes(content))
            return
    raise AssertionError(f"no record carries {payload!r}")


@pytest.mark.parametrize(
    "positions_at", ["the snapshot", "the snapshot, a cluster's store", "a later round", None]
)
def test_many_topics_across_partitions_give_back_exactly_their_ids_since_the_snapshot(
    tmp_path: Path, positions_at: str | None
) -> None:
    """Records of 40 device topics over 3 partitions, interleaved, versions 1 and 2 mixed; a record
    damaged at one log's tail and one in the middle of another: a log's ids stop at its damage. Read in
    log order from the partitions' positions at the snapshot (or later ones: the records before them are
    read log by log), or log by log (a snapshot without them, a store read by topic only)."""
    data = tmp_path / "data"
    store = LogStore(data, StorageConfig(partitions=3))
    store.open()
    topics = [f"fleet/dev-{n}/events" for n in range(40)]
    for n, topic in enumerate(topics):  # before the snapshot: never counted
        store.append_batch(topic, [_record(f"dev-{n}", 1, b"old")])
    store.flush()
    positions = _partition_ends(store) if positions_at and positions_at.startswith("the snapshot") else None
    since = store.end_offsets()
    expected: Counter[tuple[str, int]] = Counter()
    for round_ in range(6):
        if round_ == 2 and positions_at == "a later round":
            positions = _partition_ends(store)
        for n, topic in enumerate([*topics, "fleet/new/events"]):  # a topic the snapshot does not know
            client = "stranger" if n == 7 else f"dev-{n}"  # (no persistent session)
            packet_id = None if (n + round_) % 3 == 0 else round_ * 100 + n % 5 + 1  # version 1 or 2
            payload = f"{topic} {round_}".encode()
            store.append_batch(topic, [_record(client, packet_id, payload)])
            damaged = {topics[3]: 5, topics[4]: 3}.get(topic, 6)  # dev-3's last record, dev-4's fourth
            if packet_id is not None and client != "stranger" and round_ < damaged:
                expected[(client, packet_id)] += 1
    store.flush()
    store.file_pool.close()  # a crash: nothing sealed
    _damage(data, f"{topics[3]} 5".encode())
    _damage(data, f"{topics[4]} 3".encode())
    store = LogStore(data, StorageConfig(partitions=3))
    store.open()
    if positions_at == "the snapshot, a cluster's store":
        ReplicatedLog(store).enable()
    try:
        assert len({store.partition_of(topic) for topic in topics}) == 3
        clients = {f"dev-{n}" for n in range(41)}
        assert qos2_log_ids.logged_ids(store, since, clients, positions) == expected
    finally:
        store.close()


def test_the_snapshot_keeps_each_partitions_end_and_a_start_after_a_crash_reads_from_there(
    tmp_path: Path,
) -> None:
    """The sessions' snapshot names each partition's end position (taken before the logs' ends); a start
    after a crash holds the ids of the records past them; a snapshot of a broker before it names none."""
    store = LogStore(tmp_path / "data", StorageConfig(partitions=2))
    store.open()
    meta = tmp_path / "data" / "meta"
    loop = asyncio.new_event_loop()
    try:
        _append_qos2(store, "t/a", "dev", 1)
        _append_qos2(store, "t/b", "dev", 2)
        loop.run_until_complete(
            SessionStore(meta, restored_router("dev"), store, SessionsConfig(), loop).close()
        )
        ends = _partition_ends(store)
        document = json.loads((meta / SESSIONS_FILE).read_text())
        assert document["log_positions"] == ends and sum(ends) == 2
        _append_qos2(store, "t/a", "dev", 3)  # appended, then the crash
        _append_qos2(store, "t/b", "dev", 4)
        store.flush()
        sessions = SessionStore(meta, restored_router(), store, SessionsConfig(), loop)
        assert sessions.restore() == 1
        assert sessions.router.sessions["dev"].incoming_qos2 == {3, 4}
        sessions.journal.close()
        del document["log_positions"], document["check"]
        assert parse(document).log_positions is None
        with pytest.raises(SnapshotError, match="log_positions"):
            parse({**document, "log_positions": [1, -1]})
    finally:
        loop.close()
        store.close()
