"""A member far from etcd (0.3 s each way, as across a WAN): it registers, and once etcd restarts it is
a member again (unfenced). Its channel to etcd gave each connection attempt (TCP, TLS, HTTP/2) at most
a second: a handshake of that many round trips never finished, and such a member never registered."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.request

import pytest

from tests.e2e.cluster.conftest import EtcdTarget
from tests.e2e.cluster.proof import cluster_state, wait_until

pytestmark = pytest.mark.timeout(120)

ONE_WAY_S = 0.3


class DelayedLink:
    """A TCP proxy on 127.0.0.1 that delivers every byte ``delay_s`` after it came, both ways (its own
    event loop, in a thread)."""

    def __init__(self, upstream_port: int, delay_s: float) -> None:
        self.upstream_port = upstream_port
        self.delay_s = delay_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        assert ready.wait(5), "the proxy did not start"

    def _run(self, ready: threading.Event) -> None:
        async def serve() -> None:
            server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            ready.set()
            await server.serve_forever()

        self._loop.run_until_complete(serve())

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(
            self._delayed(reader, up_writer), self._delayed(up_reader, writer), return_exceptions=True
        )

    async def _delayed(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                at, data = await due.get()
                await asyncio.sleep(max(0.0, at - time.monotonic()))
                if not data:
                    writer.close()
                    return
                writer.write(data)

        delivering = asyncio.create_task(deliver())
        try:
            while data := await reader.read(65536):
                due.put_nowait((time.monotonic() + self.delay_s, data))
        except OSError:
            pass
        due.put_nowait((time.monotonic() + self.delay_s, b""))
        await delivering


def fenced(offsets_api: str) -> bool:
    """What the member says of itself (``GET /v1/cluster``); fenced while it does not answer."""
    try:
        with urllib.request.urlopen(f"{offsets_api}/v1/cluster", timeout=2) as answer:
            return bool(json.loads(answer.read())["fenced"])
    except OSError:
        return True


def test_a_member_far_from_etcd_registers_and_is_a_member_again_after_etcd_restarts(
    private_etcd: EtcdTarget, cluster_brokers
):
    link = DelayedLink(private_etcd.server.client_port, ONE_WAY_S)
    member = cluster_brokers("far", target=private_etcd, etcd=[f"https://127.0.0.1:{link.port}"])
    offsets_api = member.offsets_url
    wait_until(lambda: "far" in cluster_state(private_etcd).members, 30, "far registered")
    wait_until(lambda: not fenced(offsets_api), 20, "far unfenced")

    private_etcd.server.kill()
    wait_until(lambda: fenced(offsets_api), 20, "far fenced while etcd is down")
    private_etcd.server.start()
    wait_until(lambda: not fenced(offsets_api), 30, "far a member again after etcd restarted")
    assert "far" in cluster_state(private_etcd).members
