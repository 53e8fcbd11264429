"""What the cluster's trust tests attack with: a reader's token, certificates, forged etcd records.

- ``members_url(target, node)``: where a member's members' endpoint is, as its record in etcd says.
- ``open_peer_link(url, claims, ...)``: try to open ``/v1/peer`` as ``claims`` (with a reader token, a
  client certificate, or neither): the HTTP status or the failure, and the WebSocket when one opened.
- ``forge_fetch(url, replica, ...)``: a replica fetch claiming to be ``replica``, saying it holds everything.
- ``client_context(pki, node)``: TLS as a node with a certificate of ``pki`` (the cluster's CA, another CA).
- ``Recorder``: a TCP server that keeps every byte it is sent, for a member record written into etcd.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from dataclasses import dataclass
from typing import Any

import aiohttp

from broker_edge.cluster.links.member_clients import NODE_HEADER
from broker_edge.cluster.replication.replica_fetch import (
    CONTENT_TYPE,
    PATH,
    FetchRequest,
    PartitionFetch,
    TopicPosition,
    encode_request,
)
from broker_edge.runtime.local_pki import LocalPki
from tests.harness.local_cluster import EtcdTarget, cluster_state

__all__ = ["Attempt", "Recorder", "client_context", "forge_fetch", "members_url", "open_peer_link"]

READER_TOKEN = "notebook-7c1e"
"""The token a data engineer is given: it reads every topic of the offsets API."""
READER_SECTIONS = {"offsets_api": {"tokens": [{"name": "notebook", "token": READER_TOKEN}]}}


def members_url(target: EtcdTarget, node: str) -> str:
    peer = cluster_state(target).members[node].peer
    assert peer is not None
    return peer


def client_context(pki: LocalPki | None = None, node: str | None = None) -> ssl.SSLContext:
    """A client that trusts any server (an intruder does not care) and shows ``node``'s certificate of
    ``pki`` when given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if pki is not None and node is not None:
        member = pki.member(node)
        context.load_cert_chain(str(member.cert), str(member.key))
    return context


@dataclass
class Attempt:
    """What one try got: an HTTP status (None when no HTTP answer came) and the failure, if any."""

    status: int | None
    failure: str | None
    received: int = 0
    """Messages that came on the WebSocket, had one opened."""

    @property
    def opened(self) -> bool:
        return self.status == 101


async def _peer_link(url: str, claims: str, token: str | None, context: ssl.SSLContext | None) -> Attempt:
    headers = {NODE_HEADER: claims}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            socket_ = await session.ws_connect(url + "/v1/peer", headers=headers, ssl=context or False)
        except aiohttp.WSServerHandshakeError as error:
            return Attempt(error.status, str(error))
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            return Attempt(None, f"{type(error).__name__}: {error}")
        received = 0
        try:
            while True:  # listen a moment: a member's link would carry publishes and keepalives
                message = await socket_.receive(timeout=1.0)
                if message.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    break
                received += 1
        except TimeoutError:
            pass
        await socket_.close()
        return Attempt(101, None, received)


def open_peer_link(
    url: str, claims: str, token: str | None = None, context: ssl.SSLContext | None = None
) -> Attempt:
    """Try to open a peer link at ``url`` claiming to be node ``claims``."""
    return asyncio.run(_peer_link(url, claims, token, context))


async def _fetch(url: str, body: bytes, token: str | None, context: ssl.SSLContext | None) -> Attempt:
    headers = {"Content-Type": CONTENT_TYPE}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            async with session.post(url + PATH, data=body, headers=headers, ssl=context or False) as answer:
                await answer.read()
                return Attempt(answer.status, None)
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            return Attempt(None, f"{type(error).__name__}: {error}")


def forge_fetch(
    url: str,
    replica: str,
    partition: int,
    epoch: int,
    topic: str,
    offset: int,
    token: str | None = None,
    context: ssl.SSLContext | None = None,
) -> Attempt:
    """A replica fetch claiming ``replica`` holds ``topic`` up to ``offset`` (what moves a watermark)."""
    positions = [TopicPosition(topic, offset, epoch)]
    request = FetchRequest(
        replica, 0, False, 0, 1 << 20, 1 << 20, [PartitionFetch(partition, epoch, positions)]
    )
    return asyncio.run(_fetch(url, encode_request(request), token, context))


class Recorder:
    """A TCP server on loopback keeping every byte any connection sends it (it answers nothing)."""

    def __init__(self) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(64)
        self.port: int = self.listener.getsockname()[1]
        self.received = bytearray()
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            try:
                while data := conn.recv(65536):
                    with self._lock:
                        self.received += data
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()

    def saw(self, text: bytes) -> bool:
        with self._lock:
            return text in self.received

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
