"""Which members proved their node id to this node, and which it takes for alive: the controller's say.

etcd tells who registered; it cannot tell who is who, since anyone able to write the cluster's prefix can
write a member record. So the controller gives copies and leaderships only to members that *proved* their
node id to it: a peer link with them came up, which happens only after the TLS handshake and the node
check of ``member_api`` / ``member_clients`` (without ``cluster.tls``, on loopback, a link coming up is
all there is). A proof holds for as long as the member's record stays the one it had then; a record
rewritten (another address) must be proven again, and a link that drops for a moment does not undo it. A
record that went (the member's lease ran out: cut off from etcd) and came back as it was, while the link
that proved it stayed up all along (``linked``), is proven still: no new link comes up to prove it again.

A member registered for ``grace_s`` without proving itself is taken for dead: the controller elects others
for the partitions it leads, as for a member that left. A member key written into etcd by someone without
a member certificate therefore gets nothing, and cannot keep a leadership a forged partition record gave
it. Unless no other member has proven itself to this node at all: a controller cut off from every other
member (a network split, a restart into one) cannot tell a forged member from a real one it cannot
reach, and takes nobody for dead that etcd says is alive.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from broker_edge.cluster.view import ClusterView
from broker_edge.placement import Member

__all__ = ["MemberProofs"]


class MemberProofs:
    """Proofs of this node's peers (see the module docstring); ``link_up`` when a peer link comes up,
    ``changed`` after every view change."""

    def __init__(
        self, view: ClusterView, grace_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.view = view
        self.grace_s = grace_s
        self._clock = clock
        self._proven: dict[str, Member] = {}
        """node → the member record it proved itself under."""
        self._first_seen: dict[str, tuple[Member, float]] = {}
        """node → its current record and when this node first saw it."""
        self._proven_before: dict[str, Member] = {}
        """node → the record it proved itself under, kept after the record went (until its link drops)."""
        self._listeners: list[Callable[[], None]] = []
        self.linked: Callable[[str], bool] = lambda _node: False
        """Whether the peer link with a node is up (``PeerLinks.up``)."""

    def on_proof(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when a member proves itself."""
        self._listeners.append(listener)

    def link_up(self, node: str) -> None:
        """A peer link with ``node`` came up: its node id is proven, for its current record."""
        member = self.view.members.get(node)
        if member is None or self._proven.get(node) == member:
            return
        self._proven[node] = self._proven_before[node] = member
        for listener in list(self._listeners):
            listener()

    def link_down(self, node: str) -> None:
        """The peer link with ``node`` dropped: a record of it that goes and comes back is proven anew."""
        self._proven_before.pop(node, None)

    def changed(self) -> None:
        """Forget the proofs and first sightings of records that changed or went."""
        members = self.view.members
        now = self._clock()
        for node in list(self._proven):
            if members.get(node) != self._proven[node]:
                del self._proven[node]
        for node, member in members.items():
            if node not in self._proven and self._proven_before.get(node) == member and self.linked(node):
                self._proven[node] = member  # back as it was, over the link that proved it
        for node in list(self._first_seen):
            if members.get(node) != self._first_seen[node][0]:
                del self._first_seen[node]
        for node, member in members.items():
            self._first_seen.setdefault(node, (member, now))

    def eligible(self) -> set[str]:
        """Members that may be given copies and leaderships: this node and those proven."""
        members = self.view.members
        proven = {node for node, member in self._proven.items() if members.get(node) == member}
        return {self.view.node_id} | proven

    def alive(self) -> set[str]:
        """Members taken for alive: the eligible ones, and those still within their time to prove it (every
        member, while no other one has proven itself to this node)."""
        self.changed()
        eligible = self.eligible()
        if eligible == {self.view.node_id}:
            return set(self.view.members) | eligible
        now = self._clock()
        waiting = {node for node, (_, seen) in self._first_seen.items() if now - seen < self.grace_s}
        return eligible | waiting
