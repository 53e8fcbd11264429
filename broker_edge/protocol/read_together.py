"""Reads whose packets are decoded together rather than one at a time (``PacketDecoder``'s): PUBLISHes that
begin alike, and a read of nothing but PUBACKs."""

import sys
from array import array

from .packets import PubAckRun, Publish, PublishesAlike

__all__ = ["pubacks_read_together", "read_alike"]


def read_alike(
    buf: bytes, pos: int, body: int, end: int, first: Publish, v5: bool, most: int
) -> tuple[int, PublishesAlike | None]:
    """The PUBLISHes right after ``first`` (decoded from ``buf[pos:end]``, its variable header at ``body``)
    that begin with the same bytes up to the end of its topic: the same fixed header (type, flags, remaining
    length) and topic, so the same size, QoS and checks already passed. Each is read from its packet id and
    payload alone, at most ``most`` of them. Returns where the first one not alike (or not whole, or with a
    packet id 0 or MQTT 5 properties: the general decoder says what it is) starts, and ``first`` with them
    as one ``PublishesAlike`` (None: none was alike).

    A client streaming on one topic sends such PUBLISHes back to back, the payloads of one size."""
    step = end - pos
    topic_end = body + 2 + ((buf[body] << 8) | buf[body + 1])
    prefix = buf[pos:topic_end]
    qos = first.qos
    id_at = topic_end - pos
    payload_at = id_at + (2 if qos else 0) + v5  # (v5: the properties' length, 0, before the payload)
    packet_ids, payloads = [first.packet_id], [first.payload]
    add_id, add_payload = packet_ids.append, payloads.append
    stop = min(len(buf), end + most * step)
    start = end
    while start + step <= stop and buf.startswith(prefix, start):
        if v5 and buf[start + payload_at - 1]:
            break
        if qos:
            packet_id = (buf[start + id_at] << 8) | buf[start + id_at + 1]
            if not packet_id:
                break
            add_id(packet_id)
        add_payload(buf[start + payload_at : start + step])
        start += step
    if start == end:
        return end, None
    if not qos:
        packet_ids += [None] * ((start - end) // step)
    frames: list[bytes] | None = None
    if first.frame is not None:
        frames = [buf[at : at + step] for at in range(pos, start, step)]
    return start, PublishesAlike(first, packet_ids, payloads, frames, prefix)


def pubacks_read_together(buf: bytes) -> PubAckRun | None:
    """``buf`` (a whole read, a multiple of 4 bytes) as a ``PubAckRun`` when it holds nothing but PUBACKs
    without a reason code (``40 02`` and a packet id each) and no packet id 0; else None, and it is decoded a
    packet at a time (which says what is wrong, if anything is). Checked and cut by slices, not a packet at
    a time: a QoS 1 subscriber sends a PUBACK per delivery."""
    count = len(buf) >> 2
    if buf[0::4] != b"\x40" * count or buf[1::4] != b"\x02" * count:
        return None
    words = array("H", buf)  # two 16-bit words a PUBACK: its fixed header, its packet id
    if _LITTLE_ENDIAN:
        words.byteswap()
    packet_ids = words[1::2]
    if 0 in packet_ids:
        return None
    return PubAckRun(packet_ids.tolist())


_LITTLE_ENDIAN = sys.byteorder == "little"
