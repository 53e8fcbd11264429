"""The client certificate a kept-alive HTTPS connection was opened with, checked at each of its requests.

OpenSSL checks a client certificate at the handshake only, and aiohttp keeps a connection alive for as many
requests as its client sends: a reader (or member) whose certificate expired, or whose CA a SIGHUP took out
of ``cafile``, or whose certificate the reloaded CRLs list, was served on the connection it had opened
before. Each connection notes at its handshake what its certificate rests on (``PeerCertificate``: the end
of its chain, the CAs it needs, its issuer and serial number; read once, ``security.peer_chain``); each
request compares the end with the clock, and the reload count of the endpoint's TLS files with the one its
connection was last checked against (the endpoint's ``security.client_trust.ClientTrust``, read by its
reload): nothing is parsed or read per request.

A connection this process dials and holds (a member's peer link, a site's uplink) is checked the same way,
from its side: what the server presented at the handshake (``server_certificate``), its end and the reloads
of the dialer's own CA file, every second (``close_when_ended``), as the serving side checks the dialer's.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from aiohttp import web

from broker_edge.security.peer_chain import CertificateId, certificate_id, peer_chain
from broker_edge.security.tls import peer_common_name

if TYPE_CHECKING:
    import ssl

    from broker_edge.security.client_trust import ClientTrust

__all__ = [
    "CertificateCheck",
    "PeerCertificate",
    "certificate_ended",
    "close_when_ended",
    "peer_certificate",
    "watch_dialed",
]

log = logging.getLogger("broker_edge.http.guard")


@dataclass(slots=True)
class PeerCertificate:
    """What a connection's client certificate rests on, noted at its handshake."""

    name: str | None
    """Its subject CN, for the log line."""
    end: float
    """The earliest notAfter of its chain (Unix time)."""
    ending: str
    """Whose end that is: "" for the client's certificate, else the CA's subject."""
    needs: frozenset[bytes]
    """The CAs a CA file must hold for the chain to verify (``peer_chain.trusted_keys``)."""
    certificate: CertificateId | None
    """Its issuer and serial number, as a CRL lists it."""
    checked: int = 0
    """The reload of the endpoint's TLS files it was last checked against (``ClientTrust.reloads``)."""
    side: str = "client"
    """Which end presented it: "client", or "server" (a connection this process dialed)."""
    cas: frozenset[CertificateId] = frozenset()
    """The CAs of its chain, each by issuer and serial number (CRLs checked for the chain may list one)."""


def peer_certificate(transport: Any, side: str = "client") -> PeerCertificate | None:
    """What the certificate the other end of ``transport``'s TLS connection presented rests on (its
    client's; ``side`` "server": its server's, on a connection dialed); None: plain, or no certificate."""
    ssl_object: ssl.SSLObject | None = transport.get_extra_info("ssl_object") if transport else None
    chain = peer_chain(ssl_object)
    if chain is None:
        return None
    name, certificate = peer_common_name(ssl_object), certificate_id(ssl_object)
    return PeerCertificate(name, chain.end, chain.ending, chain.needs, certificate, side=side, cas=chain.cas)


def server_certificate(connection: Any) -> PeerCertificate | None:
    """What the server certificate of a connection this process dialed rests on (``connection``: its
    transport, or an aiohttp client WebSocket); None: plain."""
    return peer_certificate(connection, "server")


def _expired(peer: PeerCertificate) -> tuple[str, str]:
    when = f"{datetime.datetime.fromtimestamp(peer.end, datetime.UTC):%Y-%m-%d %H:%M:%S} UTC"
    whose = f"the certificate of its CA ({peer.ending})" if peer.ending else f"its {peer.side} certificate"
    return "certificate_expired", f"{whose} expired at {when} (CN={peer.name})"


