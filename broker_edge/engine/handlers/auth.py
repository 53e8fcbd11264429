"""AUTH (MQTT 5 enhanced authentication, 3.15): not offered by this broker.

CONNECT with an Authentication Method is refused with 0x8C (see ``connect``), so no AUTH exchange can have
started and any AUTH packet is a protocol error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.protocol.errors import ProtocolError
from broker_edge.protocol.packets import Auth

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session

__all__ = ["handle_auth"]


def handle_auth(ctx: BrokerContext, conn: Client, session: Session, packet: Auth) -> None:
    conn.protocol_error(ProtocolError("AUTH without an authentication method in CONNECT"))
