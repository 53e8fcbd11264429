"""Counting MQTT packets in a byte stream by their fixed headers only.

A subscriber of the benchmark receives long runs of PUBLISH frames that all have the same length (same topic
length, same payload size, same QoS). `FrameScanner` recognises such a run with strided slices of the buffer,
which run at C speed, instead of a Python step per packet: if the first byte and the remaining-length bytes
match the expected header every `frame_len` bytes, the run is a valid sequence of frames by induction (each
header says where the next one starts). Anything else (CONNACK, SUBACK, PUBACK, a redelivered PUBLISH with the
DUP flag, a frame of another length) goes through a plain one-packet-at-a-time parser.

A PUBLISH with the DUP flag is acknowledged but counted apart (`redeliveries`), not as a delivery: it may
repeat one already counted, and counting it again could hide a message that never arrived.

QoS 1 deliveries are acknowledged with PUBACK frames assembled with the same strided slices.
"""

from __future__ import annotations

from bench import frames
from broker_edge.protocol import PacketType
from broker_edge.protocol.errors import MQTTError
from broker_edge.protocol.properties import decode_properties

_PUBACK_FIRST = bytes((frames.PUBACK,)) * 65536
_PUBACK_LEN = bytes((2,)) * 65536


def parse_fixed_header(buf: bytes | bytearray, pos: int) -> tuple[int, int] | None:
    """(header length, total frame length) of the packet starting at `pos`, or None if incomplete."""
    end = len(buf)
    multiplier, remaining, i = 1, 0, pos + 1
    while True:
        if i >= end:
            return None
        digit = buf[i]
        remaining += (digit & 0x7F) * multiplier
        i += 1
        if not digit & 0x80:
            break
        multiplier *= 128
        if multiplier > 128**3:
            raise ValueError("malformed remaining length")
    header_len = i - pos
    return header_len, header_len + remaining


class FrameScanner:
    """Splits a received byte stream into MQTT packets and counts them by type.

    `expected_header` and `frame_len` describe the frames that dominate the stream (for a subscriber, its
    PUBLISH frames; for a publisher, 4-byte PUBACKs); `pid_offset`, when given, is where the packet id of
    those frames sits, and `feed` then returns the PUBACK frames to send for them.
    """

    __slots__ = (
        "_buf",
        "_header",
        "_len",
        "_pid",
        "connack_code",
        "counts",
        "publishes",
        "redeliveries",
        "server_reference",
        "suback_codes",
    )

    def __init__(self, expected_header: bytes, frame_len: int, pid_offset: int | None = None) -> None:
        self._buf = bytearray()
        self._header = expected_header
        self._len = frame_len
        self._pid = pid_offset
        self.counts = [0] * 16  # packets seen, by packet type
        self.publishes = 0  # PUBLISH packets seen without the DUP flag: each a delivery, counted once
        self.redeliveries = 0  # PUBLISH packets seen with the DUP flag: acknowledged, not deliveries
        self.connack_code: int | None = None  # return code of the CONNACK, once received
        self.suback_codes: list[int] = []  # granted QoS (or 0x80, failure) of each SUBACK received
        self.server_reference: str | None = None  # an MQTT 5 DISCONNECT's Server Reference, once received

    def feed(self, data: bytes) -> bytes:
        """Consume `data`; return the PUBACK frames owed for the QoS 1 PUBLISH frames found in it."""
        header, length = self._header, self._len
        buf = self._buf
        if not buf and len(data) == length and data.startswith(header):
            return self._one_frame(data)  # the most frequent case of a fanout subscriber: one frame per read
        if buf:
            buf += data
            view: bytes | bytearray = buf
        else:
            view = data  # parse the new bytes in place; only a trailing partial frame is copied
        acks: list[bytes] = []
        pos, end = 0, len(view)
        while pos < end:
            n = (end - pos) // length
            if n and view.startswith(header, pos):
                run = self._matching_run(view, pos, n) if n > 1 else 1
                if run:
                    if self._pid is not None:
                        acks.append(self._acks_for_run(view, pos, run))
                    if header[0] >> 4 == 3:
                        self.publishes += run
                    self.counts[header[0] >> 4] += run
                    pos += run * length
                    continue
            parsed = parse_fixed_header(view, pos)
            if parsed is None or pos + parsed[1] > end:
                break
            header_len, total = parsed
            first = view[pos]
            kind = first >> 4
            self.counts[kind] += 1
            if kind == 3:
                if first & 0x08:
                    self.redeliveries += 1
                else:
                    self.publishes += 1
                if (first >> 1) & 3:
                    topic_len = (view[pos + header_len] << 8) | view[pos + header_len + 1]
                    p = pos + header_len + 2 + topic_len
                    acks.append(bytes((frames.PUBACK, 2, view[p], view[p + 1])))
            elif kind == 2 and total >= 4:
                self.connack_code = view[pos + 3]
            elif kind == 9:
                self.suback_codes.append(view[pos + total - 1])
            elif kind == 14 and total > header_len + 1:
                self.server_reference = _server_reference(bytes(view[pos + header_len + 1 : pos + total]))
            pos += total
        if view is buf:
            del buf[:pos]
        elif pos < end:
            buf += data[pos:]
        return b"".join(acks)

    def _one_frame(self, frame: bytes) -> bytes:
        """Count one complete expected frame; its PUBACK if it carries a packet id."""
        kind = self._header[0] >> 4
        self.counts[kind] += 1
        if kind == 3:
            self.publishes += 1
        if self._pid is None:
            return b""
        return bytes((frames.PUBACK, 2)) + frame[self._pid : self._pid + 2]

    def _matching_run(self, buf: bytes | bytearray, pos: int, n: int) -> int:
        """How many frames from `pos` on (at most n) carry exactly the expected fixed header."""
        run = n
        stop = pos + n * self._len
        for i, byte in enumerate(self._header):
            column = buf[pos + i : stop : self._len]
            if column.count(byte) != len(column):
                run = min(run, len(column) - len(column.lstrip(bytes((byte,)))))
                stop = pos + run * self._len
                if not run:
                    return 0
        return run

    def _acks_for_run(self, buf: bytes | bytearray, pos: int, run: int) -> bytes:
        """PUBACK frames for `run` QoS 1 PUBLISH frames starting at `pos`, built with strided copies."""
        assert self._pid is not None  # only QoS 1 runs are acknowledged
        start = pos + self._pid
        stop = pos + run * self._len
        out = bytearray(4 * run)
        out[0::4] = _PUBACK_FIRST[:run] if run <= 65536 else bytes((frames.PUBACK,)) * run
        out[1::4] = _PUBACK_LEN[:run] if run <= 65536 else bytes((2,)) * run
        out[2::4] = buf[start : stop : self._len]
        out[3::4] = buf[start + 1 : stop : self._len]
        return bytes(out)


def _server_reference(properties: bytes) -> str | None:
    """The Server Reference among an MQTT 5 DISCONNECT's properties (after its reason code), read by the
    broker's own property decoder; None when there is none or the properties are not well formed."""
    try:
        decoded, _ = decode_properties(
            properties, memoryview(properties), 0, len(properties), PacketType.DISCONNECT
        )
    except MQTTError:
        return None
    return decoded.server_reference if decoded is not None else None
