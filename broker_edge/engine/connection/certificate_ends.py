"""Connections closed when their client certificate ends: one heap per listener, by when each chain ends.

A listener that verifies client certificates (``tls.cafile``) reads each connection's chain at connect
(``watch_chain``: ``security.peer_chain``): when it ends, kept here, and which CAs it needs, which the
connection keeps (``peer_trust``, checked again after a reload). One timer per listener waits for the
earliest end (at most ``MAX_WAIT_S`` at a time: the wall clock may be set meanwhile), so 100,000
connections cost nothing until one ends. A connection whose chain has
ended is closed as its certificate would be refused at a handshake: v5 DISCONNECT 0x87 (Not authorized,
"client certificate expired"), an MQTT 3.1.1 client's connection closed, counted as
``certificate_expired``, one WARNING each. Its will is published: the certificate's holder is gone, not an
impostor (a revoked certificate's will is dropped).

A connection that closes is forgotten (``forget``); the heap keeps its entry until it comes to the top or the
heap is rebuilt, at twice the connections watched.
"""

from __future__ import annotations

import datetime
import heapq
import logging
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Protocol

from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.security.peer_chain import PeerChain, peer_chain

if TYPE_CHECKING:
    import ssl

__all__ = ["CertificateEnds", "Ending"]


class Ending(Protocol):
    """A connection as this module closes it (``engine.connection.connection.Connection``)."""

    @property
    def peer_cn(self) -> str | None: ...

    def log(self) -> logging.LoggerAdapter[logging.Logger]: ...

    def close(
        self, reason_code: int | None = None, reason_string: str | None = None, counted_as: str = ""
    ) -> None: ...

    def flush(self) -> None: ...


_SLACK = 1024
"""Stale entries the heap may hold beyond the connections watched before it is rebuilt."""

MAX_WAIT_S = 60.0
"""The longest the timer waits before it reads the wall clock again (ends are wall-clock times)."""

CallLater = Callable[[float, Callable[[], None]], None]
"""The loop's ``call_later`` as the broker gives it (``ConnectionHost.call_later``)."""


class CertificateEnds:
    """The connections of one listener by when their client certificate chain ends."""

    __slots__ = ("_due", "_heap", "_watched")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._watched: dict[int, tuple[Ending, float, str]] = {}
        """``id(connection)`` → the connection, when its chain ends, and whose end that is."""
        self._due = 0.0
        """The end the timer waits for (0: none); a timer for another end has been superseded."""

    def __len__(self) -> int:
        return len(self._watched)

    def watch(self, conn: Ending, end: float, ending: str, call_later: CallLater) -> None:
        """Close ``conn`` once ``end`` (Unix time) has passed; ``ending``: the CA whose end it is ("": the
        client's certificate)."""
        self._watched[id(conn)] = (conn, end, ending)
        heapq.heappush(self._heap, (end, id(conn)))
        if not self._due or end < self._due:
            self._wait_for(end, call_later)

    def watch_chain(
        self, conn: Ending, ssl_object: ssl.SSLObject | ssl.SSLSocket | None, call_later: CallLater
    ) -> PeerChain | None:
        """At connect: ``conn``'s client certificate chain watched until it ends; what it rests on (the CAs
        it needs trusted, the CAs it holds; None: the client sent no certificate)."""
        chain = peer_chain(ssl_object)
        if chain is None:
            return None
        self.watch(conn, chain.end, chain.ending, call_later)
        return chain

    def _wait_for(self, end: float, call_later: CallLater) -> None:
        self._due = end
        delay = min(max(end - time.time(), 0.0), MAX_WAIT_S)
        call_later(delay, partial(self._woken, end, call_later))

    def _woken(self, due: float, call_later: CallLater) -> None:
        if due != self._due:
            return  # superseded by an earlier end
        self._due = 0.0
        self.close_ended(time.time())
        if self._heap:
            self._wait_for(self._heap[0][0], call_later)

    def forget(self, conn: Ending) -> None:
        """``conn`` closed: nothing to end."""
        self._watched.pop(id(conn), None)

    def close_ended(self, now: float) -> int:
        """Close the connections whose chain ended at ``now`` (Unix time) or before; how many were."""
        heap, watched = self._heap, self._watched
        closed = 0
        while heap and heap[0][0] <= now:
            end, key = heapq.heappop(heap)
            entry = watched.get(key)
            if entry is None or entry[1] != end:
                continue  # closed already (its id may be another connection's now)
            del watched[key]
            _close_ended(*entry)
            closed += 1
        if len(heap) > 2 * len(watched) + _SLACK:
            self._heap = [(end, key) for key, (_, end, _) in watched.items()]
            heapq.heapify(self._heap)
        return closed


def _close_ended(conn: Ending, end: float, ending: str) -> None:
    when = f"{datetime.datetime.fromtimestamp(end, datetime.UTC):%Y-%m-%d %H:%M:%S} UTC"
    whose = f"the certificate of its CA ({ending})" if ending else "its client certificate"
    conn.log().warning("closing the connection: %s expired at %s (CN=%s)", whose, when, conn.peer_cn)
    conn.close(ReasonCode.NOT_AUTHORIZED, "client certificate expired", counted_as="certificate_expired")
    conn.flush()
