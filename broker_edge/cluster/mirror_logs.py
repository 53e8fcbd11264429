"""The ``mirror_logs`` port of a cluster member: another broker's frames (a site's, on a hub) appended on the
leader of their log's partition, verbatim at the sender's offsets, and acknowledged once the in-sync
replicas hold them.

Any member takes a site's uplink. Each topic of a batch goes to the leader of its partition: appended here
when this member leads it, else handed to the leader over the members' endpoint (``POST /v1/mirror/append``,
one request per leader and batch: the frames as they are, with each topic's first offset and count,
``encode_parts``). Forwarding MQTT publishes is no use here: the leader would give them offsets of its own.
The leader applies ``append_mirrored`` (what it holds is skipped, frames past its end leave a gap), waits
until they are durable, then until its ``Replication`` stage says every in-sync replica holds each log up to
its end (acks=all with ``min_insync_replicas``), and answers with the logs' committed ends. A member that
does not lead a partition answers 409, and the sender asks the leader it learns of next; while there is
none (an election) it waits, up to ``timeout_s``, then refuses (``MirrorRefused``): the hub tells the
site, which sends again from the ends it is given next.

``ends`` is the committed end of each of the logs under a prefix, as its partition's leader has it: every
member lists the logs it holds (``GET /v1/mirror/ends``), with their committed ends for the partitions it
leads. A site resuming on another member after a failover so starts where the cluster is durable; a
leader's tail that was not replicated, and that its successor truncated, is sent again at the same offsets.

The hub's downlink reads the logs this member holds a copy of from its store, and the others (fewer
replicas than members) through ``LogsElsewhere``: from their partitions' leaders, verbatim, at their offsets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import aiohttp

from broker_edge import bounds
from broker_edge.engine.ports import AppendedRun, MirrorPart, MirrorRefused
from broker_edge.storage import InvalidRecord, StorageError
from broker_edge.storage.mirrored import MirrorAppend, append_mirrored

if TYPE_CHECKING:
    from aiohttp import web

    from broker_edge.cluster.links.member_clients import MemberClients
    from broker_edge.cluster.reads.logs_elsewhere import LogsElsewhere
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.ports import Replication
    from broker_edge.storage import LogStore
    from broker_edge.storage.record import Record

__all__ = ["APPEND_PATH", "ENDS_PATH", "ClusterMirrorLogs"]

log = logging.getLogger("broker_edge.cluster.mirror_logs")

APPEND_PATH = "/v1/mirror/append"
ENDS_PATH = "/v1/mirror/ends"
RETRY_S = 0.05
"""How often a request waiting for a leader looks again."""
REQUEST_TIMEOUT_S = 10.0
"""Bound of one request to another member (an append waits for replication there)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
NOT_LEADER = 409
INVALID_FRAMES = 400
STORE_REFUSED = 507
"""The leader's store refused the append (out of disk space, too many topics): said to the site at once."""


class _NotHere(Exception):
    """This member cannot acknowledge the log now (it does not lead its partition, or the leader's stage
    refused): ask the leader known next."""


_UNANSWERED = (_NotHere, aiohttp.ClientError, OSError, TimeoutError, ValueError, LookupError, TypeError)
"""What makes a member's list of ends unknown (unreachable, or an answer that does not parse)."""


