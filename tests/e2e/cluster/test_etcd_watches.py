"""Watches of one etcd client stay on their own ranges when etcd answers late. aetcd takes the next
"created" answer on its stream for the watch it is waiting for: a watch whose creation timed out while
etcd was paused is answered once etcd runs again, and that answer must not wire the watch being made then
to the first one's range (its events delivered there, its own range's nowhere)."""

from __future__ import annotations

import asyncio
import contextlib

from broker_edge.cluster.coordination.etcd import Etcd, WatchEvent
from tests.harness.local_cluster import EtcdTarget


async def _first_event(etcd: Etcd, prefix: str, retry_delay_s: float) -> WatchEvent:
    events = etcd.watch_prefix(prefix, 1, retry_delay_s=retry_delay_s)
    try:
        return await asyncio.wait_for(anext(events), 30)
    finally:
        await events.aclose()


def test_a_watch_made_while_another_one_s_creation_timed_out_gets_its_own_range(
    private_etcd: EtcdTarget,
) -> None:
    root = private_etcd.prefix

    async def scenario() -> tuple[WatchEvent, WatchEvent]:
        etcd = private_etcd.client(timeout_s=1.0)
        try:
            await etcd.put(f"{root}/warm", b"1")
            private_etcd.server.pause()
            try:
                # a's creation times out (1.5 s) and it waits 4 s before it tries again; b is being made
                # when etcd runs again and a's first create is answered
                first = asyncio.ensure_future(_first_event(etcd, f"{root}/a/", retry_delay_s=4.0))
                await asyncio.sleep(2.0)
                second = asyncio.ensure_future(_first_event(etcd, f"{root}/b/", retry_delay_s=0.1))
                await asyncio.sleep(0.5)
            finally:
                private_etcd.server.resume()
            await asyncio.sleep(1.0)
            await etcd.put(f"{root}/a/x", b"a")
            await etcd.put(f"{root}/b/y", b"b")
            return await first, await second
        finally:
            with contextlib.suppress(Exception):
                await etcd.close()

    a, b = asyncio.run(scenario())
    assert (a.key, b.key) == (f"{root}/a/x", f"{root}/b/y")
