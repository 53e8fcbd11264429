"""The election of a site cluster's link holder, on a real etcd: one member at a time holds the link; a
member whose lease ends, or that is fenced, lets it go, and another takes it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker_edge.cluster.coordination.etcd import ClusterKeys, Etcd
from broker_edge.cluster.coordination.link_holder import LinkHolder
from tests.harness.async_waits import until
from tests.harness.local_cluster import EtcdServer, EtcdTarget

pytestmark = pytest.mark.timeout(60)


class Member:
    """A member's holder, with the lease it would be registered under and whether its link runs."""

    def __init__(self, etcd: Etcd, node_id: str, lease: int) -> None:
        self.lease: int | None = lease
        self.running = False
        self.holder = LinkHolder(
            etcd, ClusterKeys("/site").uplink, node_id, lambda: self.lease, self._hold, self._release, 0.05
        )

    def _hold(self) -> None:
        assert not self.running
        self.running = True

    async def _release(self) -> None:
        assert self.running
        self.running = False


@pytest.fixture
def etcd_target(tmp_path: Path) -> Iterator[EtcdTarget]:
    server = EtcdServer(tmp_path / "etcd").start()
    yield EtcdTarget(server, "/site")
    server.kill()


def test_one_member_holds_the_link_and_another_takes_it_when_its_lease_ends_or_it_is_fenced(
    etcd_target: EtcdTarget,
) -> None:
    async def scenario() -> None:
        async with etcd_target.client() as etcd:
            a = Member(etcd, "a", await etcd.grant_lease(30))
            b = Member(etcd, "b", await etcd.grant_lease(30))
            for _ in range(3):
                await a.holder.step()
                await b.holder.step()
            assert (a.running, b.running) == (True, False)
            held = await etcd.get("/site/uplink")
            assert held is not None and held.value == b"a"

            assert a.lease is not None
            await etcd.revoke_lease(a.lease)  # a's lease ends (it died, or was fenced too long): etcd deletes
            await b.holder.step()
            assert b.running
            a.lease = await etcd.grant_lease(30)  # a registers again, under a new lease
            await a.holder.step()
            assert (a.running, b.running) == (False, True)  # its key is gone: a lets the link go

            fenced_lease, b.lease = (
                b.lease,
                None,
            )  # b is fenced: it lets go at once
            await b.holder.step()
            assert not b.running
            await a.holder.step()
            assert not a.running  # b's key outlives its fencing until the lease ends

            assert fenced_lease is not None
            await etcd.revoke_lease(fenced_lease)  # its lease ends
            b.lease = await etcd.grant_lease(30)
            a.holder.start()
            b.holder.start()
            await until(lambda: a.running or b.running, 10.0, "a holder")  # (etcd may be slow when loaded)
            await asyncio.sleep(0.3)  # both step several times (every 0.05 s) meanwhile
            assert [a.running, b.running].count(True) == 1
            first, second = (a, b) if a.running else (b, a)
            await first.holder.stop()  # resigns: the key is deleted, the other takes it without waiting
            assert not first.running
            await until(lambda: second.running, 10.0, "the other member taking the link")
            await second.holder.stop()

    asyncio.run(scenario())
