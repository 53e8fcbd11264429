"""The ``mirror_logs`` port of a cluster member: another broker's frames (a site's, on a hub) appended on the
leader of their log's partition, verbatim at the sender's offsets, and acknowledged once the in-sync
replicas hold them.

Any member takes a site's uplink. Each topic of a batch goes to the leader of its partition: appended here
when this member leads it, else handed to the leader over the members' endpoint (``POST /v1/mirror/append``:
the frames as they are, with their first offset and count). Forwarding MQTT publishes is no use here: the
leader would give them offsets of its own. The leader applies ``append_mirrored`` (what it holds is
skipped, frames past its end leave a gap), waits until they are durable, then until its ``Replication``
stage says every in-sync replica holds the log up to its end (acks=all with ``min_insync_replicas``), and
answers with the log's committed end. A member that does not lead the partition answers 409, and the
sender asks the leader it learns of next; while there is none (an election) it waits, up to ``timeout_s``,
then refuses (``MirrorRefused``): the hub tells the site, which sends again from the ends it is given next.

``ends`` is the committed end of each of the logs under a prefix, as its partition's leader has it: every
member lists the logs it holds (``GET /v1/mirror/ends``), with their committed ends for the partitions it
leads. A site resuming on another member after a failover so starts where the cluster is durable; a
leader's tail that was not replicated, and that its successor truncated, is sent again at the same offsets.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import aiohttp

from broker_edge.engine.mirror_logs import DurableTogether, MirrorAppend, MirrorRefused, append_mirrored
from broker_edge.engine.ports import AppendedRun
from broker_edge.storage import InvalidRecord

if TYPE_CHECKING:
    from collections.abc import Callable

    from aiohttp import web

    from broker_edge.cluster.links.member_clients import MemberClients
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.ports import Replication
    from broker_edge.storage import LogStore

__all__ = ["APPEND_PATH", "ENDS_PATH", "ClusterMirrorLogs"]

log = logging.getLogger("broker_edge.cluster.mirror_logs")

APPEND_PATH = "/v1/mirror/append"
ENDS_PATH = "/v1/mirror/ends"
RETRY_S = 0.05
"""How often a request waiting for a leader looks again."""
REQUEST_TIMEOUT_S = 10.0
"""Bound of one request to another member (an append waits for replication there)."""
MAX_BODY_BYTES = 64 * 1024 * 1024
NOT_LEADER = 409
INVALID_FRAMES = 400


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
    ) -> None:
        """``refusal(topic)``: why a logged append on ``topic`` would be refused here now (None: this member
        leads its partition with enough in-sync replicas)."""
        self.view = view
        self.store = store
        self.replication = replication
        self.refusal = refusal
        self.clients = clients
        self.timeout_s = timeout_s
        self.durable = DurableTogether(store)

    # -- the port ------------------------------------------------------------------------------------------

    async def append(self, topic: str, first: int, count: int, frames: bytes | memoryview) -> MirrorAppend:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        body = bytes(frames)
        while True:
            view = self.view
            partition = view.partition_of(topic)
            state = view.states.get(partition)
            leader = state.leader if state is not None else None
            try:
                if leader == view.node_id:
                    return await self.append_here(topic, first, count, body)
                if leader is not None and leader in view.members and not view.fenced:
                    return await self._append_at(leader, topic, first, count, body)
                reason = "this member is fenced" if view.fenced else f"no leader for partition {partition}"
            except _NotHere as refused:
                reason = str(refused)
            except (aiohttp.ClientError, OSError, TimeoutError) as error:
                reason = f"{leader} did not answer: {error or type(error).__name__}"
            if loop.time() >= deadline:
                raise MirrorRefused(f"{topic!r} not acknowledged within {self.timeout_s:.0f} s: {reason}")
            await asyncio.sleep(RETRY_S)

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

    # -- on the leader -------------------------------------------------------------------------------------

    async def append_here(self, topic: str, first: int, count: int, frames: bytes) -> MirrorAppend:
        """Append on this member, which leads the partition of ``topic``; return once replicated."""
        refusal = self.refusal(topic)
        if refusal is not None:
            raise _NotHere(refusal)
        appended = append_mirrored(self.store, topic, first, count, frames)
        await self.durable.wait()
        replicated: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done() -> None:
            if not replicated.done():
                replicated.set_result(None)

        def failed(error: BaseException) -> None:
            if not replicated.done():
                replicated.set_exception(_NotHere(str(error)))

        run = AppendedRun(topic, appended.first, frames=appended.records)
        self.replication.when_replicated([run], done, failed)
        try:
            await asyncio.wait_for(replicated, REQUEST_TIMEOUT_S)
        except TimeoutError:
            raise _NotHere(f"{topic!r} not replicated within {REQUEST_TIMEOUT_S:.0f} s") from None
        appended.end = self.store.committed_end(topic)
        return appended

    def led_ends(self, prefix: str) -> dict[str, tuple[int, bool]]:
        """Every log here under ``prefix``: its committed end, and whether this member leads its partition."""
        view = self.view
        return {
            info.topic: (self.store.committed_end(info.topic), view.leads(view.partition_of(info.topic)))
            for info in self.store.logs(prefix + "#")
        }

    # -- other members -------------------------------------------------------------------------------------

    async def _append_at(self, node: str, topic: str, first: int, count: int, frames: bytes) -> MirrorAppend:
        params = {"topic": topic, "first": str(first), "count": str(count)}
        timeout = aiohttp.ClientTimeout(total=2 * REQUEST_TIMEOUT_S)
        async with self.clients.session(node).post(
            self._url(node, APPEND_PATH), params=params, data=frames, timeout=timeout
        ) as answer:
            body = await answer.json(content_type=None)
        if answer.status == NOT_LEADER:
            raise _NotHere(f"{node}: {body.get('message')}")
        if answer.status == INVALID_FRAMES:
            raise InvalidRecord(str(body.get("message")))
        if answer.status != 200:
            raise aiohttp.ClientResponseError(
                answer.request_info, (), status=answer.status, message=str(body.get("message", body))
            )
        gap = body.get("gap")
        return MirrorAppend(
            int(body["first"]),
            int(body["records"]),
            int(body["duplicates"]),
            (int(gap[0]), int(gap[1])) if gap else None,
            int(body["end"]),
        )

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
            return {str(topic): (int(end), bool(leads)) for topic, (end, leads) in body["logs"].items()}
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

        from broker_edge.http.guard import hold
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
                return _error(413, "too_large", f"the body must have a length of at most {MAX_BODY_BYTES}")
            try:
                topic = request.query["topic"]
                first = int(request.query["first"])
                count = int(request.query["count"])
            except (KeyError, ValueError) as error:
                return _error(400, "bad_request", f"topic, first and count are required: {error!r}")
            hold(request, length)
            frames = await request.content.readexactly(length)
            try:
                appended = await self.append_here(topic, first, count, frames)
            except _NotHere as refused:
                return _error(NOT_LEADER, "not_leader", str(refused))
            except InvalidRecord as error:
                return _error(INVALID_FRAMES, "invalid_frames", str(error))
            return web.json_response(
                {
                    "first": appended.first,
                    "records": appended.records,
                    "duplicates": appended.duplicates,
                    "gap": list(appended.gap) if appended.gap is not None else None,
                    "end": appended.end,
                }
            )

        async def ends(request: web.Request) -> web.Response:
            member_of(request)
            prefix = request.query.get("prefix", "")
            logs = {topic: [end, leads] for topic, (end, leads) in self.led_ends(prefix).items()}
            return web.json_response({"logs": logs})

        app.router.add_post(APPEND_PATH, append)
        app.router.add_get(ENDS_PATH, ends)


def _error(status: int, code: str, message: str) -> web.Response:
    from aiohttp import web

    return web.json_response({"error": code, "message": message}, status=status)
