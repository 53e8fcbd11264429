"""What the packet handlers work with besides the session they act on: the broker and the client connection.

``BrokerContext`` is everything a handler in ``broker_edge.engine.handlers`` reads or calls of the broker:
the configuration, the router, the ACL, the PUBLISH path, the counters and a clock; what a cluster lets in
is read from ``cluster``, the broker's ports (``broker_edge.engine.ports``). ``Client`` is the connection a
packet came on, as the handlers see it: what they read of it and the effects they ask of it (write, close,
refuse, hold reading). Both are declared here, where they are used: ``engine.core.BrokerCore`` and
``engine.connection.connection.Connection`` are what the broker runs with; the handler unit tests build a
core with a clock they move by hand and feed bytes to real connections, without a socket or a loop.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from broker_edge.engine.answers import Publisher
from broker_edge.engine.publish import HeldReader
from broker_edge.engine.sessions.session import Outlet

if TYPE_CHECKING:
    from broker_edge.engine.connection.terms import Terms
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.ports import ClusterPorts, MovedClaim
    from broker_edge.engine.publish import PublishPath
    from broker_edge.engine.routing.router import Router
    from broker_edge.engine.sessions.session import Session
    from broker_edge.observe.counters import BrokerCounters
    from broker_edge.protocol.codec import PacketDecoder
    from broker_edge.protocol.errors import MQTTError
    from broker_edge.protocol.packets import Packet, Will
    from broker_edge.security.acl import AccessControl
    from broker_edge.security.auth import PasswordFile
    from broker_edge.security.login_backoff import LoginBackoff
    from broker_edge.security.topic_quota import TopicShares
    from broker_edge.settings.broker import BrokerConfig

__all__ = ["BrokerContext", "Client"]


class BrokerContext(Protocol):
    """The broker as packet handlers see it."""

    @property
    def config(self) -> BrokerConfig: ...

    @property
    def router(self) -> Router: ...

    @property
    def acl(self) -> AccessControl | None: ...

    @property
    def replays(self) -> ReplayManager | None:
        """Log cursors and replays; None without a commitlog."""

    @property
    def publish_path(self) -> PublishPath: ...

    @property
    def counters(self) -> BrokerCounters: ...

    @property
    def passwords(self) -> PasswordFile | None:
        """The password file; None when there is none (a user name is then only a label)."""

    @property
    def login_backoff(self) -> LoginBackoff:
        """Failed logins per address and user name: a guesser is refused without a hash for a while."""

    @property
    def topic_shares(self) -> TopicShares:
        """Topic logs per identity (``limits.max_topics_per_identity``)."""

    @property
    def cluster(self) -> ClusterPorts:
        """The ports of the broker's cluster (``ALONE`` for a broker alone)."""

    @property
    def reserved_topics(self) -> Callable[[str], bool] | None:
        """Whether a topic is written here by another writer only (a site's downlink, which its hub alone
        writes): a client's PUBLISH to one is refused (None: no topic is)."""

    def now(self) -> float:
        """Seconds on the broker's monotonic clock (the one keepalive deadlines and rate buckets use)."""

    def verify_password(self, username: str, password: bytes | None, done: Callable[[bool], None]) -> None:
        """Check a password off the loop (hashes are slow on purpose) and call ``done`` with the answer."""


class Client(Outlet, Publisher, HeldReader, Protocol):
    """The connection a packet came on, as the handlers see it (it is the session's ``Outlet`` and the PUBLISH
    path's ``Publisher`` too)."""

    terms: Terms[Any]
    """What CONNECT settled and where the connection is in its life (shared by value: replaced, never
    changed)."""
    session: Session | None
    """Its session once CONNECT is accepted."""
    deadline: float
    named: str
    """The client id while it has no session."""
    will: Will | None
    will_delay: int
    expiry_lowered: bool
    aliases_in: dict[int, str] | None
    """Topic aliases the client set towards the broker."""
    peer_cn: str | None
    """The common name of the client's TLS certificate."""
    peer_uri: str
    """The ``timestone://`` URI its TLS certificate names (a member's, a site's), or ""."""
    handed_in: str
    """The member that moved this connection here ("": it connected here; ``connection.handover``)."""
    moved_claim: MovedClaim | None
    """The registry record of its session the member that moved it here wrote (None: none came)."""
    decoder: PacketDecoder

    @property
    def version(self) -> int:
        """The protocol level of its CONNECT."""

    def write(self, data: bytes) -> None: ...

    def send_packet(self, packet: Packet) -> None: ...

    def send_pubcomp(self, packet_id: int, reason_code: int = 0) -> None: ...

    def hold(self, reason: int) -> None:
        """Stop reading while ``reason`` holds (``states.HELD_*``); the packets read meanwhile wait."""

    def release(self, reason: int) -> None: ...

    def protocol_error(self, error: MQTTError) -> None:
        """A packet broke the protocol: tell a v5 client why, then close."""

    def refuse(
        self,
        reason: str | None,
        code: int | None,
        text: str | None = None,
        version: int | None = None,
        server_reference: str | None = None,
    ) -> None:
        """Refuse the connection before CONNACK 0 (the one place a connection is refused)."""

    def attached(self) -> None:
        """Its CONNECT was accepted: it is its session's connection from now on."""

    def peer_host(self) -> str: ...

    def log(self) -> logging.LoggerAdapter[logging.Logger]: ...
