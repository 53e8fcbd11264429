"""One handler module per packet type (Mosquitto style): what happens on SUBSCRIBE is in ``subscribe.py``.

Each handler is a plain function ``handle_x(conn, packet)`` called synchronously by ``Connection`` for every
decoded packet; ``HANDLERS`` maps packet classes to them.
"""

from broker_edge.protocol.packets import (
    Auth,
    Connect,
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

HANDLERS = {
    Connect: handle_connect,
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
"""Packet class → handler."""

__all__ = ["HANDLERS"]