class ClusterMirrorLogs:
    """The ``mirror_logs`` port of a cluster member (see the module docstring)."""

    def __init__(
        self,
        view: ClusterView,
        store: LogStore,
        replication: Replication,
        refusal: Callable[[str], str | None],
        clients: MemberClients,
        timeout_s: float,
        elsewhere: LogsElsewhere | None = None,
        routed: Callable[[str, int, int], None] | None = None,
    ) -> None:
        """``refusal(topic)``: why a logged append on ``topic`` would be refused here now (None: this member
        leads its partition with enough in-sync replicas). ``elsewhere``: the downlinked logs held by other
        members (None: every log is read here). ``routed(topic, start, end)``: routes what this leader
        appended, once replicated, to its subscribers (a site's downlink; its replicas route what they
        commit)."""
        self.view = view
        self.store = store
        self.replication = replication
        self.refusal = refusal
        self.clients = clients
        self.timeout_s = timeout_s
        self.elsewhere = elsewhere
        self.routed = routed

    # -- the port ------------------------------------------------------------------------------------------

    async def append(self, parts: Sequence[MirrorPart]) -> list[MirrorAppend]:
        """Each leader gets its parts of the batch in one go (this member's own in one append and one wait
        for replication); parts refused ("not the leader", none known, no answer) go again to the leaders
        known then, until ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        results: list[MirrorAppend | None] = [None] * len(parts)
        waiting = list(range(len(parts)))
        while True:
            groups: dict[str | None, list[int]] = {}
            for index in waiting:
                groups.setdefault(self._leader_of(parts[index].topic), []).append(index)
            outcomes = await asyncio.gather(
                *(self._append_group(leader, [parts[i] for i in group]) for leader, group in groups.items()),
                return_exceptions=True,
            )
            waiting = []
            reason = ""
            for (leader, group), outcome in zip(groups.items(), outcomes, strict=True):
                if isinstance(outcome, _NotHere | aiohttp.ClientError | OSError | TimeoutError):
                    waiting += group
                    reason = str(outcome) or f"{leader} did not answer ({type(outcome).__name__})"
                elif isinstance(outcome, BaseException):
                    raise outcome  # InvalidRecord: the frames are bad; MirrorRefused: a store refused
                else:
                    for index, appended in zip(group, outcome, strict=True):
                        results[index] = appended
            if not waiting:
                return [result for result in results if result is not None]
            if loop.time() >= deadline:
                topic = parts[waiting[0]].topic
                raise MirrorRefused(f"{topic!r} not acknowledged within {self.timeout_s:.0f} s: {reason}")
            await asyncio.sleep(RETRY_S)

    def _leader_of(self, topic: str) -> str | None:
        """The member leading ``topic``'s partition, as this member knows it (None: none, or fenced)."""
        view = self.view
        state = view.states.get(view.partition_of(topic))
        leader = state.leader if state is not None else None
        if view.fenced or leader is None or (leader != view.node_id and leader not in view.members):
            return None
        return leader

    async def _append_group(self, leader: str | None, parts: list[MirrorPart]) -> list[MirrorAppend]:
        if leader is None:
            partition = self.view.partition_of(parts[0].topic)
            raise _NotHere(
                "this member is fenced" if self.view.fenced else f"no leader for partition {partition}"
            )
        if leader == self.view.node_id:
            return await self.append_here(parts)
        return await self._append_at(leader, parts)

    async def ends(self, prefix: str) -> dict[str, int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        while True:
            view = self.view
            nodes = sorted({view.node_id, *view.members})
            answers = await asyncio.gather(*(self._ends_of(node, prefix) for node in nodes))
            held: set[str] = set()
            ends: dict[str, int] = {}
            for node, answer in zip(nodes, answers, strict=True):
                for topic, (end, leads) in (answer or {}).items():
                    held.add(topic)
                    state = view.states.get(view.partition_of(topic))
                    if leads and state is not None and state.leader == node:
                        ends[topic] = end
            missing = held - ends.keys()
            if not missing:
                return ends
            if loop.time() >= deadline:
                raise MirrorRefused(
                    f"no leader answered for {len(missing)} logs under {prefix!r} within "
                    f"{self.timeout_s:.0f} s (e.g. {min(missing)!r})"
                )
            await asyncio.sleep(RETRY_S)

    def holds(self, topic: str) -> bool:
        return self.elsewhere is None or self.elsewhere.holds(topic)

    async def logs_elsewhere(self, filters: Sequence[str]) -> dict[str, tuple[int, int]]:
        return {} if self.elsewhere is None else await self.elsewhere.matching(filters)

    async def read_elsewhere(self, topic: str, offset: int, max_bytes: int) -> list[Record]:
        return [] if self.elsewhere is None else await self.elsewhere.read(topic, offset, max_bytes)

    # -- on the leader -------------------------------------------------------------------------------------

    async def append_here(self, parts: Sequence[MirrorPart]) -> list[MirrorAppend]:
        """Append ``parts`` on this member, which leads their partitions; return once replicated (all of
        them, or ``_NotHere`` with nothing appended when one partition is not led here now)."""
        for part in parts:
            refusal = self.refusal(part.topic)
            if refusal is not None:
                raise _NotHere(refusal)
        store = self.store
        appended = [append_mirrored(store, part.topic, part.first, part.count, part.frames) for part in parts]
        await store.wait_durable()
        replicated: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not replicated.done():
                replicated.set_result(None)

        def failed(error: BaseException) -> None:
            if not replicated.done():
                replicated.set_exception(_NotHere(str(error)))

        runs = [
            AppendedRun(part.topic, result.first, frames=result.records)
            for part, result in zip(parts, appended, strict=True)
        ]
        self.replication.when_replicated(runs, done, failed)
        try:
            await asyncio.wait_for(replicated, REQUEST_TIMEOUT_S)
        except TimeoutError:
            raise _NotHere(f"not replicated within {REQUEST_TIMEOUT_S:.0f} s") from None
        for part, result in zip(parts, appended, strict=True):
            result.end = store.committed_end(part.topic)
            if self.routed is not None and result.records:
                self.routed(part.topic, result.first, result.first + result.records)
        return appended

    def led_ends(self, prefix: str) -> dict[str, tuple[int, bool]]:
        """Every log here under ``prefix``: its committed end, and whether this member leads its partition."""
        view = self.view
        return {
            info.topic: (self.store.committed_end(info.topic), view.leads(view.partition_of(info.topic)))
            for info in self.store.logs(prefix + "#")
        }

    # -- other members -------------------------------------------------------------------------------------

    async def _append_at(self, node: str, parts: list[MirrorPart]) -> list[MirrorAppend]:
        timeout = aiohttp.ClientTimeout(total=2 * REQUEST_TIMEOUT_S)
        async with self.clients.session(node).post(
            self._url(node, APPEND_PATH), data=encode_parts(parts), timeout=timeout
        ) as answer:
            try:
                body = await answer.json(content_type=None)
            except ValueError:
                raise _NotHere(f"{node} answered {answer.status}, not in JSON") from None
        if answer.status == NOT_LEADER:
            raise _NotHere(f"{node}: {body.get('message')}")
        if answer.status == INVALID_FRAMES:
            raise InvalidRecord(str(body.get("message")))
        if answer.status == STORE_REFUSED:  # not a leader to look for again: said to the site now
            raise MirrorRefused(f"{node}: {body.get('message')}")
        if answer.status != 200:
            raise aiohttp.ClientResponseError(
                answer.request_info, (), status=answer.status, message=str(body.get("message", body))
            )
        try:
            return [_appended_of(item) for item in body["appended"]]
        except (bounds.OutOfBounds, KeyError, TypeError) as error:  # an answer no log can hold: none
            raise _NotHere(f"{node} answered what no log holds: {error}") from None

    async def _ends_of(self, node: str, prefix: str) -> dict[str, tuple[int, bool]] | None:
        """What ``node`` holds under ``prefix`` (None: it did not answer)."""
        if node == self.view.node_id:
            return self.led_ends(prefix)
        try:
            timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
            async with self.clients.session(node).get(
                self._url(node, ENDS_PATH), params={"prefix": prefix}, timeout=timeout
            ) as answer:
                if answer.status != 200:
                    return None
                body = await answer.json(content_type=None)
            return {
                topic: (bounds.offset(end, f"end of {topic!r}"), leads is True)
                for topic, (end, leads) in body["logs"].items()
            }
        except _UNANSWERED as error:
            log.debug("mirror ends from %s: %s", node, error)
            return None

    def _url(self, node: str, path: str) -> str:
        member = self.view.members.get(node)
        if member is None or member.peer is None:
            raise _NotHere(f"{node} has no members' endpoint known")
        return member.peer.rstrip("/") + path

    # -- the members' endpoint -----------------------------------------------------------------------------

    def add_routes(self, app: web.Application) -> None:
        """``POST /v1/mirror/append`` and ``GET /v1/mirror/ends`` on the members' endpoint."""
        from aiohttp import web

        from broker_edge.http.guard import hold, read_body
        from broker_edge.offsets_api.server import ApiError, access_of

        def member_of(request: web.Request) -> str:
            member = access_of(request).member
            if member is None:
                raise ApiError(403, "not_a_member", "mirrored logs are for members only", close=True)
            return member

        async def append(request: web.Request) -> web.Response:
            member_of(request)
            length = request.content_length
            if length is None or length > MAX_BODY_BYTES:
                raise ApiError(413, "too_large", f"the body must have a length of at most {MAX_BODY_BYTES}")
            hold(request, length)
            body = await read_body(request, length=length)  # within the endpoint's request_timeout_s
            try:
                parts = decode_parts(body)
            except ValueError as error:
                raise ApiError(400, "bad_request", f"not a batch of frames: {error}") from None
            try:
                appended = await self.append_here(parts)
            except _NotHere as refused:
                raise ApiError(NOT_LEADER, "not_leader", str(refused)) from None
            except InvalidRecord as error:
                raise ApiError(INVALID_FRAMES, "invalid_frames", str(error)) from None
            except StorageError as error:  # a full disk: its writer says it once, not a traceback each time
                raise ApiError(STORE_REFUSED, "store_refused", str(error)) from None
            return web.json_response({"appended": [_json_of(result) for result in appended]})

        async def ends(request: web.Request) -> web.Response:
            member_of(request)
            prefix = request.query.get("prefix", "")
            logs = {topic: [end, leads] for topic, (end, leads) in self.led_ends(prefix).items()}
            return web.json_response({"logs": logs})

        app.router.add_post(APPEND_PATH, append)
        app.router.add_get(ENDS_PATH, ends)


def encode_parts(parts: Sequence[MirrorPart]) -> bytes:
    """A leader's parts of a batch as one request body: the length of a JSON header (u32, big endian), the
    header ``[[topic, first, count, size], ...]``, then every part's frames in order."""
    header = json.dumps([[part.topic, part.first, part.count, len(part.frames)] for part in parts]).encode()
    return b"".join([_HEADER.pack(len(header)), header, *(bytes(part.frames) for part in parts)])


def decode_parts(body: bytes) -> list[MirrorPart]:
    """The parts of a request body (``encode_parts``); ``ValueError`` naming what does not add up."""
    if len(body) < _HEADER.size:
        raise ValueError("no header")
    (length,) = _HEADER.unpack_from(body)
    start = _HEADER.size + length
    try:
        header = json.loads(body[_HEADER.size : start])
        if not isinstance(header, list):
            raise bounds.OutOfBounds("expected [[topic, first, count, size], ...]")
        described = [_described(item, len(body)) for item in header]
    except (ValueError, RecursionError) as error:  # OutOfBounds is a ValueError
        raise ValueError(f"bad header: {error}") from None
    if start + sum(size for *_, size in described) != len(body):
        raise ValueError("the sizes do not add up to the frames")
    view = memoryview(body)
    parts = []
    for topic, first, count, size in described:
        parts.append(MirrorPart(topic, first, count, view[start : start + size]))
        start += size
    return parts


def _described(item: object, limit: int) -> tuple[str, int, int, int]:
    """One part's ``[topic, first, count, size]``, each number within what a log holds."""
    if not isinstance(item, list) or len(item) != 4 or not isinstance(item[0], str):
        raise bounds.OutOfBounds(f"a part must be [topic, first, count, size], got {bounds.shown(item)}")
    topic = item[0]
    first = bounds.offset(item[1], f"{topic!r} first")
    count = bounds.count(item[2], f"{topic!r} count", 1)
    size = bounds.size(item[3], f"{topic!r} size", 1, limit)
    bounds.offset_span(first, count, repr(topic))
    return topic, first, count, size


def _json_of(appended: MirrorAppend) -> list[object]:
    gap = appended.gap
    return [appended.first, appended.records, appended.duplicates, gap and list(gap), appended.end]


def _appended_of(item: object) -> MirrorAppend:
    """A leader's answer for one part, each number within what a log holds (``OutOfBounds`` otherwise)."""
    if not isinstance(item, list) or len(item) != 5:
        raise bounds.OutOfBounds(
            f"an appended part must be [first, records, duplicates, gap, end], got {item!r}"
        )
    first, records, duplicates, gap, end = item
    if gap is not None and (not isinstance(gap, list) or len(gap) != 2):
        raise bounds.OutOfBounds(f"a gap must be [start, end] or null, got {bounds.shown(gap)}")
    return MirrorAppend(
        bounds.offset(first, "first"),
        bounds.count(records, "records"),
        bounds.count(duplicates, "duplicates"),
        (bounds.offset(gap[0], "gap start"), bounds.offset(gap[1], "gap end")) if gap else None,
        bounds.offset(end, "end"),
    )
