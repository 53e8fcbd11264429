"""DISCONNECT from a client (MQTT 3.14): only a normal one (reason code 0x00) discards the will.

A v5 DISCONNECT with any other code keeps it: 0x04 asks for it, and an error code (0x80 and above) says the
client did not leave normally, so its will is published as after a dropped connection [MQTT-3.1.2-8].

A v5 DISCONNECT may change the Session Expiry Interval, except from 0 to non-zero (a protocol error, 0x82)
when 0 is what the CONNECT asked for: one the broker lowered to 0 (``sessions.max_session_expiry_s: 0``) may
be said again, and stays 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.protocol.packets import Disconnect
from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session

__all__ = ["handle_disconnect"]


def handle_disconnect(ctx: BrokerContext, conn: Client, session: Session, packet: Disconnect) -> None:
    props = packet.properties
    if props is not None and props.session_expiry_interval is not None:
        if session.expiry_interval == 0 and props.session_expiry_interval != 0 and not conn.expiry_lowered:
            conn.close(
                ReasonCode.PROTOCOL_ERROR, "session expiry cannot be set on DISCONNECT when CONNECT had 0"
            )
            return
        session.expiry_interval = min(props.session_expiry_interval, ctx.config.sessions.max_session_expiry_s)
    if packet.reason_code == ReasonCode.NORMAL_DISCONNECTION:
        conn.will = None
    conn.close()
