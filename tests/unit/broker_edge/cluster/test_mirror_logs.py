"""A site's frames on a cluster hub: appended on their partition's leader at the site's offsets, answered only
once every in-sync replica holds them, handed to the leader over the members' endpoint (real HTTP on
loopback) by a member that does not lead, and the ends taken from the leader."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker_edge.cluster.links.member_api import bind_members_endpoint, serve_members_endpoint
from broker_edge.cluster.links.member_clients import MemberClients
from broker_edge.cluster.mirror_logs import ClusterMirrorLogs, decode_parts, encode_parts
from broker_edge.cluster.replication.leader import LeaderReplication
from broker_edge.cluster.replication.replica_fetch import GAP, FetchRequest, PartitionFetch, TopicPosition
from broker_edge.cluster.replication.stage import LeaderConfig
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.ports import MirrorPart, MirrorRefused
from broker_edge.placement import Member, PartitionState
from broker_edge.settings.cluster import MemberListenConfig
from broker_edge.storage import InvalidRecord, LogStore, StorageConfig
from broker_edge.storage.mirrored import MirrorAppend, frames_end
from tests.static_isr import StaticIsr
from tests.unit.broker_edge.storage.log_helpers import make_record

TOPIC = "$site/p1/telemetry/a"
NODES = ("b1", "b2", "b3")


def site_frames(tmp_path: Path, count: int) -> tuple[bytes, LogStore]:
    """``count`` records stored on a site, as the frames it sends (and its store, to compare with)."""
    store = LogStore(tmp_path / "site", StorageConfig(durability="none"))
    store.open()
    for n in range(count):
        store.append("telemetry/a", make_record(n))
    store.flush()
    frames, held = store.replicated_log.read_frames("telemetry/a", 0, 1 << 20)
    assert held == count
    return b"".join(frames), store


def fetch(replica: str, session: int, offset: int) -> FetchRequest:
    """A follower's fetch of partition 0 (epoch 1) from ``offset`` of ``TOPIC``."""
    topics = [TopicPosition(TOPIC, offset, 1 if offset else -1)] if offset else []
    return FetchRequest(replica, session, False, 0, 1 << 20, 1 << 20, [PartitionFetch(0, 1, topics)])


@dataclass
class Node:
    view: ClusterView
    store: LogStore
    mirror: ClusterMirrorLogs
    leader: LeaderReplication


@asynccontextmanager
async def member(
    tmp_path: Path, node: str, leader: str, isr: tuple[str, ...], min_insync: int, timeout_s: float = 2.0
) -> AsyncIterator[Node]:
    """Cluster member ``node`` of a one-partition cluster led by ``leader``, serving its members' endpoint."""
    store = LogStore(tmp_path / node, StorageConfig(durability="none"))
    store.open()
    view = ClusterView(node, 1, fenced=False)
    view.states[0] = PartitionState(0, leader, 1, NODES, isr)
    changer = StaticIsr()
    changer.views.append(view)
    replication = LeaderReplication(
        view, store, changer, LeaderConfig(min_insync_replicas=min_insync, replica_lag_max_ms=60_000)
    )
    replication.start()
    clients = MemberClients(node, None)
    mirror = ClusterMirrorLogs(view, store, replication, replication.refusal, clients, timeout_s)
    sock = bind_members_endpoint("127.0.0.1", 0)
    port = sock.getsockname()[1]
    runner = await serve_members_endpoint(
        sock, store, view, None, MemberListenConfig(), [mirror.add_routes], None
    )
    view.members[node] = Member(node, "127.0.0.1:1", "http://127.0.0.1:1", f"http://127.0.0.1:{port}")
    try:
        yield Node(view, store, mirror, replication)
    finally:
        await runner.cleanup()
        await clients.close()
        await replication.stop()
        store.close()


def introduce(*members: Node) -> None:
    """Every member knows every other (as etcd's membership would tell them)."""
    for one in members:
        for other in members:
            one.view.members[other.view.node_id] = other.view.members[other.view.node_id]


async def one(mirror: ClusterMirrorLogs, first: int, count: int, frames: bytes) -> MirrorAppend:
    """Append ``TOPIC``'s frames alone through ``mirror``."""
    return (await mirror.append([MirrorPart(TOPIC, first, count, frames)]))[0]


