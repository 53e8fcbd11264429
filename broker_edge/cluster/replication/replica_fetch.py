"""Replica fetch: how a follower pulls its leader's logs, over the offsets API (`POST /v1/replica/fetch`).

One request covers every partition a leader leads for one follower (or observer). Binary, little endian::

    request  = u8 version | str replica | u64 session | u8 flags (1: observer) | u32 wait_ms
               | u32 max_bytes | u32 max_topic_bytes | u32 partitions | partition*
    partition = u32 partition | i64 epoch | u32 topics | (str topic | u64 offset | i64 last_fetched_epoch)*
    response = u8 version | u64 session | u8 error | u32 partitions | (u32 partition | u8 error
               | i64 leader_epoch | u32 topics | topic_data*)*
    topic_data = str topic | u8 kind | u64 high_watermark | u64 start_offset
               | kind FRAMES: u32 boundaries | (i64 epoch | u64 start)* | u64 first | u32 count | u32 length
                             | frames (`count` whole frames, offsets from `first`)
               | kind DIVERGING: i64 epoch | u64 end_offset       (truncate to end_offset, then go on)
               | kind RESTART: u32 boundaries | (i64 epoch | u64 start)*
                             (empty the log, go on at start_offset, under the epoch given)
               | kind GAP: as FRAMES; the leader's log holds no records from the position asked to `first`
                           (a mirror's gap, docs/uplink.md): the replica's log goes on at `first`
    str = u16 length | UTF-8

Fetch sessions keep the requests small: a request with session 0 opens one and lists every topic the
follower holds in those partitions; the leader answers with the session id, and later requests list only
the topics whose position moved (the follower appended or truncated). The leader keeps each session's
positions and the set of topics it has something new for (records, a higher watermark), so a fetch costs
in proportion to the topics that changed, not to every topic of the partitions. A leader that lost the
session answers `UNKNOWN_SESSION` and the follower opens a new one.

A leader that also serves its sessions by pushing them over the peer link (`replica_push`) says so in
every answer with the header `X-Timestone-Replica-Push: 1`; a follower moves a session onto the link only
then (a leader of an earlier version would not understand its acknowledgements).

An observer's session (an observer holds no copy: it routes committed records to its subscribers) starts
every topic it does not list at the leader's committed end, and the first answer lists each of those
topics with that position (no frames), so the observer knows where its routing of every topic of the
partition starts; a topic it does not know after that was created since. Leaders that do so say it with
the header `X-Timestone-Observer-Topics: 1`.

A topic's `offset` tells the leader the follower holds every record below it durably. `frames` are the
records exactly as stored from `offset` on. Errors per partition: `NOT_LEADER`, `STALE_EPOCH` (the
follower's view is behind: it re-reads it), `NEWER_EPOCH` (the leader's view is behind: it stops leading
the partition until it catches up), `NOT_REPLICA`.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker_edge.bounds import MAX_OFFSET

if TYPE_CHECKING:
    from aiohttp import web

__all__ = [
    "CONTENT_TYPE",
    "DIVERGING",
    "FRAMES",
    "GAP",
    "LISTS_TOPICS_HEADER",
    "NEWER_EPOCH",
    "NOT_LEADER",
    "NOT_REPLICA",
    "OK",
    "PATH",
    "PUSH_HEADER",
    "RESTART",
    "STALE_EPOCH",
    "UNKNOWN_SESSION",
    "FetchRequest",
    "FetchResponse",
    "PartitionData",
    "PartitionFetch",
    "TopicData",
    "TopicPosition",
    "WireError",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
    "replica_fetch_route",
]

log = logging.getLogger(__name__)

PATH = "/v1/replica/fetch"
MAX_REQUEST_BYTES = 64 << 20
"""A first fetch lists every topic the follower holds in the leader's partitions."""
MAX_FETCH_BYTES = 64 << 20
"""Most frame bytes one fetch may ask for (a follower asks 4 MiB)."""
CONTENT_TYPE = "application/x-timestone-replica-fetch"
PUSH_HEADER = "X-Timestone-Replica-Push"
"""Present (``1``) in the answers of a leader that pushes sessions over the peer link."""
LISTS_TOPICS_HEADER = "X-Timestone-Observer-Topics"
"""Present (``1``) in the answers of a leader whose first answer to an observer's session lists every topic
of its partitions with the position it starts the observer at (a topic an observer does not know after
that is new to it)."""
VERSION = 1