class CertificateCheck:
    """An HTTPS endpoint's check of the client certificate of each request's connection: ``name`` in its
    log lines, ``trust`` for what a reload no longer accepts (None: the end alone), ``counted(reason)`` told
    of each refusal."""

    def __init__(
        self, name: str, trust: ClientTrust | None = None, counted: Callable[[str], None] | None = None
    ) -> None:
        self.name = name
        self.trust = trust
        self.counted = counted

    def refused(self, request: web.Request, peer: PeerCertificate) -> web.Response | None:
        """The answer to ``request`` on a connection whose certificate ``peer`` is no longer accepted (403,
        the connection closed after it; counted, one WARNING), or None: it is served (and its connection's
        certificate kept on it, for ``certificate_ended``)."""
        request[_NOTED] = (self, peer)
        why = self.why(peer)
        if why is None:
            return None
        reason, line = why
        self.say(reason, f"refused a request from {request.remote} and closed its connection: {line}")
        body = {"error": reason, "message": f"{line}: connect again with a renewed certificate"}
        answer = web.json_response(body, status=HTTPStatus.FORBIDDEN)
        answer.force_close()
        return answer

    def why(self, peer: PeerCertificate) -> tuple[str, str] | None:
        """Why ``peer``'s certificate is no longer accepted (its reason and the line to say), or None."""
        if time.time() >= peer.end:
            return _expired(peer)
        return self._reloaded(peer)

    def _reloaded(self, peer: PeerCertificate) -> tuple[str, str] | None:
        """Why ``peer``'s certificate is no longer accepted since the last reload, or None; checked once per
        reload."""
        trust = self.trust
        if trust is None or peer.checked == trust.reloads:
            return None
        peer.checked = trust.reloads
        return trust.refusal(peer.certificate, peer.needs, peer.name, peer.side, peer.cas)

    def say(self, reason: str, line: str) -> None:
        """One WARNING naming the endpoint, counted as ``reason``."""
        if self.counted is not None:
            self.counted(reason)
        log.warning("%s: %s", self.name, line)


_NOTED: web.RequestKey[tuple[CertificateCheck, PeerCertificate]] = web.RequestKey("peer_certificate")
"""The check and the client certificate of a request's connection (``CertificateCheck.refused``)."""

ENDED_POLL_S = 1.0
"""How often ``certificate_ended`` and ``close_when_ended`` look at the reloads (a few long-lived
connections)."""


async def _no_longer_accepted(check: CertificateCheck, peer: PeerCertificate) -> tuple[str, str]:
    """Return once ``peer``'s certificate is no longer accepted by ``check``: why (reason, line)."""
    while (why := check.why(peer)) is None:
        await asyncio.sleep(min(max(peer.end - time.time(), 0.0), ENDED_POLL_S))
    return why


async def certificate_ended(request: web.Request) -> None:
    """Return once the client certificate of ``request``'s connection is no longer accepted (its chain
    ended, or a reload no longer trusts or revokes it), said and counted; never when its endpoint does not
    check certificates. For a request that holds its connection for good (a WebSocket), which no next
    request refuses: its handler closes it then."""
    noted = request.get(_NOTED)
    if noted is None:
        await asyncio.Event().wait()
        return
    check, peer = noted
    reason, line = await _no_longer_accepted(check, peer)
    check.say(reason, f"closing the connection of {request.remote} ({request.path}): {line}")


async def close_when_ended(
    check: CertificateCheck, peer: PeerCertificate, close: Callable[[], Awaitable[object]]
) -> None:
    """Call ``close`` once the server certificate ``peer`` of a connection this process dialed is no longer
    accepted (its chain ended, or a reload of the dialer's CA file no longer trusts or revokes it), said
    (one WARNING naming ``check``'s connection) and counted: the dialer dials again, and its next handshake
    succeeds or fails as any."""
    reason, line = await _no_longer_accepted(check, peer)
    check.say(reason, f"closing the connection: {line}")
    with contextlib.suppress(ConnectionError):
        await close()


def watch_dialed(
    name: str, trust: ClientTrust | None, counted: Callable[[str], None] | None, socket: Any
) -> asyncio.Task[None] | None:
    """Watch the server certificate of ``socket``, an aiohttp client WebSocket this process dialed and
    holds (named ``name`` in the lines said): closed once no longer accepted (``close_when_ended``; ``trust``:
    the dialer's CAs as of its last reload, None: the end alone), told to ``counted(reason)``. The task, to
    cancel when the socket closes otherwise; None on a plain socket."""
    peer = server_certificate(socket)
    if peer is None:
        return None
    check = CertificateCheck(name, trust, counted)
    return asyncio.get_running_loop().create_task(close_when_ended(check, peer, socket.close), name=name)
