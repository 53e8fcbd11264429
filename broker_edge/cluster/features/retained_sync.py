"""Retained messages cluster-wide: every broker holds the whole retained set, and a starting one loads it.

A retained publish reaches every broker the way any publish does: a logged one (QoS 1/2 by default) as a
committed record that every broker routes (leader, followers, observers: ``Router.publish`` keeps it, in
the log's order, so every broker ends with the same message per topic), an unlogged one over the peer
links. So the set is kept up to date with no message of its own. What a broker misses is what happened
before it started (or while it was down): ``RetainedSync`` asks a live peer for its whole set
(``RETAINED_SNAPSHOT``, a page per peer-link request, in topic order) when the node starts, and until it
is applied the retained messages of new subscriptions wait (``retained_gate``), so a subscriber
never sees a partial set.

The snapshot never overwrites a topic whose retained message was set or cleared here since the node
started: that change is newer or the same (a logged topic's changes reach every broker in log order, and
this broker goes on routing the ones after it), and a clear must not be undone by an older copy.
A peer that fails to answer is replaced by another; with no peer answering within
``retained_snapshot_timeout_ms`` the broker serves what it has (logged at WARNING). Nothing here touches
etcd.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import struct
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from broker_edge.cluster.links.link_wire import decode_parts
from broker_edge.cluster.links.peer_link import (
    PeerLinkDown,
    PeerRequestFailed,
    decode_unlogged,
    encode_unlogged,
)
from broker_edge.cluster.tasks import stop_task

if TYPE_CHECKING:
    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.cluster.view import ClusterView
    from broker_edge.engine.message import Message
    from broker_edge.engine.routing.router import Router

__all__ = ["RETAINED_SNAPSHOT", "RetainedSync", "decode_snapshot", "encode_snapshot", "snapshot_page"]

log = logging.getLogger("broker_edge.cluster.retained_sync")

RETAINED_SNAPSHOT = 20
"""Peer service: one page of the answering broker's retained set, by topic order. Request: the UTF-8 topic
the previous page ended with (empty: from the start). Reply: ``u8 more pages | snapshot``."""
PAGE_BYTES = 1 << 20
"""Payload bytes of one page (at least one message): a large retained set travels as many peer-link
messages, none near the link's message size limit."""
POLL_S = 0.05
"""How often a starting broker looks again for a peer to ask (links come up in the background)."""
LOCAL_ONLY_PREFIX = "$SYS/"
"""Retained topics of each broker's own (its statistics): never copied to another broker."""

_COUNT = struct.Struct("<I")
_OFFSET = struct.Struct("<q")
_MORE = struct.Struct("<B")


def snapshot_page(
    entries: list[tuple[str, Message]], after: str, page_bytes: int
) -> tuple[list[tuple[str, Message]], bool]:
    """The entries (sorted by topic) after topic ``after`` that fit ``page_bytes`` of payload (at least
    one), and whether more follow."""
    start = bisect.bisect_right(entries, after, key=lambda entry: entry[0]) if after else 0
    page: list[tuple[str, Message]] = []
    size = 0
    for entry in entries[start:]:
        if page and size + len(entry[1].payload) > page_bytes:
            return page, True
        page.append(entry)
        size += len(entry[1].payload)
    return page, False


def encode_snapshot(entries: Iterable[tuple[str, Message]]) -> bytes:
    """``u32 count | count x i64 log offset (-1: none) | count x UNLOGGED part`` (the peer link's own
    publish encoding: payload, QoS, properties and what remains of the expiry travel with each)."""
    kept = [message for topic, message in entries if not topic.startswith(LOCAL_ONLY_PREFIX)]
    offsets = b"".join(_OFFSET.pack(-1 if m.offset is None else m.offset) for m in kept)
    return _COUNT.pack(len(kept)) + offsets + b"".join(encode_unlogged(message) for message in kept)


