"""Where a replay starts in logs held by another broker: asked over a (memory) peer link of the broker
holding them, from its real store; the session's cursors set from the answers, the offsets outside the logs
reported, live messages held back meanwhile, and the fallbacks when nobody can be asked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from broker_edge.cluster.reads.log_starts import LogStart, LogStarts
from broker_edge.cluster.reads.remote_starts import RemoteStarts
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.cursors import ReplayManager
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ClusterPorts
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.session import Session
from broker_edge.placement import PartitionState
from broker_edge.protocol.topics import EARLIEST, OffsetStart, OffsetStartKind
from broker_edge.security.limits import LimitsConfig
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.errors import OffsetOutOfRange
from tests.unit.broker_edge.cluster.links.test_peer_link_extensions import _pair

PARTITIONS = 4


def _view(node: str, leader: str | None) -> ClusterView:
    """Every partition held by b alone (led by ``leader``): a holds no copy of any."""
    states = {number: PartitionState(number, leader, 1, ("b",), ("b",)) for number in range(PARTITIONS)}
    return ClusterView(node, PARTITIONS, states=states, fenced=False)


async def _store(path: Path, topics: dict[str, int]) -> LogStore:
    store = LogStore(path, StorageConfig(durability="none"))
    store.open()
    for topic, count in topics.items():
        rows = [(str(n).encode(), 1, False, "p", (), None, None, None, None, None) for n in range(count)]
        store.append_batch(topic, rows)
    await store.wait_durable()
    return store


class _Observer:
    """Broker a: a router whose replays ask b (or nobody, with ``leader=None`` and b's link down)."""

    def __init__(self, tmp_path: Path, leader: str | None) -> None:
        self.links_a, self.links_b = _pair()
        self.store = LogStore(tmp_path / "a", StorageConfig(durability="none"))
        self.store.open()
        view = _view("a", leader)
        self.router = Router(LimitsConfig())
        self.replays = self.router.replays = ReplayManager(self.store, None, self.router.count_drop)
        starts = LogStarts(self.store, view, self.links_a)
        self.remote = RemoteStarts(view, starts, lambda number: False, lambda topic_filter: [], wait_s=1.0)
        self.replays.join_cluster(ClusterPorts(remote_starts=self.remote))

    async def start(self, topic_filter: str, start: OffsetStart) -> tuple[Session, list[OffsetOutOfRange]]:
        """A session subscribing to ``topic_filter`` from ``start``, once its replay is positioned."""
        session = self.router.restore_session(f"s-{topic_filter}", 300, None, None)
        self.router.subscribe(session, topic_filter, topic_filter, None, SubscriptionOptions(qos=1))
        outside = self.replays.start(session, topic_filter, start)
        ready = asyncio.Event()
        assert self.replays.when_started(session, outside, ready.set)
        self.router.publish(Message("w/new", b"0", 1, offset=0))  # created after the leader answered
        await asyncio.wait_for(ready.wait(), 5)
        return session, outside


def test_a_broker_lists_its_logs_matching_a_filter_with_the_offset_a_start_names(tmp_path: Path) -> None:
    async def scenario() -> None:
        links_a, links_b = _pair()
        view_b = _view("b", "b")
        store_b = await _store(tmp_path / "b", {"w/1": 3, "w/2": 5, "x/1": 2, "$sys/w": 1})
        LogStarts(store_b, view_b, links_b)
        asking = LogStarts(await _store(tmp_path / "a", {}), _view("a", "b"), links_a)
        everything = set(range(PARTITIONS))

        assert await asking.ask("b", "w/#", EARLIEST, everything) == [
            LogStart("w/1", 0, 3, 0),
            LogStart("w/2", 0, 5, 0),
        ]
        assert await asking.ask("b", "+/1", OffsetStart(OffsetStartKind.OFFSET, 9), everything) == [
            LogStart("w/1", 0, 3, 9),  # not clamped: the asker tells the device it was outside
            LogStart("x/1", 0, 2, 9),
        ]
        later = OffsetStart(OffsetStartKind.TIMESTAMP, int(time.time() * 1000) + 60_000)
        assert await asking.ask("b", "w/2", later, everything) == [LogStart("w/2", 0, 5, 5)]
        one = {view_b.partition_of("w/1")}
        same = [topic for topic in ("w/1", "w/2") if view_b.partition_of(topic) in one]
        assert [found.topic for found in await asking.ask("b", "w/#", EARLIEST, one)] == same
        assert [found.topic for found in await asking.ask("b", "w/#", EARLIEST, set())] == []
        assert asking.readers(everything) == ({"b": everything}, set())

    asyncio.run(scenario())


def test_a_replay_is_positioned_from_the_leaders_answer_and_reports_offsets_outside(tmp_path: Path) -> None:
    async def scenario() -> None:
        observer = _Observer(tmp_path, "b")
        LogStarts(await _store(tmp_path / "b", {"w/1": 10, "w/2": 3}), _view("b", "b"), observer.links_b)

        session, outside = await observer.start("w/#", OffsetStart(OffsetStartKind.OFFSET, 5))

        assert session.cursors == {"w/1": 5, "w/2": 3, "w/new": 5}  # w/new: held, from the offset asked
        assert [(o.topic, o.offset, o.start, o.end) for o in outside] == [("w/2", 5, 0, 3)]
        assert not observer.remote.pending(session)

    asyncio.run(scenario())


def test_a_partition_nobody_can_be_asked_for_starts_at_the_offset_asked_or_the_first_message_held(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        observer = _Observer(tmp_path, None)
        link = observer.links_a.link("b")
        socket = link._socket
        assert socket is not None
        link.detach(socket)

        exact, outside = await observer.start("w/1", EARLIEST)
        timed, _ = await observer.start("w/#", OffsetStart(OffsetStartKind.TIMESTAMP, 1))

        assert exact.cursors == {"w/1": 0} and outside == []  # read from the log's start once b answers
        assert timed.cursors == {"w/new": 0}  # a time not resolved: from the first message held

    asyncio.run(scenario())
