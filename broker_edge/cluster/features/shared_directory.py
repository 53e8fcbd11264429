"""Which brokers have members of which shared group, which broker gets a message, and what is in flight.

The pure parts of cluster-wide shared subscriptions (``broker_edge.cluster.features.shared_groups``), with no
I/O:

- ``SharedDirectory``: broker → the ``(group, filter)`` pairs it has members of (as registered in etcd), held
  in a ``SubscriptionTrie`` whose subscribers are node ids, so matching a topic is the trie's cached lookup;
  ``choose`` picks a broker of a group round robin (a broker then picks one of its own members, as a broker
  alone does).
- ``Deliveries``: the shared deliveries of logged records assigned and not yet finished, known to every
  broker (the leader that assigned them tells the others), so that whoever leads a partition next can give
  those of a dead broker to another; and a bounded memory of the finished ones, so an assignment is never
  made twice for one record and group.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from broker_edge.engine.routing.subscriptions import SharedGroup, SubscriptionOptions, SubscriptionTrie

__all__ = ["Deliveries", "DeliveryKey", "GroupKey", "SharedDirectory", "choose"]

GroupKey = tuple[str, str]
"""(group name, topic filter): one shared subscription, as ``$share/<group>/<filter>`` names it."""


@dataclass(frozen=True, slots=True)
class DeliveryKey:
    """One logged record for one shared group: what is assigned once, to one broker."""

    topic: str
    offset: int
    group: str
    topic_filter: str


_OPTIONS = SubscriptionOptions()


class SharedDirectory:
    """node id → the shared groups it has members of; ``match(topic)`` → the groups of a topic."""

    def __init__(self) -> None:
        self._trie: SubscriptionTrie[str] = SubscriptionTrie()
        self._groups: dict[str, set[GroupKey]] = {}

    def replace(self, node: str, groups: Iterable[GroupKey]) -> None:
        """``node`` has members of exactly ``groups`` now."""
        new = set(groups)
        old = self._groups.get(node, set())
        for group, topic_filter in old - new:
            self._trie.remove(topic_filter, node, group)
        for group, topic_filter in new - old:
            self._trie.add(topic_filter, node, _OPTIONS, group)
        if new:
            self._groups[node] = new
        else:
            self._groups.pop(node, None)

    def remove(self, node: str) -> None:
        self.replace(node, ())

    def match(self, topic: str) -> list[SharedGroup[str]]:
        """The shared groups whose filter matches ``topic``, each with the brokers that have members."""
        return self._trie.match(topic).groups

    def group(self, key: GroupKey) -> SharedGroup[str] | None:
        return self._trie.shared_group(key[1], key[0])


def choose(group: SharedGroup[str] | None, usable: Callable[[str], bool]) -> str | None:
    """The next broker of ``group`` in round-robin order that is ``usable`` (None: there is none)."""
    if group is None:
        return None
    picked = group.pick(usable)
    if picked is None or not usable(picked[0]):
        return None
    return picked[0]


class Deliveries:
    """Assigned shared deliveries (key → the broker it went to) and the finished ones remembered.

    ``remembered`` bounds the memory of finished keys (the oldest are forgotten first): a key forgotten
    there can be assigned again only if a late message about it arrives after that many others finished.
    """

    def __init__(self, remembered: int) -> None:
        self.remembered = remembered
        self.assigned: dict[DeliveryKey, str | None] = {}
        """key → node id of the broker delivering it; None after that broker declined it."""
        self.declined: dict[DeliveryKey, set[str]] = {}
        self._finished: OrderedDict[DeliveryKey, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.assigned)

    def known(self, key: DeliveryKey) -> bool:
        """Whether ``key`` was assigned already (in flight or finished)."""
        return key in self.assigned or key in self._finished

    def assign(self, key: DeliveryKey, node: str) -> bool:
        """``key`` goes to ``node``; False (and nothing changes) if it has finished already."""
        if key in self._finished:
            return False
        self.assigned[key] = node
        return True

    def hold(self, key: DeliveryKey) -> None:
        """``key`` waits for a broker to take it (none can now)."""
        if key not in self._finished:
            self.assigned[key] = None

    def decline(self, key: DeliveryKey, node: str) -> set[str]:
        """``node`` has no member for ``key`` any more: the brokers that declined it so far."""
        if key in self._finished:
            return set()
        self.assigned[key] = None
        declined = self.declined.setdefault(key, set())
        declined.add(node)
        return declined

    def finish(self, key: DeliveryKey) -> None:
        """``key`` was delivered (or dropped as a broker alone drops it): never assigned again."""
        self.assigned.pop(key, None)
        self.declined.pop(key, None)
        finished = self._finished
        finished[key] = None
        while len(finished) > self.remembered:
            finished.popitem(last=False)

    def orphans(self, alive: Callable[[str], bool], leads: Callable[[str], bool]) -> list[DeliveryKey]:
        """Keys of partitions this node leads (``leads(topic)``) whose broker is gone or declined."""
        return [
            key
            for key, node in self.assigned.items()
            if (node is None or not alive(node)) and leads(key.topic)
        ]

    def in_partitions(
        self, partition_of: Callable[[str], int], partitions: set[int]
    ) -> list[tuple[DeliveryKey, str]]:
        """The assigned keys of ``partitions``, with their broker (what a new leader asks its peers for)."""
        return [
            (key, node)
            for key, node in self.assigned.items()
            if node is not None and partition_of(key.topic) in partitions
        ]
