"""A session's cursor on a topic this broker holds no copy of: read from elsewhere up to where routing
stands here, live copies held back meanwhile, then live delivery, without a gap or a duplicate."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

from broker_edge.engine import cursors
from broker_edge.engine.cursors import ReplayManager
from broker_edge.engine.message import Message
from broker_edge.engine.ports import AppendedRun, ClusterPorts
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.security.limits import LimitsConfig
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.record import Record
from tests.unit.broker_edge.engine.stand_ins import RecordingConnection


class Elsewhere:
    """The ``remote_logs`` port: the log of ``t`` read from another broker; ``end`` is where routing here
    stands (None: not known yet); ``ready`` says whether a read is answered at once."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.end: int | None = None
        self.ready = False
        self.asked: list[int] = []
        self.retries = 0

    def handles(self, topic: str) -> bool:
        return topic == "t"

    def live_end(self, topic: str) -> int | None:
        return self.end

    def read(self, topic: str, offset: int, max_records: int, session: object) -> list[Record] | None:
        self.asked.append(offset)
        if not self.ready:
            return None
        return [record for record in self.records if record.offset >= offset][:max_records]

    def retry_later(self, session: object) -> None:
        self.retries += 1


def test_a_remote_backlog_joins_live_delivery_without_a_gap_or_a_duplicate(tmp_path: Path) -> None:
    async def scenario() -> None:
        leader = LogStore(tmp_path / "leader", StorageConfig(durability="none"))
        leader.open()
        leader.append_batch(
            "t", [(str(n).encode(), 1, False, "p", (), None, None, None, None, None) for n in range(10)]
        )
        await leader.wait_durable()
        records = leader.read("t", 0, 10, 1 << 20)
        here = LogStore(tmp_path / "here", StorageConfig(durability="none"))
        here.open()
        router = Router(LimitsConfig())
        replays = router.replays = ReplayManager(here, None, router.count_drop)
        remote = Elsewhere(records)
        replays.join_cluster(ClusterPorts(remote_logs=remote))
        session = router.restore_session("mover", 300, None, None)
        router.subscribe(session, "t", "t", None, SubscriptionOptions(qos=1))
        session.cursors = {"t": 2}  # acknowledged up to offset 1 on the broker it came from
        connection = RecordingConnection(send_quota=100)
        session.attach(connection)
        assert remote.retries == 1 and connection.sent == []  # where routing stands is not known yet

        remote.end = 5  # the observation started at 5
        router.publish(Message("t", b"5", 1, offset=5))  # routed before the backlog is in: held back
        remote.end = 6
        replays.pump(session)
        assert remote.asked == [2] and connection.sent == []  # being read
        remote.ready = True
        replays.pump(session)
        assert [sent[0] for sent in connection.sent] == [b"2", b"3", b"4", b"5"]
        assert session.cursors is None  # caught up with routing: live from here
        router.publish(Message("t", b"6", 1, offset=6))
        assert [sent[0] for sent in connection.sent] == [b"2", b"3", b"4", b"5", b"6"]
        leader.close()
        here.close()

    asyncio.run(scenario())


class KeptConnection(RecordingConnection):
    """Records the ``Message`` objects delivered as well: whether a read was served the one routed live."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[Message] = []

    def send_message(self, message, qos, retain, subscription_ids, packet_id, dup=False) -> bool:
        self.messages.append(message)
        return super().send_message(message, qos, retain, subscription_ids, packet_id, dup)


async def _appended_durably(store: LogStore, count: int) -> None:
    """Records ``0`` .. ``count - 1`` of ``t``, published by ``p``, durable."""
    store.append_batch(
        "t", [(str(n).encode(), 1, False, "p", (), None, None, None, None, None) for n in range(count)]
    )
    await store.wait_durable()


def test_messages_routed_live_are_kept_for_readers_only_while_sessions_read_logs(
    tmp_path: Path, monkeypatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(cursors, "time", SimpleNamespace(monotonic=lambda: now[0]))
    store = LogStore(tmp_path / "log", StorageConfig(durability="none"))
    store.open()
    asyncio.run(_appended_durably(store, 6))
    router = Router(LimitsConfig())
    replays = router.replays = ReplayManager(store, None, router.count_drop)
    live = [Message("t", str(n).encode(), 1, origin="p", offset=n) for n in range(6)]

    def reader(name: str, cursor: int) -> KeptConnection:
        session = router.restore_session(name, 300, None, None)
        router.subscribe(session, "t", "t", None, SubscriptionOptions(qos=1))
        session.cursors = {"t": cursor}
        connection = KeptConnection()
        session.attach(connection)  # reads the log from the cursor to its end
        return connection

    replays.appended("t", 0, live[0:2])  # no session reads a log: not kept
    first = reader("first", 0)
    assert [m.payload for m in first.messages] == [b"0", b"1", b"2", b"3", b"4", b"5"]
    assert not any(a is b for a, b in zip(first.messages, live, strict=True))  # decoded from the log
    replays.appended("t", 2, live[2:4])  # a session read a moment ago: kept for the next readers
    second = reader("second", 2)
    assert [m.payload for m in second.messages] == [b"2", b"3", b"4", b"5"]
    assert second.messages[0] is live[2] and second.messages[1] is live[3]
    now[0] += cursors.KEEP_LIVE_S + 1  # no read since
    replays.appended_runs([AppendedRun("t", 4, live[4:6])])
    third = reader("third", 4)
    assert [m.payload for m in third.messages] == [b"4", b"5"]
    assert not any(a is b for a, b in zip(third.messages, live[4:6], strict=True))
    store.close()