def decode_snapshot(body: bytes | memoryview, now: float) -> list[Message]:
    """The retained messages of a snapshot; expiry deadlines count from ``now`` (the loop's clock).
    ``ValueError`` when it is not well formed."""
    view = memoryview(body)
    (count,) = _COUNT.unpack_from(view, 0)
    offsets_end = _COUNT.size + count * _OFFSET.size
    if offsets_end > len(view):
        raise ValueError("truncated retained snapshot")
    parts = decode_parts(bytes(view[offsets_end:]))
    if len(parts) != count:
        raise ValueError(f"retained snapshot announces {count} messages, holds {len(parts)}")
    messages: list[Message] = []
    for index, (_kind, part) in enumerate(parts):
        message = decode_unlogged(part, now)
        (offset,) = _OFFSET.unpack_from(view, _COUNT.size + index * _OFFSET.size)
        message.offset = None if offset < 0 else offset
        messages.append(message)
    return messages


class RetainedSync:
    """Serves this broker's retained set to peers and loads a peer's when the node starts."""

    def __init__(
        self,
        router: Router,
        view: ClusterView,
        links: PeerLinks,
        loop: asyncio.AbstractEventLoop,
        timeout_s: float,
        request_timeout_s: float = 2.0,
    ) -> None:
        self.router = router
        self.view = view
        self.links = links
        self.loop = loop
        self.timeout_s = timeout_s
        self.request_timeout_s = request_timeout_s
        self.loaded = False
        """Whether new subscriptions get their retained messages at once (the snapshot is applied, or
        there was nobody to ask)."""
        self._touched: set[str] | None = set()
        self._deferred: list[Callable[[], object]] = []
        self._task: asyncio.Task[None] | None = None
        links.serve_requests(RETAINED_SNAPSHOT, self._serve)

    def start(self) -> None:
        self._task = self.loop.create_task(self._load(), name="cluster-retained-load")

    async def stop(self) -> None:
        await stop_task(self._task)
        self._task = None

    # -- the retained_sync port (the router asks) ---------------------------------------------------------

    def retained_changed(self, topic: str) -> None:
        if self._touched is not None:
            self._touched.add(topic)

    def retained_gate(self, send: Callable[[], object]) -> bool:
        if self.loaded:
            return False
        self._deferred.append(send)
        return True

    # -- the peer service -------------------------------------------------------------------------------

    async def _serve(self, link: PeerLink, body: memoryview) -> bytes:
        entries = sorted(
            (entry for entry in self.router.retained.items() if not entry[0].startswith(LOCAL_ONLY_PREFIX)),
            key=lambda entry: entry[0],
        )
        page, more = snapshot_page(entries, str(body, "utf-8"), PAGE_BYTES)
        return _MORE.pack(more) + encode_snapshot(page)

    # -- loading ----------------------------------------------------------------------------------------

    async def _load(self) -> None:
        deadline = self.loop.time() + self.timeout_s
        asked: set[str] = set()
        after = ""
        received = 0
        while self.loop.time() < deadline:
            me = self.view.node_id
            others = sorted(node for node in self.view.members if node != me)
            if not others and me in self.view.members:
                self._loaded("no other member to ask")
                return
            for peer in others:
                if peer in asked or not self.links.up(peer):
                    continue
                asked.add(peer)
                try:
                    more = True
                    while more:  # pages by topic order; another peer goes on from the same topic
                        reply = await self.links.link(peer).request(
                            RETAINED_SNAPSHOT, after.encode(), self.request_timeout_s
                        )
                        more = bool(_MORE.unpack_from(reply, 0)[0])
                        messages = decode_snapshot(memoryview(reply)[_MORE.size :], self.loop.time())
                        self._apply(messages)
                        received += len(messages)
                        if messages:
                            after = messages[-1].topic
                except (PeerLinkDown, PeerRequestFailed, TimeoutError, ValueError, struct.error) as exc:
                    log.warning("retained messages from %s: %s; asking another member", peer, exc)
                    continue
                self._loaded(f"{received} retained messages, the last from {peer}")
                return
            if asked >= set(others):
                asked.clear()  # every live peer failed once: try them again while time is left
            await asyncio.sleep(POLL_S)
        log.warning(
            "no member answered for its retained messages within retained_snapshot_timeout_ms: "
            "serving the %d this broker holds",
            self.router.retained.count,
        )
        self._loaded("timed out")

    def _apply(self, messages: list[Message]) -> None:
        touched = self._touched or set()
        for message in messages:
            if message.topic in touched or message.expired():
                continue
            self.router.retain(message)

    def _loaded(self, how: str) -> None:
        log.info("retained messages loaded (%s)", how)
        self.loaded = True
        self._touched = None
        deferred, self._deferred = self._deferred, []
        for send in deferred:
            send()
