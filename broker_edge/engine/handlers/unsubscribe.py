"""UNSUBSCRIBE: remove each filter from the session and the trie, UNSUBACK with a code per filter (MQTT 3.10).

A filter is matched exactly as it was subscribed (``$share/<group>/...`` included; the v3 replay form
``$offset/<start>/<filter>`` names the plain filter). v5 answers 0x11 for a filter that was not subscribed,
0x8F for one SUBSCRIBE refuses as invalid.
The session's log cursors no remaining subscription matches are dropped a slice per loop turn
(``ReplayManager.forget_filter``); when that takes more than this turn, the UNSUBACK waits for it and
reading from the client pauses meanwhile, so its next packets find them gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from broker_edge.engine.connection.states import CLOSED, HELD_FOR_SUBACK
from broker_edge.protocol.codec import encode
from broker_edge.protocol.errors import InvalidTopic
from broker_edge.protocol.packets import UnsubAck, Unsubscribe
from broker_edge.protocol.reason_codes import ReasonCode
from broker_edge.protocol.topics import parse_offset_filter, parse_shared, validate_topic_filter

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
            _, inner = parse_shared(key)
            validate_topic_filter(inner)
        except InvalidTopic:  # one no SUBSCRIBE could have made: said so, not "no subscription existed"
            codes.append(ReasonCode.TOPIC_FILTER_INVALID)
            continue
        removed = router.unsubscribe(session, key)
        codes.append(ReasonCode.SUCCESS if removed else ReasonCode.NO_SUBSCRIPTION_EXISTED)
    unsuback = UnsubAck(packet.packet_id, codes if conn.terms.v5 else [])

    def forgotten() -> None:
        if conn.state != CLOSED:
            _answer(ctx, conn, session, unsuback)
            conn.release(HELD_FOR_SUBACK)

    replays = ctx.replays
    if replays is not None and replays.when_forgotten(session, forgotten):
        conn.hold(HELD_FOR_SUBACK)  # the cursors of the filters are being dropped
        return
    _answer(ctx, conn, session, unsuback)


def _answer(ctx: BrokerContext, conn: Client, session: Session, unsuback: UnsubAck) -> None:
    """Send the UNSUBACK, unless it is larger than the client's Maximum Packet Size (a v5 one of many
    filters): then it is not sent, the filters stay removed [MQTT-3.1.2-24] [MQTT-3.1.2-25]."""
    most = conn.terms.max_packet_out  # an UNSUBACK is at most 8 bytes and its reason codes
    size = len(encode(unsuback, conn.version)) if 8 + len(unsuback.reason_codes) > most else 0
    if size <= most:
        conn.send_packet(unsuback)
        return
    reason = "unsuback_too_large"
    ctx.counters.drop(reason)
    why = f"unsubscribe not answered: its UNSUBACK of {size} bytes exceeds the client's Maximum Packet Size"
    username = session.username or ""
    ctx.counters.refusal_log.write(
        conn.log(), ctx.now(), reason, why, action="unsubscribe", username=username
    )
