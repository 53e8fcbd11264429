"""What the packet handlers and a connection may use of the broker: two narrow, typed interfaces.

``BrokerContext`` is everything a handler in ``broker_edge.handlers`` reads or calls besides the connection
and session it acts on: the configuration, the router, the ACL, the PUBLISH path, the counters and a clock.
``ConnectionHost`` adds what the connection itself needs from its broker: admission, the end-of-iteration
write flush and timers. ``server.Broker`` implements both over the event loop; the handler unit tests build
one from the same parts with a clock they move by hand, and feed bytes without a socket or a loop.
What a cluster lets in is read from ``cluster``, the broker's ports (``broker_edge.engine.ports``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import Connection
    from broker_edge.engine.cursors import ReplayManager
    from broker_edge.engine.ports import ClusterPorts
    from broker_edge.engine.publish import PublishPath
    from broker_edge.engine.routing.router import Router
    from broker_edge.observe.counters import BrokerCounters
    from broker_edge.security.acl import AccessControl
    from broker_edge.security.auth import PasswordFile
    from broker_edge.security.login_backoff import LoginBackoff
    from broker_edge.security.topic_quota import TopicShares
    from broker_edge.settings.broker import BrokerConfig

__all__ = ["BrokerContext", "ConnectionHost"]


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

    def now(self) -> float:
        """Seconds on the broker's monotonic clock (the one keepalive deadlines and rate buckets use)."""

    def verify_password(self, username: str, password: bytes | None, done: Callable[[bool], None]) -> None:
        """Check a password off the loop (hashes are slow on purpose) and call ``done`` with the answer."""


class ConnectionHost(BrokerContext, Protocol):
    """The broker as a ``Connection`` sees it: its handlers' context plus admission, flushing and timers."""

    partial_bytes: int
    """Bytes of packets not fully arrived, over all connections (``limits.max_partial_packet_bytes``)."""

    def connection_opened(self, conn: Connection) -> None:
        """Admit (or refuse) a new connection and start its CONNECT deadline."""

    def connection_closed(self, conn: Connection, was_connected: bool) -> None: ...

    def connection_attached(self, conn: Connection) -> None:
        """``conn`` became its session's connection (CONNECT accepted)."""

    def connection_detached(self, conn: Connection) -> None:
        """``conn`` let go of its session while still open (taken over)."""

    def schedule_flush(self, conn: Connection) -> None:
        """Write ``conn``'s batched packets at the end of this loop iteration."""

    def call_soon(self, callback: Callable[[], None]) -> None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> None: ...