def run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def test_the_leader_answers_only_once_every_in_sync_replica_holds_the_frames(tmp_path: Path) -> None:
    frames, site = site_frames(tmp_path, 5)

    async def body() -> None:
        async with member(tmp_path, "b1", "b1", NODES, 2) as b1:
            appending = asyncio.create_task(one(b1.mirror, 0, 5, frames))
            await asyncio.sleep(0.05)
            assert not appending.done() and b1.store.durable_end(TOPIC) == 5  # durable, not replicated
            first = await b1.leader.fetch(fetch("b2", 0, 0))
            third = await b1.leader.fetch(fetch("b3", 0, 0))
            await b1.leader.fetch(fetch("b2", first.session, 5))
            await asyncio.sleep(0.05)
            assert not appending.done()  # b3, in sync, does not hold them yet
            await b1.leader.fetch(fetch("b3", third.session, 5))
            appended = await asyncio.wait_for(appending, 2)
            assert (appended.first, appended.records, appended.duplicates, appended.end) == (0, 5, 0, 5)
            assert b1.store.replicated_log.read_frames(TOPIC, 0, 1 << 20) == site.replicated_log.read_frames(
                "telemetry/a", 0, 1 << 20
            )
            from_two = frames[frames_end(memoryview(frames), 2) :]
            again = await asyncio.wait_for(one(b1.mirror, 2, 3, from_two), 2)
            assert (again.records, again.duplicates, again.end) == (0, 3, 5)  # the ACK was lost: skipped

    try:
        run(body)
    finally:
        site.close()


def test_a_gap_is_replicated_as_a_gap_and_answered_once_the_replicas_hold_what_follows(
    tmp_path: Path,
) -> None:
    frames, site = site_frames(tmp_path, 8)
    view = memoryview(frames)
    three, six = frames_end(view, 3), frames_end(view, 6)

    async def body() -> None:
        async with member(tmp_path, "b1", "b1", ("b1", "b2"), 2) as b1:
            appending = asyncio.create_task(one(b1.mirror, 0, 3, frames[:three]))
            await asyncio.sleep(0.05)
            first = await b1.leader.fetch(fetch("b2", 0, 0))
            await b1.leader.fetch(fetch("b2", first.session, 3))
            assert (await appending).end == 3
            appending = asyncio.create_task(one(b1.mirror, 6, 2, frames[six:]))  # 3-5: retention
            await asyncio.sleep(0.05)
            answer = await b1.leader.fetch(fetch("b2", first.session, 3))
            sent = [(t.kind, t.first, t.count) for p in answer.partitions for t in p.topics]
            assert sent == [(GAP, 6, 2)]
            assert b"".join(answer.partitions[0].topics[0].frames) == frames[six:]
            await asyncio.sleep(0.05)
            assert not appending.done()
            await b1.leader.fetch(fetch("b2", first.session, 8))
            appended = await asyncio.wait_for(appending, 2)
            assert (appended.gap, appended.records, appended.end) == ((3, 6), 2, 8)

    try:
        run(body)
    finally:
        site.close()


def test_a_member_that_does_not_lead_hands_the_frames_to_the_leader_and_reads_ends_there(
    tmp_path: Path,
) -> None:
    frames, site = site_frames(tmp_path, 6)
    four = frames_end(memoryview(frames), 4)

    async def body() -> None:
        async with (
            member(tmp_path, "b1", "b1", ("b1",), 1) as b1,
            member(tmp_path, "b2", "b1", ("b1",), 1) as b2,
        ):
            introduce(b1, b2)
            b2.store.replicated_log.append_at(
                TOPIC, frames[: frames_end(memoryview(frames), 1)]
            )  # a stale copy here
            await b2.store.wait_durable()
            appended = await one(b2.mirror, 0, 4, frames[:four])
            assert (appended.records, appended.end) == (4, 4)
            assert b1.store.replicated_log.read_frames(TOPIC, 0, 1 << 20) == site.replicated_log.read_frames(
                "telemetry/a", 0, 1 << 20, 4
            )
            other = "$site/p1/telemetry/b"
            both = await b2.mirror.append(
                [MirrorPart(TOPIC, 0, 4, frames[:four]), MirrorPart(other, 0, 6, frames)]
            )  # one request to the leader: the first part is held, the second new
            assert [(a.records, a.duplicates, a.end) for a in both] == [(0, 4, 4), (6, 0, 6)]
            assert await b2.mirror.ends("$site/p1/") == {TOPIC: 4, other: 6}  # the leader's, not b2's copy
            assert await b2.mirror.ends("$site/p2/") == {}
            damaged = frames[four:-1] + bytes([frames[-1] ^ 1])
            with pytest.raises(InvalidRecord):
                await one(b2.mirror, 4, 2, damaged)
            assert b1.store.durable_end(TOPIC) == 4

    try:
        run(body)
    finally:
        site.close()