OK = 0
NOT_LEADER = 1
STALE_EPOCH = 2
NEWER_EPOCH = 3
NOT_REPLICA = 4
UNKNOWN_SESSION = 5
ERROR_NAMES = {
    OK: "ok",
    NOT_LEADER: "not_leader",
    STALE_EPOCH: "stale_epoch",
    NEWER_EPOCH: "newer_epoch",
    NOT_REPLICA: "not_replica",
    UNKNOWN_SESSION: "unknown_session",
}

FRAMES = 0
DIVERGING = 1
RESTART = 2
GAP = 3

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_REQUEST_HEAD = struct.Struct("<QBIII")
_PARTITION_HEAD = struct.Struct("<IqI")
_POSITION = struct.Struct("<Qq")
_RESPONSE_HEAD = struct.Struct("<BQBI")
_RESPONSE_PARTITION = struct.Struct("<IBqI")
_TOPIC_HEAD = struct.Struct("<BQQ")
_BOUNDARY = struct.Struct("<qQ")
_DIVERGENCE = struct.Struct("<qQ")
_FRAMES_HEAD = struct.Struct("<QII")


class WireError(ValueError):
    """A request or response that does not follow the format (the message names the field)."""


@dataclass(slots=True)
class TopicPosition:
    topic: str
    offset: int
    """Next offset wanted: the replica holds every record below it durably."""
    last_fetched_epoch: int
    """Epoch of the record at `offset - 1` (-1 for none)."""


@dataclass(slots=True)
class PartitionFetch:
    partition: int
    epoch: int
    """The leader epoch the follower believes in."""
    topics: list[TopicPosition] = field(default_factory=list)


@dataclass(slots=True)
class FetchRequest:
    replica: str
    session: int
    """0 opens a new fetch session (then `topics` lists every topic the replica holds)."""
    observer: bool
    wait_ms: int
    max_bytes: int
    max_topic_bytes: int
    partitions: list[PartitionFetch] = field(default_factory=list)


@dataclass(slots=True)
class TopicData:
    topic: str
    kind: int
    high_watermark: int
    start_offset: int
    boundaries: list[tuple[int, int]] = field(default_factory=list)
    """(epoch, start_offset) of the records in `frames` (FRAMES), or of the record at `start_offset`
    (RESTART)."""
    first: int = 0
    """Offset of the first frame (FRAMES)."""
    count: int = 0
    frames: list[bytes] = field(default_factory=list)
    """Buffers of whole frames, back to back (FRAMES)."""
    diverging_epoch: int = -1
    diverging_end: int = 0


@dataclass(slots=True)
class PartitionData:
    partition: int
    error: int
    leader_epoch: int
    topics: list[TopicData] = field(default_factory=list)


@dataclass(slots=True)
class FetchResponse:
    session: int
    error: int = OK
    partitions: list[PartitionData] = field(default_factory=list)


# -- encoding -------------------------------------------------------------------------------------------


def _str(value: str) -> bytes:
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise WireError(f"string of {len(raw)} bytes does not fit (max 65535)")
    return _U16.pack(len(raw)) + raw


def encode_request(request: FetchRequest) -> bytes:
    parts = [
        _U8.pack(VERSION),
        _str(request.replica),
        _REQUEST_HEAD.pack(
            request.session,
            1 if request.observer else 0,
            request.wait_ms,
            request.max_bytes,
            request.max_topic_bytes,
        ),
        _U32.pack(len(request.partitions)),
    ]
    for partition in request.partitions:
        parts.append(_PARTITION_HEAD.pack(partition.partition, partition.epoch, len(partition.topics)))
        for position in partition.topics:
            parts.append(_str(position.topic))
            parts.append(_POSITION.pack(position.offset, position.last_fetched_epoch))
    return b"".join(parts)


