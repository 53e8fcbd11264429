"""The session registry on a real etcd: under a reconnect storm (every CONNECT of a cluster node reads and
writes its client id's record, and a burst of them is sent a few at a time), and for a connection moved
between members on one host (its record swapped without a read)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any, cast

import pytest

from broker_edge.cluster.coordination.etcd import Etcd
from broker_edge.cluster.features.sessions import ClusterSessions
from broker_edge.cluster.features.sessions_records import SessionRecord
from broker_edge.cluster.features.sessions_registry import CALLS_IN_FLIGHT, SessionRegistry
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.ports import MovedClaim, SessionClaim
from broker_edge.placement import Member
from tests.e2e.cluster.conftest import EtcdTarget

pytestmark = pytest.mark.timeout(120)

CLIENTS = 400


class CountedCalls:
    """Wraps the key calls of a real ``Etcd`` to count those outstanding at once (the highest count)."""

    def __init__(self, etcd: Etcd) -> None:
        self.now = self.most = self.calls = 0
        for name in ("get", "get_prefix", "create", "create_or_get", "compare_and_swap", "delete_if"):
            setattr(etcd, name, self._counted(getattr(etcd, name)))

    def _counted(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        async def counted(*args: Any) -> Any:
            self.now += 1
            self.calls += 1
            self.most = max(self.most, self.now)
            try:
                return await call(*args)
            finally:
                self.now -= 1

        return counted


def test_a_storm_of_claims_keeps_a_few_registry_calls_outstanding_and_writes_every_record(
    etcd: EtcdTarget,
) -> None:
    async def scenario() -> None:
        client = etcd.client()
        counted = CountedCalls(client)
        registry = SessionRegistry(client, etcd.prefix)

        async def claim(client_id: str) -> bool:
            async with registry.lock(client_id):
                found, revision = await registry.read(client_id)
                generation = (found.generation if found is not None else 0) + 1
                return await registry.write(client_id, SessionRecord("n1", generation, None, 0), revision)

        try:
            claimed = await asyncio.gather(*(claim(f"device-{n}") for n in range(CLIENTS)))
            records = {client_id: record for client_id, record, _ in await registry.records()}
        finally:
            await client.close()
        assert all(claimed)
        assert sorted(records) == sorted(f"device-{n}" for n in range(CLIENTS))
        assert all(record.node == "n1" and record.generation == 1 for record in records.values())
        assert counted.calls == 2 * CLIENTS + 1
        assert counted.most == CALLS_IN_FLIGHT  # reached, never passed

    asyncio.run(asyncio.wait_for(scenario(), 90))


class TakeoverLinks:
    """Peer links whose every takeover is answered "not held" (the member the connection left has
    ended it there), the requests counted."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def serve_requests(self, service: str, handler: object) -> None:
        pass

    def link(self, node: str) -> Any:
        asked = self.asked

        class Link:
            async def request(self, service: str, body: bytes, timeout_s: float) -> bytes:
                asked.append(node)
                return b'{"held":false}'

        return Link()


def member_b(
    registry: SessionRegistry, links: TakeoverLinks, persistent_full: bool = False
) -> ClusterSessions:
    """``ClusterSessions`` of member ``b`` of ``a`` and ``b``, on ``registry``, holding no session (or, if
    ``persistent_full``, as many persistent ones as ``sessions.max_persistent`` allows)."""
    view = ClusterView("b", 4)
    for node in ("a", "b"):
        view.members[node] = Member(node, "127.0.0.1:1", "http://127.0.0.1:1")
    view.fenced = False
    broker = SimpleNamespace(
        router=SimpleNamespace(sessions={}, persistent_count=1 if persistent_full else 0),
        config=SimpleNamespace(sessions=SimpleNamespace(max_persistent=1)),
        now=lambda: 0.0,
    )
    cluster = SimpleNamespace(node_id="b", session_save_interval_ms=1000, session_handover_timeout_ms=5000)
    return ClusterSessions(
        cast(Any, broker), registry, view, cast(Any, links), cast(Any, cluster), lambda: None
    )


async def claimed(sessions: ClusterSessions, moved: MovedClaim | None = None, expiry: int = 0) -> str | None:
    """The claim of ``device-1``'s CONNECT on ``sessions``' member (of a connection moved there, as
    ``moved`` says; a Session Expiry Interval of ``expiry``): its refusal (None: claimed)."""
    answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
    claim = SessionClaim("device-1", None, True, expiry, None, 0, False, moved)
    sessions.claim(claim, lambda refusal, _reference: answer.set_result(refusal))
    return await answer


