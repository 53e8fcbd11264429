"""A connection's decoder: shared by idle connections, its own while a packet is half-read.

Until its CONNECT is decoded a connection has a decoder of its own (``OwnDecoder``); past it, it shares one
with the idle connections of its protocol version (``SharedDecoder``), and takes one of its own again only
while a packet is half-read (the start of a packet is moved over). The bytes of unfinished packets count
into one broker-wide budget (``limits.max_partial_packet_bytes``), so many clients each sending part of a
large packet cannot hold the broker's memory: over it, the connection that sent the last bytes is closed,
and its bytes leave the budget then, not when its socket is gone (nothing it sends after is read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

from broker_edge.engine.connection.states import CONNECTED
from broker_edge.protocol.codec import PacketDecoder, SharedDecoder, shared_decoder
from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    import logging

    from broker_edge.engine.connection.terms import Terms

__all__ = ["OwnDecoder", "forget_unfinished", "own_decoder", "settle_decoder", "unfinished_since"]


class Connection(Protocol):
    """What of a connection its decoder's bookkeeping uses (``connection.Connection`` is one)."""

    decoder: PacketDecoder
    terms: Terms[Any]

    def log(self) -> logging.LoggerAdapter[logging.Logger]: ...

    def close(self, reason_code: int | None = None, reason_string: str | None = None) -> None: ...

    def abort(self) -> None: ...


class OwnDecoder(PacketDecoder):
    """A decoder of one connection's own (until CONNECT, and while a packet is half-read), with the bytes
    of that packet counted into the host's ``partial_bytes`` and when it started arriving (host time; 0:
    none)."""

    __slots__ = ("counted", "since")

    def __init__(self, max_packet_size: int, max_connect_size: int) -> None:
        super().__init__(max_packet_size, max_connect_size=max_connect_size)
        self.counted = 0
        self.since = 0.0


def own_decoder(conn: Connection) -> OwnDecoder:
    """Move what a read left in the shared decoder (the start of a packet, an error) into a decoder of the
    connection's own."""
    own = cast(SharedDecoder, conn.decoder).detach(OwnDecoder)
    own.counted, own.since = 0, 0.0
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
        conn.decoder = shared_decoder(own.max_packet_size, own.protocol_version)
    return True


def unfinished_since(conn: Connection) -> float:
    """When the packet the connection is receiving started to arrive (0.0: none is half-read)."""
    decoder = conn.decoder
    return 0.0 if decoder.shared else cast(OwnDecoder, decoder).since


def forget_unfinished(conn: Connection) -> None:
    """The connection is gone: its unfinished bytes leave the broker-wide budget."""
    decoder = conn.decoder
    if not decoder.shared:
        own = cast(OwnDecoder, decoder)
        conn.terms.host.partial_bytes -= own.counted
        own.counted = 0


def _count_partial(conn: Connection, own: OwnDecoder, completed: bool) -> bool:
    host = conn.terms.host
    buffered = own.buffered
    host.partial_bytes += buffered - own.counted
    own.counted = buffered
    if not buffered:
        own.since = 0.0
        return True
    if completed or not own.since:  # a new packet started arriving
        own.since = host.now()
    if host.partial_bytes <= host.config.limits.max_partial_packet_bytes:
        return True
    conn.log().warning("closed: packets in progress on all connections exceed max_partial_packet_bytes")
    host.partial_bytes -= own.counted  # it will never finish them: the budget is free for others at once
    own.counted = 0
    if conn.terms.state == CONNECTED:
        conn.close(ReasonCode.SERVER_BUSY, "too many bytes of unfinished packets on this broker")
    else:
        host.counters.refused("partial_budget")
        conn.abort()
    return False
