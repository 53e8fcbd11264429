"""A connection's decoder: shared by idle connections, its own while a packet is half-read.

Until its CONNECT is decoded a connection has a decoder of its own (``OwnDecoder``); past it, it shares one
with the idle connections of its protocol version (``SharedDecoder``), and takes one of its own again only
while a packet is half-read (the start of a packet is moved over). The bytes of unfinished packets count
into one broker-wide budget (``limits.max_partial_packet_bytes``), so many clients each sending part of a
large packet cannot hold the broker's memory, and by client address (``PeerPartial``), so one address
cannot hold it against the others: over the budget, the address holding the most unfinished bytes gives
way. If that is the address of the connection that sent the last bytes, that connection is closed;
otherwise that address's connections holding the most are, until the budget holds again. What a closed
connection held leaves the budget at once, not when its socket is gone (nothing it sends after is read).
A read costs a dict update for its address; only a read passing the budget looks at every address that
holds unfinished bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from broker_edge.engine.connection.states import CONNECTED
from broker_edge.protocol.codec import PacketDecoder, SharedDecoder, shared_like
from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    import logging

    from broker_edge.engine.connection.terms import Terms
    from broker_edge.security.limits import LimitsConfig

__all__ = [
    "OwnDecoder",
    "PacketTurn",
    "PeerPartial",
    "forget_unfinished",
    "own_decoder",
    "settle_decoder",
    "unfinished_since",
]


class PacketTurn(Protocol):
    """What a read may handle of this turn of the event loop (``runtime.transports.turns.ReadTurns``)."""

    packets_left: int
    """Packets it may still handle (1 or more as a read starts); the read counts off those it handles."""


class Connection(Protocol):
    """What of a connection its decoder's bookkeeping uses (``connection.Connection`` is one)."""

    decoder: PacketDecoder
    terms: Terms[Any]

    def log(self) -> logging.LoggerAdapter[logging.Logger]: ...

    def peer_host(self) -> str: ...

    def close(self, reason_code: int | None = None, reason_string: str | None = None) -> None: ...

    def abort(self) -> None: ...


class OwnDecoder(PacketDecoder):
    """A decoder of one connection's own (until CONNECT, and while a packet is half-read), with the bytes
    of that packet counted into the host's ``partial_bytes`` and its address's ``PeerPartial`` (``peer``,
    set while ``counted``), and when it started arriving (host time; 0: none)."""

    __slots__ = ("counted", "peer", "since")
    hands_runs: ClassVar[bool] = True

    def __init__(self, limits: LimitsConfig) -> None:
        super().__init__(
            limits.max_packet_size,
            max_connect_size=limits.max_connect_packet_size,
            max_subscribe_filters=limits.max_subscribe_filters,
            max_user_properties=limits.max_user_properties,
        )
        self.counted = 0
        self.since = 0.0
        self.peer = ""


class PeerPartial:
    """The unfinished packets of one client address: their bytes, and the connections holding them."""

    __slots__ = ("bytes", "connections")

    def __init__(self) -> None:
        self.bytes = 0
        self.connections: dict[Connection, None] = {}


def own_decoder(conn: Connection) -> OwnDecoder:
    """Move what a read left in the shared decoder (the start of a packet, an error) into a decoder of the
    connection's own."""
    own = cast(SharedDecoder, conn.decoder).detach(OwnDecoder)
    own.counted, own.since, own.peer = 0, 0.0, ""
    conn.decoder = own
    return own


def settle_decoder(conn: Connection, completed: bool) -> bool:
    """After a read that left a packet unfinished, or with a decoder of the connection's own: a shared
    decoder's partial packet moves into one of its own; the unfinished bytes are counted; one of its own
    holding nothing once CONNECT is decoded gives way to the shared one. False once the connection is
    closed (over the budget: what it sent is not handled)."""
    decoder = conn.decoder
    own = own_decoder(conn) if decoder.shared else cast(OwnDecoder, decoder)
    if (own.counted or own.buffered) and not _count_partial(conn, own, completed):
        return False
    if not own.buffered and own.protocol_version is not None and not own.failed:
        conn.decoder = shared_like(own, own.protocol_version)
    return True


def unfinished_since(conn: Connection) -> float:
    """When the packet the connection is receiving started to arrive (0.0: none is half-read)."""
    decoder = conn.decoder
    return 0.0 if decoder.shared else cast(OwnDecoder, decoder).since


def forget_unfinished(conn: Connection) -> None:
    """The connection is gone: its unfinished bytes leave the broker-wide budget."""
    decoder = conn.decoder
    if not decoder.shared:
        _hold(conn, cast(OwnDecoder, decoder), 0)


def _hold(conn: Connection, own: OwnDecoder, buffered: int) -> None:
    """Count ``buffered`` bytes as what ``conn`` holds unfinished, in the budget and for its address."""
    change = buffered - own.counted
    if not change:
        return
    host = conn.terms.host
    host.partial_bytes += change
    peers = host.partial_peers
    if own.counted:
        peer = peers[own.peer]
    else:
        own.peer = conn.peer_host()
        peer = peers.get(own.peer)
        if peer is None:
            peer = peers[own.peer] = PeerPartial()
        peer.connections[conn] = None
    peer.bytes += change
    own.counted = buffered
    if not buffered:
        del peer.connections[conn]
        if not peer.connections:
            del peers[own.peer]


def _count_partial(conn: Connection, own: OwnDecoder, completed: bool) -> bool:
    host = conn.terms.host
    buffered = own.buffered
    _hold(conn, own, buffered)
    if not buffered:
        own.since = 0.0
        return True
    if completed or not own.since:  # a new packet started arriving
        own.since = host.now()
    budget = host.config.limits.max_partial_packet_bytes
    if host.partial_bytes <= budget:
        return True
    peers = host.partial_peers
    mine = peers[own.peer]
    heaviest = max(peers.values(), key=_bytes_of)
    if heaviest.bytes <= mine.bytes:
        _close_over_budget(conn, own, mine.bytes)
        return False
    held = heaviest.bytes
    for other in sorted(heaviest.connections, key=_counted_of, reverse=True):
        _close_over_budget(other, cast(OwnDecoder, other.decoder), held)
        if host.partial_bytes <= budget:
            break
    return True


def _bytes_of(peer: PeerPartial) -> int:
    return peer.bytes


def _counted_of(conn: Connection) -> int:
    return cast(OwnDecoder, conn.decoder).counted


def _close_over_budget(conn: Connection, own: OwnDecoder, address_bytes: int) -> None:
    """Close ``conn``, of the address holding the most unfinished bytes (``address_bytes``) when they passed
    the budget; what it held leaves the budget at once (it will never finish it). Said in the broker's
    rate-limited refusal lines: an address opening connection after connection cannot fill the log."""
    host = conn.terms.host
    host.counters.refusal_log.write(
        conn.log,
        host.now(),
        "partial_budget",
        "closed: partial_budget (packets in progress on all connections exceed max_partial_packet_bytes, and "
        "this client's address holds the most of them)",
        action="connect" if conn.terms.state != CONNECTED else "read",
        address_bytes=address_bytes,
    )
    _hold(conn, own, 0)
    if conn.terms.state == CONNECTED:
        conn.close(ReasonCode.SERVER_BUSY, "too many bytes of unfinished packets on this broker")
    else:
        host.counters.refused("partial_budget")
        conn.abort()