def test_no_leader_within_the_timeout_is_a_refusal_and_nothing_is_appended(tmp_path: Path) -> None:
    frames, site = site_frames(tmp_path, 2)

    async def body() -> None:
        async with (
            member(tmp_path, "b1", "b2", NODES, 1, timeout_s=0.3) as b1,  # b1 thinks b2 leads
            member(tmp_path, "b2", "b1", NODES, 1, timeout_s=0.3) as b2,  # and b2 that b1 does
        ):
            introduce(b1, b2)
            with pytest.raises(MirrorRefused, match="not acknowledged within"):
                await one(b1.mirror, 0, 2, frames)
            assert TOPIC not in b1.store and TOPIC not in b2.store
            b2.store.replicated_log.append_at(TOPIC, frames)  # a replica's copy, its leader gone
            b1.view.states[0] = b2.view.states[0] = PartitionState(0, None, 2, NODES, NODES)
            with pytest.raises(MirrorRefused, match="no leader answered"):
                await b1.mirror.ends("$site/p1/")
            assert await b1.mirror.ends("$site/p2/") == {}

    try:
        run(body)
    finally:
        site.close()


def test_a_request_body_that_does_not_add_up_is_refused_naming_why() -> None:
    parts = [MirrorPart("a", 0, 1, b"xyz"), MirrorPart("b", 5, 2, b"uvw")]
    body = encode_parts(parts)
    decoded = decode_parts(body)
    assert [(p.topic, p.first, p.count, bytes(p.frames)) for p in decoded] == [
        ("a", 0, 1, b"xyz"),
        ("b", 5, 2, b"uvw"),
    ]
    with pytest.raises(ValueError, match="do not add up"):
        decode_parts(body[:-1])
    with pytest.raises(ValueError, match="bad header"):
        decode_parts(b"\x00\x00\x00\x02{]")
    with pytest.raises(ValueError, match="no header"):
        decode_parts(b"\x00")
    with pytest.raises(ValueError, match=r"'a' count must be within \[1, .*got 0"):
        decode_parts(encode_parts([MirrorPart("a", 0, 0, b"x")]))


@pytest.mark.parametrize(
    ("header", "why"),
    [
        (b'[["a", 9223372036854775807, 1, 1]]', r"'a' first must be within \[0, 9007199254740992\]"),
        (b'[["a", 18446744073709551621, 1, 1]]', "an integer of 65 bits"),
        (b'[["a", 1e400, 1, 1]]', "'a' first must be an integer, got inf"),
        (b'[["a", 0, 1.0, 1]]', "'a' count must be an integer, got 1.0"),
        (b'[["a", 0, true, 1]]', "'a' count must be an integer, got True"),
        (b'[["a", 0, 1, -1]]', "'a' size must be within"),
        (b'[["a", 9007199254740991, 2, 1]]', "end past 9007199254740992"),
        (b'[["a", NaN, 1, 1]]', "'a' first must be an integer, got nan"),
        (b'{"a": 1}', "expected \\[\\[topic"),
    ],
)
def test_a_member_asking_to_append_at_a_number_no_log_holds_is_refused_naming_it(
    header: bytes, why: str
) -> None:
    body = len(header).to_bytes(4, "big") + header + b"x"
    with pytest.raises(ValueError, match=why):
        decode_parts(body)
