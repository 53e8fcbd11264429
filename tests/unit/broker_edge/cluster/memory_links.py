"""Peer links in memory: what one broker's link sends reaches the other broker's link at once, no socket."""

from __future__ import annotations

from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks


class MemoryWire:
    """One side's socket: what it sends is handled by the other side's link, unless ``lost`` is set."""

    def __init__(self, links: PeerLinks, link: PeerLink) -> None:
        self.links = links
        self.link = link
        self.lost = False

    async def send_bytes(self, data: bytes) -> None:
        if not self.lost:
            self.link.received(data, self.links.receiver, self.links._handlers, self.links._services)

    async def close(self) -> None:
        return None


def link_in_memory(a: PeerLinks, b: PeerLinks) -> tuple[MemoryWire, MemoryWire]:
    """Join ``a`` and ``b`` both ways (on the running loop); the wires ``a`` → ``b`` and ``b`` → ``a``."""
    a_to_b = MemoryWire(b, b.link(a.node_id))
    b_to_a = MemoryWire(a, a.link(b.node_id))
    a.link(b.node_id).attach(a_to_b)
    b.link(a.node_id).attach(b_to_a)
    a.link(b.node_id).learn_format()  # as a link coming up does: format 2 once the peer answers
    b.link(a.node_id).learn_format()
    return a_to_b, b_to_a