def encode_response(response: FetchResponse) -> list[bytes]:
    """The response as buffers to send in order (frames are not copied)."""
    parts = [_RESPONSE_HEAD.pack(VERSION, response.session, response.error, len(response.partitions))]
    for partition in response.partitions:
        parts.append(
            _RESPONSE_PARTITION.pack(
                partition.partition, partition.error, partition.leader_epoch, len(partition.topics)
            )
        )
        for topic in partition.topics:
            parts.append(_str(topic.topic))
            parts.append(_TOPIC_HEAD.pack(topic.kind, topic.high_watermark, topic.start_offset))
            if topic.kind != DIVERGING:
                parts.append(_U32.pack(len(topic.boundaries)))
                parts += [_BOUNDARY.pack(epoch, start) for epoch, start in topic.boundaries]
            if topic.kind in (FRAMES, GAP):
                parts.append(_FRAMES_HEAD.pack(topic.first, topic.count, sum(map(len, topic.frames))))
                parts += topic.frames
            elif topic.kind == DIVERGING:
                parts.append(_DIVERGENCE.pack(topic.diverging_epoch, topic.diverging_end))
    return parts


# -- decoding -------------------------------------------------------------------------------------------


class _Reader:
    __slots__ = ("data", "pos", "what")

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def take(self, layout: struct.Struct, name: str) -> tuple:
        try:
            values = layout.unpack_from(self.data, self.pos)
        except struct.error:
            raise WireError(f"{self.what} ends inside {name} at byte {self.pos}") from None
        self.pos += layout.size
        return values

    def string(self, name: str) -> str:
        (length,) = self.take(_U16, name)
        end = self.pos + length
        if end > len(self.data):
            raise WireError(f"{self.what} ends inside {name} at byte {self.pos}")
        try:
            value = self.data[self.pos : end].decode()
        except UnicodeDecodeError:
            raise WireError(f"{self.what}: {name} is not UTF-8") from None
        self.pos = end
        return value

    def raw(self, length: int, name: str) -> bytes:
        end = self.pos + length
        if end > len(self.data):
            raise WireError(f"{self.what} ends inside {name} at byte {self.pos}")
        value = self.data[self.pos : end]
        self.pos = end
        return value

    def offset(self, value: int, name: str) -> None:
        """``WireError`` unless ``value`` is an offset a log can hold (``broker_edge.bounds``)."""
        if value > MAX_OFFSET:
            raise WireError(f"{self.what}: {name} {value} is past what a log holds ({MAX_OFFSET})")

    def version(self) -> None:
        (version,) = self.take(_U8, "version")
        if version != VERSION:
            raise WireError(f"{self.what}: version {version} is not supported (expected {VERSION})")

    def finish(self) -> None:
        if self.pos != len(self.data):
            raise WireError(f"{self.what}: {len(self.data) - self.pos} bytes after its end")


def decode_request(data: bytes) -> FetchRequest:
    reader = _Reader(data, "replica fetch request")
    reader.version()
    replica = reader.string("replica")
    if not replica:
        raise WireError("replica fetch request: replica must not be empty")
    session, flags, wait_ms, max_bytes, max_topic_bytes = reader.take(_REQUEST_HEAD, "header")
    if not 1 <= max_bytes <= MAX_FETCH_BYTES or not 1 <= max_topic_bytes <= MAX_FETCH_BYTES:
        raise WireError(
            f"replica fetch request: max_bytes and max_topic_bytes must be within [1, {MAX_FETCH_BYTES}]"
        )
    request = FetchRequest(replica, session, bool(flags & 1), wait_ms, max_bytes, max_topic_bytes)
    (count,) = reader.take(_U32, "partitions")
    for _ in range(count):
        number, epoch, topics = reader.take(_PARTITION_HEAD, "partition")
        partition = PartitionFetch(number, epoch)
        for _ in range(topics):
            topic = reader.string("topic")
            offset, last_epoch = reader.take(_POSITION, "position")
            reader.offset(offset, f"{topic!r} offset")
            partition.topics.append(TopicPosition(topic, offset, last_epoch))
        request.partitions.append(partition)
    reader.finish()
    return request


