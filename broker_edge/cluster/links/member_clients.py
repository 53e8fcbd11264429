"""HTTP clients to the other members: one session per member, which talks to that member only.

Everything a broker asks of another member over HTTP (the peer link's WebSocket, replica fetches, log
ends for an election, reads of a topic it holds no copy of) goes through ``MemberClients.session(node)``.
Each session's connector, with ``cluster.tls``, connects to the address etcd gives for the node, checks in
the TLS handshake that the certificate chains to the cluster CA (presenting this broker's own), and then,
before the request is written, that the certificate names that node id (``member_identity``): a stranger
at that address, or another member, gets no request, no header, no record. A session is bound to its
node, so a pooled connection verified as one node is never used for another, whatever etcd says later.

A connection kept alive is reused by the next request to the same member for as long as requests come (a
replica fetcher's never stop), and OpenSSL checked the member's certificate at its handshake only: before a
pooled connection carries a request, the certificate it was opened with is checked as a peer link's is
(``http.peer_certificates``: its chain's end, and this member's ``cluster.tls.cafile`` as last reloaded).
One no longer accepted is closed, said and counted, and the request goes on a new connection, whose
handshake succeeds or fails as any.

Requests say which node sends them (``X-Timestone-Node``); with TLS the other side believes the
certificate, not the header, and refuses a header that differs. Without ``cluster.tls`` (development, on
loopback only) there is nothing to check and the header is believed.
"""

from __future__ import annotations

import asyncio
import ssl
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import aiohttp

from broker_edge.cluster.links.member_identity import node_of_certificate

if TYPE_CHECKING:
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.client_reqrep import ClientRequest
    from aiohttp.connector import Connection
    from aiohttp.tracing import Trace

    from broker_edge.cluster.links.member_identity import MemberTls
    from broker_edge.http.peer_certificates import CertificateCheck, PeerCertificate

__all__ = ["NODE_HEADER", "NOT_KNOWN_YET_S", "FailureStreak", "MemberClients", "NotThatMember"]

NODE_HEADER = "X-Timestone-Node"
"""The node id a member's request comes from (checked against its certificate)."""
NOT_KNOWN_YET_S = 5.0
"""How long a member calls another that refuses it as no member (403) before that is worth a WARNING: a
member that has just registered (a start, a restart) is refused until the other's view of etcd has the new
registration, which one watch event later it has."""


class FailureStreak:
    """Consecutive failures of one call to another member, and which of them to log at WARNING: the first,
    then every ``every``-th; a 403 refusal only once it has lasted ``NOT_KNOWN_YET_S`` (before that the
    other member may not know this one yet)."""

    def __init__(self, every: int) -> None:
        self.every = every
        self.count = 0
        self._warned = 0
        self._since = 0.0

    def failed(self, now: float, refused: bool) -> bool:
        """Count a failure at ``now`` (``refused``: answered 403); whether to log it at WARNING."""
        if self.count == 0:
            self._since = now
        self.count += 1
        if refused and now - self._since < NOT_KNOWN_YET_S:
            return False
        self._warned += 1
        return self._warned == 1 or self.count % self.every == 0

    def succeeded(self) -> None:
        self.count = self._warned = 0


class NotThatMember(aiohttp.ServerFingerprintMismatch):
    """The certificate at a member's address does not name that member (nothing was sent)."""

    def __str__(self) -> str:
        return (
            f"the certificate at {self.host}:{self.port} names {self.got.decode() or 'no member'}, "
            f"not {self.expected.decode()}: nothing sent"
        )


class _NodeCheck:
    """What aiohttp runs on a new connection right after its TLS handshake (in place of a certificate
    fingerprint): the certificate must name ``node_id``."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def check(self, transport: asyncio.Transport) -> None:
        named = node_of_certificate(transport.get_extra_info("peercert"))
        if named != self.node_id:
            host, port, *_ = transport.get_extra_info("peername") or ("?", 0)
            raise NotThatMember(self.node_id.encode(), (named or "").encode(), host, port)


class _MemberConnector(aiohttp.TCPConnector):
    """A connector to one member: the cluster's client certificate and CAs (read again after a reload),
    the node check before anything is sent, and the member's certificate checked again before a kept-alive
    connection is reused. Plain http:// is refused when members use TLS."""

    def __init__(
        self, node_id: str, tls: MemberTls | None, check: CertificateCheck | None, **options: Any
    ) -> None:
        super().__init__(**options)
        self._node_check = _NodeCheck(node_id)
        self._tls = tls
        self._check = check
        self._served: weakref.WeakKeyDictionary[ResponseHandler, PeerCertificate | None] = (
            weakref.WeakKeyDictionary()
        )
        """The certificate each connection's member served, noted at its first request."""

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        """A connection for ``req``: a kept-alive one whose member's certificate is still accepted, else a
        new one (its handshake checks the certificate)."""
        from broker_edge.http.peer_certificates import peer_certificate

        while True:
            connection = await super().connect(req, traces, timeout)
            protocol, check = connection.protocol, self._check
            if protocol is None or check is None:
                return connection
            if protocol not in self._served:  # new: its handshake checked it now
                self._served[protocol] = peer_certificate(connection.transport, "server")
                return connection
            served = self._served[protocol]
            why = check.why(served) if served is not None else None
            if why is None:
                return connection
            check.say(why[0], f"closing a kept-alive connection before a request: {why[1]}")
            connection.close()

    def _get_ssl_context(self, req: ClientRequest) -> ssl.SSLContext | None:
        if self._tls is None:
            return super()._get_ssl_context(req)
        if not req.is_ssl():
            raise aiohttp.ClientConnectionError(
                f"{req.url.host}:{req.url.port}: members are reached over https:// only (cluster.tls)"
            )
        return self._tls.client_context

    def _get_fingerprint(self, req: ClientRequest) -> Any:
        return self._node_check if self._tls is not None else None


class MemberClients:
    """This node's sessions to the other members (see the module docstring)."""

    def __init__(
        self, node_id: str, tls: MemberTls | None, refused: Callable[[str], None] | None = None
    ) -> None:
        self.node_id = node_id
        self.tls = tls
        self.refused = refused
        """Told the reason of each kept-alive connection closed for the certificate its member served."""
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self.headers = {NODE_HEADER: node_id}

    def session(self, node_id: str) -> aiohttp.ClientSession:
        """The session to ``node_id`` (made on first use, on the running loop)."""
        session = self._sessions.get(node_id)
        if session is None or session.closed:
            connector = _MemberConnector(
                node_id, self.tls, self._check(node_id), limit=0, enable_cleanup_closed=True
            )
            session = self._sessions[node_id] = aiohttp.ClientSession(
                connector=connector, headers=self.headers
            )
        return session

    def _check(self, node_id: str) -> CertificateCheck | None:
        """The check of the certificate ``node_id`` served on a kept-alive connection (None: no TLS)."""
        if self.tls is None:
            return None
        from broker_edge.http.peer_certificates import CertificateCheck

        return CertificateCheck(f"connections to member {node_id}", self.tls.server.trust, self.refused)

    async def forget(self, node_id: str) -> None:
        """``node_id`` left the cluster: close its session (its connections with it)."""
        session = self._sessions.pop(node_id, None)
        if session is not None:
            await session.close()

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()
