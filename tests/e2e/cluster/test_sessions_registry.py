"""The session registry on a real etcd under a reconnect storm: every CONNECT of a cluster node reads and
writes its client id's record, and a burst of them is sent a few at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from broker_edge.cluster.coordination.etcd import Etcd
from broker_edge.cluster.features.sessions_records import SessionRecord
from broker_edge.cluster.features.sessions_registry import CALLS_IN_FLIGHT, SessionRegistry
from tests.e2e.cluster.conftest import EtcdTarget

pytestmark = pytest.mark.timeout(120)

CLIENTS = 400


class CountedCalls:
    """Wraps the key calls of a real ``Etcd`` to count those outstanding at once (the highest count)."""

    def __init__(self, etcd: Etcd) -> None:
        self.now = self.most = self.calls = 0
        for name in ("get", "get_prefix", "create", "compare_and_swap", "delete_if"):
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
