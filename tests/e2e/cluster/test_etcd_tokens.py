"""A call refused for an auth token etcd forgot is made again under a new token, whichever channel the client
uses by then: after an etcd restart the watches etcd refuses make the client open a new channel while other
calls are still under way on the old one, and each of those, refused "invalid auth token", must be made again
under a new token, not fail (a member took such a failure for etcd unreachable: "still fenced ... invalid
auth token", and half a second more to recover)."""

from __future__ import annotations

import asyncio
import contextlib

from tests.harness.local_cluster import EtcdTarget


def test_a_call_refused_for_a_forgotten_token_is_made_again_when_the_channel_was_renewed_meanwhile(
    private_etcd: EtcdTarget,
) -> None:
    root = private_etcd.prefix
    server = private_etcd.server

    async def scenario() -> bytes | None:
        etcd = private_etcd.client(timeout_s=5.0)
        try:
            await etcd.put(f"{root}/k", b"v")  # authenticated: the client holds a token
            server.etcdctl("auth", "disable")  # etcd forgets every token (as when it restarts with a
            server.etcdctl("auth", "enable")  # token not replayed from its log)
            server.pause()
            try:
                # the call goes out on the old channel with the forgotten token; the channel is renewed
                # before etcd answers it
                read = asyncio.ensure_future(etcd.get(f"{root}/k"))
                await asyncio.sleep(0.5)
                etcd.renew("a renewal while a call is under way")
            finally:
                server.resume()
            found = await read
            return None if found is None else found.value
        finally:
            with contextlib.suppress(Exception):
                await etcd.close()

    assert asyncio.run(scenario()) == b"v"
