"""Replication pushed over the peer link (`replica_push`), in memory: a real leader stage and real stores,
two peer links back to back, and fetches handed to the leader directly instead of over HTTP."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
from broker_edge.cluster.replication.delivery import LocalDelivery
from broker_edge.cluster.replication.fetcher import FollowerConfig
from broker_edge.cluster.replication.follower import Followers
from broker_edge.cluster.replication.leader import LeaderReplication
from broker_edge.cluster.replication.replica_fetch import (
    OK,
    UNKNOWN_SESSION,
    FetchRequest,
    FetchResponse,
    PartitionFetch,
    TopicData,
    TopicPosition,
    WireError,
)
from broker_edge.cluster.replication.replica_push import (
    ACK,
    PUSH,
    Ack,
    Push,
    decode_ack,
    decode_push,
    encode_ack,
    encode_push,
)
from broker_edge.cluster.replication.stage import LeaderConfig
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.message import Message
from broker_edge.engine.ports import AppendedRun
from broker_edge.engine.records import record_fields
from broker_edge.placement import Member, PartitionState
from broker_edge.storage import LogStore, StorageConfig
from broker_edge.storage.file_pool import FileHandlePool
from tests.harness.async_waits import until
from tests.static_isr import StaticIsr

NODES = ("b1", "b2")


class _Receiver:
    def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
        raise AssertionError("no forwards here")

    def unlogged(self, message: Message) -> None:
        raise AssertionError("no unlogged publishes here")


class _Wire:
    """One side's socket: what it sends reaches the other side's link, unless told to lose messages."""

    def __init__(self, links: PeerLinks, link: PeerLink) -> None:
        self.links = links
        self.link = link
        self.lose = 0
        self.messages = 0

    async def send_bytes(self, data: bytes) -> None:
        if self.lose:
            self.lose -= 1
            return
        self.messages += 1
        self.link.received(data, self.links.receiver, self.links._handlers, self.links._services)

    async def close(self) -> None:
        return None


class _Pair:
    """Leader b1 and follower b2, each with its store and view, linked in memory."""

    def __init__(self, tmp_path: Path) -> None:
        self.leader_store = LogStore(tmp_path / "b1", StorageConfig(durability="none"))
        self.follower_store = LogStore(tmp_path / "b2", StorageConfig(durability="none"))
        self.leader_store.open()
        self.follower_store.open()
        self.isr = StaticIsr()
        self.views = {node: ClusterView(node, 1, fenced=False) for node in NODES}
        for view in self.views.values():
            view.members.update(
                {
                    node: Member(node, "127.0.0.1:1", "http://127.0.0.1:1", "http://127.0.0.1:1")
                    for node in NODES
                }
            )
            view.states[0] = PartitionState(0, "b1", 1, NODES, NODES)
            self.isr.views.append(view)
        self.leader = LeaderReplication(
            self.views["b1"], self.leader_store, self.isr, LeaderConfig(2, replica_lag_max_ms=60_000)
        )
        self.links = {node: PeerLinks(node, None, _Receiver()) for node in NODES}
        self.to_follower = _Wire(self.links["b2"], self.links["b2"].link("b1"))
        self.to_leader = _Wire(self.links["b1"], self.links["b1"].link("b2"))
        self.links["b1"].link("b2").attach(self.to_follower)
        self.links["b2"].link("b1").attach(self.to_leader)
        self.leader.serve_pushes(self.links["b1"])
        self.routed: list[bytes] = []
        self.refused: list[BaseException] = []
        """Batches the leader refused (none should be)."""

    def follow(self, config: FollowerConfig, pushes: bool = True) -> Followers:
        """Start b2's followers; their fetches go to the leader stage directly, whose answers say it
        pushes (or not)."""
        leader = self.leader
        routed = self.routed
        delivery = LocalDelivery(self.follower_store, lambda message: routed.append(message.payload), None)

        class InMemory(Followers):
            async def post(
                self, leader_node: str, url: str, request: FetchRequest
            ) -> tuple[FetchResponse, bool, bool]:
                self.fetches_sent += 1
                return await leader.fetch(request), pushes, True

        followers = InMemory(
            self.views["b2"], self.follower_store, delivery, None, config, links=self.links["b2"]
        )
        self.links["b2"].on(PUSH, followers.pushed)
        followers.start()
        return followers

    async def close(self, followers: Followers | None = None) -> None:
        if followers is not None:
            await followers.stop()
        await self.leader.stop()
        self.leader_store.close()
        self.follower_store.close()


def _run(tmp_path: Path, body: Callable[[_Pair], Awaitable[None]]) -> None:
    async def main() -> None:
        pair = _Pair(tmp_path)
        pair.leader.start()
        try:
            await body(pair)
            assert pair.refused == []
        finally:
            await pair.close()

    asyncio.run(main())


async def _append(store: LogStore, topic: str, payloads: list[bytes]) -> AppendedRun:
    messages = [Message(topic, payload, 1) for payload in payloads]
    first = store.append_batch(topic, [record_fields(message) for message in messages])
    await store.wait_durable()
    return AppendedRun(topic, first, messages)


def _request(session: int, positions: list[tuple[str, int]], max_bytes: int = 1 << 20) -> FetchRequest:
    topics = [TopicPosition(topic, offset, 1) for topic, offset in positions]
    return FetchRequest("b2", session, False, 0, max_bytes, max_bytes, [PartitionFetch(0, 1, topics)])


def _topics(pushes: list[Push]) -> list[TopicData]:
    return [data for push in pushes for part in push.response.partitions for data in part.topics]


def test_pushes_and_acknowledgements_survive_their_encoding_and_malformed_ones_are_refused() -> None:
    push = Push(7, FetchResponse(42, UNKNOWN_SESSION))
    assert decode_push(encode_push(push)) == push
    ack = Ack(3, 1024, _request(42, [("t", 5)]))
    assert decode_ack(encode_ack(ack)) == ack
    with pytest.raises(WireError, match="header"):
        decode_push(b"\x01")
    with pytest.raises(WireError):
        decode_ack(encode_ack(ack)[:-3])


def test_a_replica_is_replicated_by_pushes_alone_once_its_session_is_open(tmp_path: Path) -> None:
    async def body(pair: _Pair) -> None:
        followers = pair.follow(FollowerConfig(wait_ms=50))
        try:
            await until(lambda: pair.leader.acks_received > 0)  # the session moved onto the link
            fetches = pair.leader.fetches_served
            done: list[int] = []
            sent = [f"reading {n}".encode() for n in range(30)]
            for start in range(0, 30, 3):
                run = await _append(pair.leader_store, "t", sent[start : start + 3])
                pair.leader.when_replicated([run], lambda: done.append(1), pair.refused.append)
            await until(lambda: len(done) == 10 and pair.routed == sent)
            assert pair.leader_store.committed_end("t") == 30
            assert pair.follower_store.committed_end("t") == 30  # the watermark came by push too
            leader_frames = pair.leader_store.replicated_log.read_frames("t", 0, 1 << 20)
            assert pair.follower_store.replicated_log.read_frames("t", 0, 1 << 20) == leader_frames
            assert pair.leader.fetches_served == fetches  # no fetch in the steady state
            assert pair.leader.pushes_sent > 0
        finally:
            await followers.stop()

    _run(tmp_path, body)


def test_a_leader_whose_answers_do_not_offer_pushes_is_fetched_from_as_before(tmp_path: Path) -> None:
    async def body(pair: _Pair) -> None:
        followers = pair.follow(FollowerConfig(wait_ms=50), pushes=False)  # a leader of an earlier version
        try:
            done: list[int] = []
            for payload in (b"one", b"two", b"three"):
                run = await _append(pair.leader_store, "t", [payload])
                pair.leader.when_replicated([run], lambda: done.append(1), pair.refused.append)
            await until(lambda: len(done) == 3 and pair.routed == [b"one", b"two", b"three"])
            assert pair.leader.acks_received == 0 and pair.leader.pushes_sent == 0
            assert followers.fetches_sent > 1
        finally:
            await followers.stop()

    _run(tmp_path, body)


def test_a_lost_push_makes_the_replica_reopen_its_session_over_http_and_lose_nothing(tmp_path: Path) -> None:
    async def body(pair: _Pair) -> None:
        followers = pair.follow(FollowerConfig(wait_ms=50))
        try:
            await until(lambda: pair.leader.acks_received > 0)
            await _append(pair.leader_store, "t", [b"first"])
            second = await _append(pair.leader_store, "t", [b"second"])
            pair.leader.when_replicated([second], lambda: None, pair.refused.append)
            await until(lambda: pair.follower_store.committed_end("t") == 2)
            fetches = pair.leader.fetches_served
            pair.to_follower.lose = 1  # the next push never arrives
            done: list[int] = []
            for payload in (b"third", b"fourth"):
                run = await _append(pair.leader_store, "t", [payload])
                pair.leader.when_replicated([run], lambda: done.append(1), pair.refused.append)
                await asyncio.sleep(0.01)
            await until(lambda: len(done) == 2)  # acknowledged once the replica fetched what it lacked
            assert pair.leader.fetches_served > fetches
            await until(lambda: pair.follower_store.committed_end("t") == 4)
            assert pair.follower_store.replicated_log.read_frames(
                "t", 0, 1 << 20
            ) == pair.leader_store.replicated_log.read_frames("t", 0, 1 << 20)
            assert pair.routed == [b"first", b"second", b"third", b"fourth"]  # once each, in order
            await until(lambda: followers._fetchers[("b1", False)].pushes is not None)  # pushed again
        finally:
            await followers.stop()

    _run(tmp_path, body)


def test_one_loop_iterations_appends_leave_as_one_push_and_acknowledgements_move_the_watermark(
    tmp_path: Path,
) -> None:
    async def body(pair: _Pair) -> None:
        pushes: list[Push] = []
        pair.links["b2"].on(PUSH, lambda link, part: pushes.append(decode_push(part)))
        opened = await pair.leader.fetch(_request(0, []))
        to_leader = pair.links["b2"].link("b1")
        to_leader.send(ACK, encode_ack(Ack(1, 0, _request(opened.session, []))))
        await asyncio.sleep(0.01)
        runs = [await _append(pair.leader_store, topic, [b"x", b"y"]) for topic in ("t", "u")]
        done: list[int] = []
        for run in runs:  # two batches made durable together: one push carries both
            pair.leader.when_replicated([run], lambda: done.append(1), pair.refused.append)
        await until(lambda: len(pushes) == 1)
        await asyncio.sleep(0.02)
        assert len(pushes) == 1
        topics = {data.topic: (data.first, data.count) for data in _topics(pushes[:1])}
        assert topics == {"t": (0, 2), "u": (0, 2)}
        assert pushes[0].sequence == 1
        to_leader.send(ACK, encode_ack(Ack(2, 0, _request(opened.session, [("t", 2), ("u", 2)]))))
        await until(lambda: len(done) == 2)  # the acknowledgement says both are durable on b2
        await until(lambda: len(pushes) == 2)
        watermarks = {data.topic: data.high_watermark for data in _topics(pushes[1:])}
        assert watermarks == {"t": 2, "u": 2} and pushes[1].sequence == 2
        assert pair.leader.fetches_served == 1  # the one that opened the session

    _run(tmp_path, body)


def test_the_window_bounds_what_is_unacknowledged_and_a_gap_in_acknowledgements_ends_pushing(
    tmp_path: Path,
) -> None:
    async def body(pair: _Pair) -> None:
        pushes: list[Push] = []
        pair.links["b2"].on(PUSH, lambda link, part: pushes.append(decode_push(part)))
        opened = await pair.leader.fetch(_request(0, [], max_bytes=300))
        to_leader = pair.links["b2"].link("b1")
        to_leader.send(ACK, encode_ack(Ack(1, 0, _request(opened.session, []))))
        await asyncio.sleep(0.01)

        def records() -> int:
            return sum(data.count for data in _topics(pushes))

        for _ in range(4):
            run = await _append(pair.leader_store, "t", [b"p" * 100])
            pair.leader.when_replicated([run], lambda: None, lambda error: None)
            await asyncio.sleep(0.01)
        assert 0 < records() < 4  # about 300 bytes of records unacknowledged, not all four
        durable = sum(len(frames) for data in _topics(pushes) for frames in data.frames)
        to_leader.send(ACK, encode_ack(Ack(2, durable, _request(opened.session, [("t", records())]))))
        await until(lambda: records() == 4)  # the acknowledgement opened the window
        before = len(pushes)
        to_leader.send(ACK, encode_ack(Ack(4, 0, _request(opened.session, []))))  # ack 3 was lost
        await until(lambda: len(pushes) > before and pushes[-1].response.error == UNKNOWN_SESSION)
        assert pair.leader.fetches.sessions[("b2", False)].push is None  # b2 must reopen over HTTP
        assert (await pair.leader.fetch(_request(0, [("t", 4)]))).error == OK

    _run(tmp_path, body)


def test_a_session_opens_only_once_the_replicas_tail_is_durable_so_the_leaders_answer_continues_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tail still being synced (here: appended by a fetcher that a view change replaced) is not left
    beyond the positions a new session lists: the leader would send from the durable end and the replica
    refuse the frames as not continuing its log (an error and a reopened session)."""
    gate = threading.Event()
    real = FileHandlePool.fdatasync
    follower_root = str(tmp_path / "b2-group")

    def held(self: FileHandlePool, path: str) -> None:
        if path.startswith(follower_root):  # the follower's syncs only: the leader's append goes on
            gate.wait(10)
        real(self, path)

    async def body(pair: _Pair) -> None:
        pair.follower_store.close()
        pair.follower_store = LogStore(  # (fdatasyncs: the hold below is on them, not on a syncfs)
            tmp_path / "b2-group", StorageConfig(durability="group", syncfs_min_segments=0)
        )
        pair.follower_store.open()
        monkeypatch.setattr(FileHandlePool, "fdatasync", held)
        run = await _append(pair.leader_store, "t", [b"one", b"two", b"three"])
        frames, _count = pair.leader_store.replicated_log.read_frames("t", 0, 1 << 20)
        pair.follower_store.replicated_log.append_at("t", b"".join(frames))  # its sync is held
        followers = pair.follow(FollowerConfig(wait_ms=50))
        try:
            await asyncio.sleep(0.1)
            assert pair.leader.fetches_served == 0  # the session waits for the tail to be durable
            gate.set()
            done: list[int] = []
            pair.leader.when_replicated([run], lambda: done.append(1), pair.refused.append)
            await until(lambda: done == [1] and pair.follower_store.committed_end("t") == 3)
            assert pair.leader.fetches_served == 1  # one session, never reopened
            assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
        finally:
            gate.set()
            await followers.stop()

    with caplog.at_level(logging.INFO):
        _run(tmp_path, body)
