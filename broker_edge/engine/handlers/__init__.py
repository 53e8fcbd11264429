"""One handler module per packet type (Mosquitto style): what happens on SUBSCRIBE is in ``subscribe.py``.

Handlers are plain functions called synchronously by ``Connection`` for every decoded packet. Before CONNACK
only ``handle_connect(ctx, conn, packet)`` runs (the decoder lets nothing else in first); once connected
every packet goes to ``dispatch_connected(ctx, conn, session, packet)``, where ``session`` is the
connection's session: a chain of exact type tests, the most frequent packets first, so that the type checker
verifies every handler against its own packet class (``Connection`` calls the PUBLISH and PUBACK handlers, one
per message and one per QoS 1 delivery, directly). ``ctx`` is the broker as a ``context.BrokerContext``;
effects (write, close, refuse, pause reading) are asked of ``conn``. Nothing here imports ``connection`` at
run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.protocol.packets import (
    Auth,
    Disconnect,
    Packet,
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
from .publish import handle_publish, handle_publish_run
from .subscribe import handle_subscribe
from .unsubscribe import handle_unsubscribe

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session


def dispatch_connected(ctx: BrokerContext, conn: Client, session: Session, packet: Packet) -> None:
    """Handle one packet of a connected client; a packet no client may send here raises ``TypeError`` (the
    decoder never lets one through: reaching it is a broker bug, which closes only this connection)."""
    if type(packet) is Publish:
        handle_publish(ctx, conn, session, packet)
    elif type(packet) is PubAck:
        handle_puback(ctx, conn, session, packet)
    elif type(packet) is PubRec:
        handle_pubrec(ctx, conn, session, packet)
    elif type(packet) is PubRel:
        handle_pubrel(ctx, conn, session, packet)
    elif type(packet) is PubComp:
        handle_pubcomp(ctx, conn, session, packet)
    elif type(packet) is PingReq:
        handle_pingreq(ctx, conn, session, packet)
    elif type(packet) is Subscribe:
        handle_subscribe(ctx, conn, session, packet)
    elif type(packet) is Unsubscribe:
        handle_unsubscribe(ctx, conn, session, packet)
    elif type(packet) is Disconnect:
        handle_disconnect(ctx, conn, session, packet)
    elif type(packet) is Auth:
        handle_auth(ctx, conn, session, packet)
    else:
        raise TypeError(f"no handler for {type(packet).__name__} from a connected client")


__all__ = ["dispatch_connected", "handle_connect", "handle_puback", "handle_publish", "handle_publish_run"]
