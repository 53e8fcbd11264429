"""Peer links in memory: what one broker's link sends reaches the other broker's link at once, no socket."""

from __future__ import annotations

from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks


class MemoryWire:
    """One side's socket: what it sends is handled by the other side's link, unless ``lost`` is set."""

    def __init__(self, links: PeerLinks, link: PeerLink) -> None:
        self.links = links
        self.link = link
        self.lost = False
        self.held: list[bytes] | None = None
        """While a list, what is sent waits in it until ``release``."""

    async def send_bytes(self, data: bytes) -> None:
        if self.held is not None:
            self.held.append(data)
        elif not self.lost:
            self._deliver(data)

    def release(self) -> None:
        """Deliver what was held, now, and deliver at once from now on."""
        held, self.held = self.held or [], None
        for data in held:
            self._deliver(data)

    def _deliver(self, data: bytes) -> None:
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
