"""UNSUBSCRIBE: remove each filter from the session and the trie, UNSUBACK with a code per filter (MQTT 3.10).

A filter is matched exactly as it was subscribed (``$share/<group>/...`` included; the v3 replay form
``$offset/<start>/<filter>`` names the plain filter). v5 answers 0x11 for a filter that was not subscribed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.packets import UnsubAck, Unsubscribe
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.protocol.topics import parse_offset_filter

if TYPE_CHECKING:
    from broker_edge.engine.handlers.context import BrokerContext, Client
    from broker_edge.engine.sessions.session import Session

__all__ = ["handle_unsubscribe"]


def handle_unsubscribe(ctx: BrokerContext, conn: Client, session: Session, packet: Unsubscribe) -> None:
    router = ctx.router
    codes: list[int] = []
    for topic_filter in packet.topic_filters:
        try:
            _, key = parse_offset_filter(topic_filter)
        except InvalidTopic:
            codes.append(ReasonCode.TOPIC_FILTER_INVALID)
            continue
        removed = router.unsubscribe(session, key)
        codes.append(ReasonCode.SUCCESS if removed else ReasonCode.NO_SUBSCRIPTION_EXISTED)
    conn.send_packet(UnsubAck(packet.packet_id, codes if conn.terms.v5 else []))
