"""A client connection's transport adapter: an asyncio stream transport feeding the sans-IO ``Connection``.

``StreamConnection`` is the ``asyncio.Protocol`` of a TCP or TLS socket (``transports.tcp``, on the event
loop's transport or the broker's own, ``transports.native``) and the connection of a WebSocket
(``transports.websocket``, over a ``ByteTransport`` of its own). It only moves things between the
transport and the state machine: bytes read go to ``receive``, the transport's buffer state to
``writing_paused``/``writing_resumed``, its end to ``transport_closed``; the machine's output is written
when the broker flushes the connection (once per loop turn, ``flush``), and a hold of reading or an end it
decided is carried out at once after the read that decided it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Protocol, cast

from broker_edge.engine.connection.connection import Connection
from broker_edge.engine.connection.outgoing import ABORT, Closing

if TYPE_CHECKING:
    from broker_edge.engine.connection.connection import ConnectionHost
    from broker_edge.engine.connection.reading import PacketTurn
    from broker_edge.engine.connection.terms import ListenerRuntime

__all__ = ["JOINED_UP_TO", "ByteTransport", "StreamConnection"]

JOINED_UP_TO = 64 * 1024
"""A turn's output of at most this many bytes in pieces (a QoS 1 delivery is three: its head, packet id and
payload) is joined and written as one piece: one copy of small pieces costs less than the transport's
handling of each (uvloop's ``writelines`` takes each piece's buffer on its own). A larger one is handed over
in its pieces, the payloads shared by every subscriber not copied for each."""


class ByteTransport(Protocol):
    """The part of an asyncio transport a connection uses (TCP/TLS transports and ``WebSocketTransport``)."""

    def write(self, data: bytes) -> None: ...

    def writelines(self, parts: list[bytes]) -> None: ...

    def is_closing(self) -> bool: ...

    def close(self) -> None: ...

    def abort(self) -> None: ...

    def is_reading(self) -> bool: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def get_extra_info(self, name: str, default: Any = None) -> Any: ...


class StreamConnection(Connection, asyncio.Protocol):
    """A ``Connection`` on a byte-stream transport (see the module docstring)."""

    __slots__ = ("transport",)

    def __init__(self, host: ConnectionHost, listener: ListenerRuntime) -> None:
        super().__init__(host, listener)
        self.transport: ByteTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.attach_transport(cast(ByteTransport, transport))  # the loop hands stream transports only

    def attach_transport(self, transport: ByteTransport) -> None:
        """Start on ``transport`` (from ``connection_made``, or from a WebSocket's listener)."""
        self.transport = transport
        self.opened()
        if type(self._out) is Closing:  # refused at admission
            self.flush()

    def data_received(self, data: bytes) -> None:
        self.handle_read(data)

    def handle_read(self, data: bytes, turn: PacketTurn | None = None) -> int:
        """``receive`` ``data`` (with ``turn``: at most its packets left; the bytes past them are returned,
        not handled), then carry out an end or a hold of reading the packets decided."""
        unread = self.receive(data, turn)
        if type(self._out) is Closing:
            self.flush()  # the read ended the connection: its last packets go, then it closes
        elif self._rare is not None:
            self._follow_hold()  # a hold decided in this read stops reading now
        return unread

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is None:
            return  # told already
        self.transport_closed(exc)  # its log line still names the peer
        self.transport = None

    def pause_writing(self) -> None:
        self.writing_paused()

    def resume_writing(self) -> None:
        self.writing_resumed()

    def flush(self) -> None:
        """Write the connection's output; carry out a hold of reading or an end it decided."""
        out = self._out
        transport = self.transport
        if out is not None and transport is not None:
            if type(out) is Closing:
                self._end(out, transport)
                return
            self._out = None
            if not transport.is_closing():
                if len(out) == 1:
                    data = out[0]
                    self.terms.stats.bytes_out += len(data)
                    transport.write(data)
                else:
                    size = sum(map(len, out))
                    self.terms.stats.bytes_out += size
                    if size <= JOINED_UP_TO:
                        transport.write(b"".join(out))
                    else:
                        transport.writelines(out)
        if self._rare is not None:
            self._follow_hold()

    def _end(self, out: Closing, transport: ByteTransport) -> None:
        """Close after writing the last packets, or abort, once (an abort may follow a close)."""
        if out.done >= out.how:
            return
        out.done = out.how
        if out.how == ABORT:
            out.clear()
            transport.abort()
            return
        if out and not transport.is_closing():
            self.terms.stats.bytes_out += sum(map(len, out))
            transport.writelines(list(out))
        out.clear()
        transport.close()

    def _follow_hold(self) -> None:
        """Stop reading while the connection holds it, read again once it does not."""
        transport = self.transport
        if transport is None or type(self._out) is Closing:
            return
        if self.held:
            if transport.is_reading():
                transport.pause_reading()
        elif not transport.is_reading():
            transport.resume_reading()

    def peer_address(self) -> tuple[str, int] | None:
        transport = self.transport
        address = transport.get_extra_info("peername") if transport is not None else None
        return (str(address[0]), int(address[1])) if address else None