@pytest.mark.parametrize("changed_since", [False, True], ids=["as-written", "changed-since"])
def test_a_connection_moved_here_swaps_the_record_it_came_with_without_reading_it(
    etcd: EtcdTarget, changed_since: bool
) -> None:
    """A connection handed over between members on one host comes with the record the member it left
    wrote (its generation and revision): the claim swaps that revision at once, one etcd call (it was
    a read and a swap, plus the removal by the member it left); the holder is still asked to let go
    over the peer link. A record changed since is read, and the claim swaps the current one."""

    async def scenario() -> tuple[int, list[str], SessionRecord | None]:
        client = etcd.client()
        try:
            writer = SessionRegistry(client, etcd.prefix)  # member a, which claimed the connection first
            assert await writer.write("device-1", SessionRecord("a", 1, None, 0), 0)
            known = writer.known("device-1")
            assert known is not None
            if changed_since:
                assert await writer.write("device-1", SessionRecord("a", 1, None, 0, saved_at=1.0), known[1])
            counted = CountedCalls(client)
            links = TakeoverLinks()
            refusal = await claimed(
                member_b(SessionRegistry(client, etcd.prefix), links), MovedClaim("a", 1, known[1])
            )
            assert refusal is None
            calls = counted.calls
            found, _ = await writer.read("device-1")
            return calls, links.asked, found
        finally:
            await client.close()

    calls, asked, record = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert record is not None and (record.node, record.generation) == ("b", 2)
    assert asked == ["a"]
    assert calls == (3 if changed_since else 1)  # the swap; or the swap refused, the read, the swap


@pytest.mark.parametrize("before", [None, "z", "device-1 of another user"])
def test_a_connect_claims_where_no_record_is_with_one_etcd_call(etcd: EtcdTarget, before: str | None) -> None:
    """A CONNECT's claim creates the record where there is none, or reads the one there, by one etcd
    transaction: a new device costs one call (it was a read and a create); a record left by a member gone
    (``z``) is swapped after it (two calls), and one of another user refuses the CONNECT, nothing written."""

    async def scenario() -> tuple[str | None, int, SessionRecord | None]:
        client = etcd.client()
        try:
            registry = SessionRegistry(client, etcd.prefix)
            if before is not None:
                owner = "someone" if before.endswith("another user") else None
                assert await registry.write("device-1", SessionRecord("z", 4, owner, 0), 0)
            counted = CountedCalls(client)
            refusal = await claimed(member_b(SessionRegistry(client, etcd.prefix), TakeoverLinks()))
            calls = counted.calls
            found, _ = await registry.read("device-1")
            return refusal, calls, found
        finally:
            await client.close()

    refusal, calls, record = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert record is not None
    if before is None:
        assert (refusal, calls, record.node, record.generation) == (None, 1, "b", 1)
    elif before == "z":
        assert (refusal, calls, record.node, record.generation) == (None, 2, "b", 5)
    else:
        assert (refusal, calls, record.node, record.generation) == ("session_owner", 1, "z", 4)


@pytest.mark.parametrize("before", [None, "device-1 of another user"])
def test_a_connect_over_the_persistent_sessions_quota_writes_nothing(
    etcd: EtcdTarget, before: str | None
) -> None:
    """A persistent session that would pass ``sessions.max_persistent`` is refused before anything is
    written (``session_quota``; the record is only read), and a record of another user still refuses it
    as someone else's first (``session_owner``), as on a broker alone."""

    async def scenario() -> tuple[str | None, SessionRecord | None]:
        client = etcd.client()
        try:
            registry = SessionRegistry(client, etcd.prefix)
            if before is not None:
                assert await registry.write("device-1", SessionRecord("z", 4, "someone", 0), 0)
            sessions = member_b(SessionRegistry(client, etcd.prefix), TakeoverLinks(), persistent_full=True)
            refusal = await claimed(sessions, expiry=3600)
            found, _ = await registry.read("device-1")
            return refusal, found
        finally:
            await client.close()

    refusal, record = asyncio.run(asyncio.wait_for(scenario(), 60))
    if before is None:
        assert (refusal, record) == ("session_quota", None)
    else:
        assert refusal == "session_owner" and record is not None and record.node == "z"


def test_a_save_pass_while_a_connect_is_claimed_keeps_the_record_it_wrote(etcd: EtcdTarget) -> None:
    """A member's periodic save removes the records of sessions it keeps that have ended; a CONNECT whose
    claim has just written its record has no session in the router until its CONNACK is decided, so a
    save pass in that moment took the new session for an ended one and removed the record, and the
    session, kept without a record from then on, came back empty (Session Present 0) after the member
    died. A save pass running at every turn of the loop while the claim goes on leaves the record."""

    async def scenario() -> tuple[str | None, SessionRecord | None]:
        client = etcd.client()
        try:
            sessions = member_b(SessionRegistry(client, etcd.prefix), TakeoverLinks())
            answer: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
            found: list[SessionRecord | None] = []

            async def saving_throughout() -> None:
                while not answer.done():
                    await sessions.save()
                    await asyncio.sleep(0)

            async def read_when_answered() -> None:
                await answer
                found.append((await SessionRegistry(client, etcd.prefix).read("device-1"))[0])

            saver = asyncio.create_task(saving_throughout())
            claim = SessionClaim("device-1", None, False, 3600, None, 0, False)
            sessions.claim(claim, lambda refusal, _reference: answer.set_result(refusal))
            await asyncio.gather(saver, read_when_answered())
            return answer.result(), found[0]
        finally:
            await client.close()

    refusal, record = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert refusal is None
    assert record is not None and (record.node, record.generation) == ("b", 1)
