"""One handler module per packet type (Mosquitto style): what happens on SUBSCRIBE is in ``subscribe.py``.

Handlers are plain functions called synchronously by ``Connection`` for every decoded packet. Before CONNACK
only ``handle_connect(ctx, conn, packet)`` runs (the decoder lets nothing else in first); once connected
every packet goes to ``CONNECTED_HANDLERS[type(packet)](ctx, conn, session, packet)``, where ``session`` is
the connection's session. ``ctx`` is the broker as a ``context.BrokerContext``; effects (write, close,
refuse, pause reading) are asked of ``conn``. Nothing here imports ``connection`` at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker_edge.protocol.packets import (
    Auth,
    Disconnect,
    PingReq,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    Subscribe,
    Unsubscribe,
)

from .acks import handle_puback, handle_pubcomp, handle_pubrec, handle_pubrel
from .auth import handle_auth
from .connect import handle_connect
from .disconnect import handle_disconnect
from .ping import handle_pingreq
from .publish import handle_publish
from .subscribe import handle_subscribe
from .unsubscribe import handle_unsubscribe

if TYPE_CHECKING:
    from broker_edge.connection import Connection
    from broker_edge.context import BrokerContext
    from broker_edge.session import Session

ConnectedHandler = Callable[["BrokerContext", "Connection", "Session", Any], None]
"""A connected handler; its packet parameter is its own packet class (the table is keyed by it)."""

CONNECTED_HANDLERS: dict[type, ConnectedHandler] = {
    Publish: handle_publish,
    PubAck: handle_puback,
    PubRec: handle_pubrec,
    PubRel: handle_pubrel,
    PubComp: handle_pubcomp,
    Subscribe: handle_subscribe,
    Unsubscribe: handle_unsubscribe,
    PingReq: handle_pingreq,
    Disconnect: handle_disconnect,
    Auth: handle_auth,
}
"""Packet class → handler, for a connected client."""

__all__ = ["CONNECTED_HANDLERS", "ConnectedHandler", "handle_connect"]