def decode_response(data: bytes) -> FetchResponse:
    reader = _Reader(data, "replica fetch response")
    version, session, error, count = reader.take(_RESPONSE_HEAD, "header")
    if version != VERSION:
        raise WireError(f"replica fetch response: version {version} is not supported")
    response = FetchResponse(session, error)
    for _ in range(count):
        number, partition_error, epoch, topics = reader.take(_RESPONSE_PARTITION, "partition")
        partition = PartitionData(number, partition_error, epoch)
        for _ in range(topics):
            name = reader.string("topic")
            kind, high_watermark, start = reader.take(_TOPIC_HEAD, "topic")
            reader.offset(high_watermark, f"{name!r} high watermark")
            reader.offset(start, f"{name!r} start offset")
            topic = TopicData(name, kind, high_watermark, start)
            if kind in (FRAMES, RESTART, GAP):
                (boundaries,) = reader.take(_U32, "boundaries")
                topic.boundaries = [reader.take(_BOUNDARY, "boundary") for _ in range(boundaries)]
                for _epoch, boundary in topic.boundaries:
                    reader.offset(boundary, f"{name!r} epoch boundary")
            if kind in (FRAMES, GAP):
                topic.first, topic.count, length = reader.take(_FRAMES_HEAD, "frames")
                reader.offset(topic.first + topic.count, f"{name!r} end of frames")
                topic.frames = [reader.raw(length, "frames")] if length else []
            elif kind == DIVERGING:
                topic.diverging_epoch, topic.diverging_end = reader.take(_DIVERGENCE, "divergence")
                reader.offset(topic.diverging_end, f"{name!r} divergence")
            elif kind != RESTART:
                raise WireError(f"replica fetch response: unknown kind {kind} for {name!r}")
            partition.topics.append(topic)
        response.partitions.append(partition)
    reader.finish()
    return response


# -- the endpoint ---------------------------------------------------------------------------------------

FetchServer = Callable[[FetchRequest], Awaitable[FetchResponse]]
"""What serves a decoded request (`LeaderReplication.fetch`)."""


def replica_fetch_route(
    serve: FetchServer, request_timeout_s: float | None = None, pushes: bool = False
) -> Callable[[web.Application], None]:
    """A function adding `POST /v1/replica/fetch` to the members' endpoint (`member_api`): a request is
    served only for the member it comes from (its `replica` is the node its certificate names), within
    the HTTP memory budget (its body, then the frames it may be answered with), its body read within
    `request_timeout_s` (None: the endpoint's, `cluster.listen.request_timeout_s`). `pushes`: the leader
    also pushes sessions over the peer link (its answers say so)."""
    headers = {"Content-Type": CONTENT_TYPE, LISTS_TOPICS_HEADER: "1"}
    if pushes:
        headers[PUSH_HEADER] = "1"

    def add(app: web.Application) -> None:
        from aiohttp import web

        from broker_edge.http.guard import hold, read_body, settle
        from broker_edge.offsets_api import errors as codes
        from broker_edge.offsets_api.server import ApiError, access_of

        async def handle(request: web.Request) -> web.StreamResponse:
            member = access_of(request).member
            if member is None:
                raise ApiError(403, "not_a_member", "replica fetches are for members only", close=True)
            length = request.content_length
            if length is None or length > MAX_REQUEST_BYTES:
                raise ApiError(
                    413,
                    codes.BAD_REQUEST,
                    f"the body must have a length of at most {MAX_REQUEST_BYTES} bytes",
                )
            hold(request, length)
            # exactly its length: a first fetch lists every topic, beyond aiohttp's 1 MiB default
            body = await read_body(request, request_timeout_s, length)
            try:
                fetch = decode_request(body)
            except WireError as error:
                raise ApiError(400, codes.BAD_REQUEST, str(error), parameter="body") from None
            if fetch.replica != member:
                raise ApiError(
                    403,
                    "not_a_member",
                    f"{member} fetches as {fetch.replica}: a member acts only as itself",
                    close=True,
                )
            del body
            settle(request, 0)
            hold(request, fetch.max_bytes)  # the frames its answer may carry
            body = b"".join(encode_response(await serve(fetch)))
            return web.Response(body=body, headers=headers)

        app.router.add_post(PATH, handle)

    return add
