"""PINGREQ → PINGRESP (MQTT 3.12); any packet already counts as activity for the keepalive."""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.protocol.packets import PingReq

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session

__all__ = ["handle_pingreq"]

_PINGRESP = b"\xd0\x00"


def handle_pingreq(ctx: BrokerContext, conn: Client, session: Session, packet: PingReq) -> None:
    conn.write(_PINGRESP)
