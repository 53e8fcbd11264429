"""A connected site's certificate, watched: its link ends with the certificate's authorization.

OpenSSL checks a site's certificate at the handshake only, and a site's link lasts for weeks: without this,
a site connected before its certificate expired, before a SIGHUP read ``uplink_hub.tls.cafile`` without its
CA (the end of a CA rotation, a CA found compromised), or before the CRL in ``crlfile`` listed it (a site's
key stolen), kept sending into its namespace for as long as its link held. The hub notes each site's chain at
connect (``security.peer_chain``: when it ends, the CAs it needs, its issuer and serial number) and ends the
link:

- when the chain ends (the site's certificate, or a CA of it, expires): one timer for every site
  (``CertificateEnds``), counted as ``expired``;
- at a reload whose ``cafile`` lacks a CA the chain needs (``untrusted``), or whose CRLs list it
  (``revoked``).

The site is sent ``ERROR`` saying why, then its connection is closed (WebSocket close 1008); one WARNING
each, naming the site; counted in ``SiteStatus.certificate_closes`` (``site_status.CLOSE_REASONS``). What
it appended stays: a site that comes back with a renewed certificate resumes from the hub's ends, and its
handshake with the old one is refused by OpenSSL as any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from aiohttp import WSCloseCode

from broker_edge.engine.connection.certificate_ends import CertificateEnds
from broker_edge.security.peer_chain import CertificateId, certificate_id, peer_chain
from broker_edge.security.tls import peer_common_name
from broker_edge.uplink.wire import ERROR, encode

if TYPE_CHECKING:
    import ssl

    from aiohttp import web

    from broker_edge.security.client_trust import ClientTrust
    from broker_edge.uplink.site_status import SiteStatus

__all__ = ["SiteCertificates", "SiteConnection"]

log = logging.getLogger("broker_edge.uplink.hub")


class _SiteLog(logging.LoggerAdapter):
    """The hub's logger, each line beginning with the site it is of."""

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        site = (self.extra or {}).get("site")
        return f"site {site}: {msg}", kwargs


class SiteConnection:
    """One site's connection as its certificate's watch sees it (``certificate_ends.Ending``)."""

    def __init__(
        self,
        site: str,
        ws: web.WebSocketResponse,
        status: SiteStatus,
        ssl_object: ssl.SSLObject | None,
        closing: set[asyncio.Task[None]],
    ) -> None:
        self.site = site
        self.ws = ws
        self.status = status
        self.peer_cn = peer_common_name(ssl_object)
        self.certificate: CertificateId | None = certificate_id(ssl_object)
        self.needs: frozenset[bytes] | None = None
        self.cas: frozenset[CertificateId] | None = None
        self.ended = False
        self._closing = closing

    def log(self) -> logging.LoggerAdapter[logging.Logger]:
        return _SiteLog(log, {"site": self.site})

    def close(
        self, reason_code: int | None = None, reason_string: str | None = None, counted_as: str = ""
    ) -> None:
        """End the link: ``ERROR`` saying ``reason_string``, then the close; counted once by ``counted_as``
        (``certificate_expired`` and the like)."""
        if self.ended:
            return
        self.ended = True
        reason = counted_as.removeprefix("certificate_")
        closes = self.status.certificate_closes
        closes[reason] = closes.get(reason, 0) + 1
        message = (
            f"site {self.site!r}: {reason_string}: the hub ends this link; connect again with a renewed "
            "certificate"
        )
        task = asyncio.get_running_loop().create_task(self._end(message), name=f"uplink-end-{self.site}")
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def flush(self) -> None:
        pass

    async def _end(self, message: str) -> None:
        ws = self.ws
        if ws.closed:
            return
        with contextlib.suppress(ConnectionError, RuntimeError, TimeoutError):
            await asyncio.wait_for(ws.send_bytes(encode(ERROR, {"message": message})), 1.0)
        await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=b"certificate")


class SiteCertificates:
    """The certificates of the sites connected to a hub, watched (module docstring); ``trust``: what the
    hub's TLS files accept as of their last reload (its ``ServerContexts.trust``; None without ``cafile``)."""

    def __init__(self, trust: ClientTrust | None) -> None:
        self.trust = trust
        self.ends = CertificateEnds()
        self.connections: dict[int, SiteConnection] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def refused_at_connect(self, ssl_object: ssl.SSLObject | None) -> tuple[str, str] | None:
        """Why a connection on a resumed TLS session is refused (its reason and the line to say), or None. A
        resumed session is not verified again: one begun before a reload would let a certificate that reload
        no longer trusts, or revokes, back in. A full handshake was checked against the files in force."""
        trust = self.trust
        if ssl_object is None or not ssl_object.session_reused or trust is None or not trust.reloads:
            return None
        chain = peer_chain(ssl_object)
        if trust.revokes(certificate_id(ssl_object), chain.cas if chain is not None else None):
            return "revoked", "its certificate is revoked (uplink_hub.tls.crlfile)"
        if chain is not None and trust.lacks(chain.needs):
            return "untrusted", "its certificate is no longer trusted (uplink_hub.tls.cafile lacks its CA)"
        return None

    def watch(
        self, site: str, ws: web.WebSocketResponse, status: SiteStatus, ssl_object: ssl.SSLObject | None
    ) -> SiteConnection:
        """At connect: ``site``'s connection ``ws`` ended when its certificate chain does (at once when it
        already has: a resumed TLS session is not verified again)."""
        connection = SiteConnection(site, ws, status, ssl_object, self._closing)
        chain = peer_chain(ssl_object)
        if chain is not None:
            connection.needs, connection.cas = chain.needs, chain.cas
            self.ends.watch(connection, chain.end, chain.ending, _call_later)
        self.connections[id(connection)] = connection
        return connection

    def forget(self, connection: SiteConnection) -> None:
        """``connection`` ended: nothing to watch."""
        self.connections.pop(id(connection), None)
        self.ends.forget(connection)

    def reloaded(self) -> int:
        """After a reload of the hub's TLS files: end the links whose chain needs a CA the new ``cafile``
        lacks, or whose certificate its CRLs list (``trust``, read by that reload); how many were."""
        trust = self.trust
        if trust is None:
            return 0
        ended = 0
        for connection in list(self.connections.values()):
            if connection.ended:
                continue
            if trust.revokes(connection.certificate, connection.cas):
                certificate, name = connection.certificate, connection.peer_cn
                said = trust.revocation_said(certificate, connection.cas, name, "certificate")
                connection.log().warning("closing its uplink: %s", said)
                connection.close(None, "its certificate is revoked", counted_as="certificate_revoked")
            elif trust.lacks(connection.needs):
                connection.log().warning(
                    "closing its uplink: its certificate (CN=%s) is no longer trusted: %s lacks a CA its "
                    "chain rests on",
                    connection.peer_cn,
                    trust.cafile,
                )
                connection.close(
                    None, "its certificate is no longer trusted", counted_as="certificate_untrusted"
                )
            else:
                continue
            self.forget(connection)
            ended += 1
        return ended


def _call_later(delay: float, callback: Callable[[], None]) -> None:
    asyncio.get_running_loop().call_later(delay, callback)
