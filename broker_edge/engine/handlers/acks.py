"""PUBACK, PUBREC, PUBREL, PUBCOMP: the QoS 1 and QoS 2 acknowledgement flows (MQTT 4.3).

Outgoing (broker → client): PUBACK and PUBCOMP free an in-flight slot, which lets the session send the next
queued message; PUBREC moves a QoS 2 message to the released state and is answered with PUBREL.
Incoming (client → broker): PUBREL releases an id held since the PUBLISH and is answered with PUBCOMP.
An unknown packet id is answered with 0x92 (v5) rather than treated as an error, since it is what a
client sees after the broker restarted or a session expired.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.protocol.packets import PubAck, PubComp, PubRec, PubRel
from broker_edge.protocol.reason_codes import ReasonCode

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session

__all__ = ["handle_puback", "handle_pubcomp", "handle_pubrec", "handle_pubrel"]

_NOT_FOUND = ReasonCode.PACKET_IDENTIFIER_NOT_FOUND


def handle_puback(ctx: BrokerContext, conn: Client, session: Session, packet: PubAck) -> None:
    session.on_puback(packet.packet_id)


def handle_pubrec(ctx: BrokerContext, conn: Client, session: Session, packet: PubRec) -> None:
    failed = packet.reason_code >= 0x80
    if session.on_pubrec(packet.packet_id, failed):
        conn.send_pubrel(packet.packet_id)
    elif not failed and packet.packet_id not in (session.inflight or ()):
        conn.send_pubrel(packet.packet_id, _NOT_FOUND if conn.terms.v5 else 0)


def handle_pubrel(ctx: BrokerContext, conn: Client, session: Session, packet: PubRel) -> None:
    if session.release_incoming(packet.packet_id):
        inbound = conn.inbound
        if conn.terms.v5 and inbound is not None:  # an older client's count ended with its PUBREC
            inbound.uncount_qos2(packet.packet_id)
        conn.send_pubcomp(packet.packet_id)
        if inbound is not None and inbound.move_due is not None and not session.incoming_qos2:
            ctx.publish_path.move_after_qos2(conn, inbound)  # a cluster member's: to its topic's leader
    else:
        conn.send_pubcomp(packet.packet_id, _NOT_FOUND)


def handle_pubcomp(ctx: BrokerContext, conn: Client, session: Session, packet: PubComp) -> None:
    session.on_pubcomp(packet.packet_id)
