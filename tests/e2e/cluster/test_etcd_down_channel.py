"""A client that authenticates to etcd keeps one gRPC channel while etcd is down: each call fails (its
authentication cannot be made) and the next tries again on the same channel, which gRPC reconnects
meanwhile; once etcd is back a call succeeds on it. The client opened a new channel for every call instead,
closed it when the authentication failed, and the error's traceback held it until the garbage collector
ran: with a broker's collector settings (young collections every 100,000 allocations, `runtime`) the
closed channels piled up, and gRPC's threads spent CPU on each one not yet freed, a third of a core within
two minutes of etcd going away. And a client closed while a channel it replaced is in its grace period
closes that one too."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time

import grpc.aio
import pytest

from broker_edge.cluster.coordination.etcd import EtcdError
from tests.harness.local_cluster import EtcdTarget

pytestmark = pytest.mark.timeout(60)

FAILED_CALLS = 20


def live_channels() -> int:
    return sum(1 for thing in gc.get_objects() if isinstance(thing, grpc.aio.Channel))


def test_a_client_whose_etcd_is_down_keeps_one_channel_and_is_served_on_it_once_etcd_is_back(
    private_etcd: EtcdTarget,
) -> None:
    root = private_etcd.prefix
    server = private_etcd.server

    async def scenario() -> tuple[int, int, bytes | None]:
        etcd = private_etcd.client(timeout_s=1.0)
        try:
            await etcd.put(f"{root}/k", b"v")
            server.kill()
            etcd.renew("a client made while etcd is down")  # not connected yet: each call authenticates
            gc.collect()
            gc.disable()  # what is not freed by reference counting stays, as between a broker's collections
            try:
                before = live_channels()
                failures = 0
                for _ in range(FAILED_CALLS):
                    try:
                        await etcd.get(f"{root}/k")
                    except EtcdError:
                        failures += 1
                opened = live_channels() - before
            finally:
                gc.enable()
            server.start()
            deadline = time.monotonic() + 20
            while True:
                try:
                    found = await etcd.get(f"{root}/k")
                    break
                except EtcdError:
                    assert time.monotonic() < deadline, "etcd is back but the client is not served"
                    await asyncio.sleep(0.2)
            return failures, opened, None if found is None else found.value
        finally:
            with contextlib.suppress(Exception):
                await etcd.close()

    failures, opened, value = asyncio.run(scenario())
    assert failures == FAILED_CALLS  # every call failed while etcd was down
    assert opened <= 1, f"{opened} channels opened for {FAILED_CALLS} calls while etcd was down"
    assert value == b"v"


def test_closing_a_client_closes_the_channel_a_renewal_replaced_before_its_grace_period_ends(
    etcd: EtcdTarget,
) -> None:
    """``renew`` closes the channel it replaced after a grace period (its watches are made again meanwhile);
    a client closed before that closes it too, instead of leaving it open for the rest of the process."""

    async def scenario() -> tuple[bool, bool, bool]:
        client = etcd.client(timeout_s=5.0)
        replaced = client._client
        try:
            await client.put(f"{etcd.prefix}/k", b"v")
            client.renew("a renewal just before the client is closed")
            await client.get(f"{etcd.prefix}/k")  # served on the new channel
            open_before = replaced.channel is not None
        finally:
            await client.close()
        return open_before, replaced.channel is None, client._client.channel is None

    open_before, replaced_closed, current_closed = asyncio.run(scenario())
    assert open_before  # in its grace period: still open
    assert replaced_closed
    assert current_closed
