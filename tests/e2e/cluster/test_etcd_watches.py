"""Watches of one etcd client stay on their own ranges when etcd answers late, and deliver again after etcd
restarts. aetcd takes the next "created" answer on its stream for the watch it is waiting for: a watch whose
creation timed out while etcd was paused is answered once etcd runs again, and that answer must not wire the
watch being made then to the first one's range (its events delivered there, its own range's nowhere). aetcd
also takes a create etcd refused (answered "created" and "canceled", watch id -1) for a watch made: one
made on a stream carrying an auth token etcd forgot (it restarted) must be made again, not wait for ever."""

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


def test_a_watch_made_again_after_an_etcd_restart_delivers_the_events_of_its_range(
    private_etcd: EtcdTarget,
) -> None:
    """etcd (user auth on) restarted forgets the client's token: the watch, made again while etcd was down on
    a stream carrying that token, is refused by etcd once it runs, and is made again under a new token (it
    waited for ever, delivering nothing). The key is written by another client: this one makes no other
    call that would authenticate it again."""
    root = private_etcd.prefix

    async def scenario() -> list[WatchEvent]:
        etcd = private_etcd.client(timeout_s=1.0)
        events = etcd.watch_prefix(f"{root}/a/", 1, retry_delay_s=0.1)
        try:
            await etcd.put(f"{root}/a/x", b"before")
            first = await asyncio.wait_for(anext(events), 30)
            second = asyncio.ensure_future(anext(events))  # the watch runs on meanwhile
            await asyncio.sleep(0.5)
            private_etcd.server.kill()
            await asyncio.sleep(0.5)  # the watch's stream ends; it is made again (every 0.1 s), etcd down
            private_etcd.server.start()
            await asyncio.sleep(1.0)  # and once etcd runs, before anything authenticates the client again
            private_etcd.server.put(f"{root}/a/y", b"after")
            return [first, await asyncio.wait_for(second, 30)]
        finally:
            await events.aclose()
            with contextlib.suppress(Exception):
                await etcd.close()

    delivered = asyncio.run(scenario())
    assert [(event.key, event.value) for event in delivered] == [
        (f"{root}/a/x", b"before"),
        (f"{root}/a/y", b"after"),
    ]
