"""The subscription trie: which sessions want a topic, matched once per topic and cached.

Filters are stored level by level (``a/+/c`` is the path ``a`` → ``+`` → ``c``); ``#`` is a leaf. A publish
is matched once against the trie and the result, already merged per session (one copy per session at the
highest granted QoS, carrying every matching subscription identifier), is cached per topic until the next
SUBSCRIBE or UNSUBSCRIBE changes the trie. On a steady fleet most publishes are cache hits: one dict lookup.

Shared subscriptions (``$share/<group>/<filter>``) live at their filter's node as ``SharedGroup`` objects: a
match returns the groups and the router picks one member per group per message.

A topic not in the cache is matched by a walk that enters every ``+`` and ``#`` branch as well as the exact
one, so its cost is the number of nodes whose filters match the topic so far: a few for the shapes fleets
use (``fleet/+/telemetry``, ``devices/<id>/+/cmd``: one exact branch per level), but as many as the filters
themselves for a set built to branch at every level (``{a,+}/{a,+}/...``). Each node keeps ``walk``, the
most nodes a walk from it can visit for any topic, and ``walk_with`` says what the root's would be with one
more filter, so a broker can refuse a SUBSCRIBE that would let one publish cost more than its limit
(``limits.max_match_nodes``).

The trie holds subscribers as opaque hashable objects (the router's sessions); it never looks inside them
except through ``SharedGroup.pick``'s ``is_online`` and ``has_room`` callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

__all__ = ["Match", "OwnTerms", "SharedGroup", "SubscriptionOptions", "SubscriptionTrie", "merge_options"]

S = TypeVar("S", bound=Hashable)
"""The subscriber type (the router's ``Session``)."""


@dataclass(slots=True)
class SubscriptionOptions:
    """What one subscription asked for; ``subscription_id`` is the v5 Subscription Identifier or None."""

    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


class OwnTerms(NamedTuple):
    """How a session takes its own client's messages when only some of its matching subscriptions asked for
    No Local: as the others alone give them [MQTT-3.8.3-3], [MQTT-3.3.4-2], [MQTT-3.3.4-3]."""

    qos: int
    retain_as_published: bool
    subscription_ids: tuple[int, ...]


NoLocal = bool | OwnTerms
"""A merged entry's No Local: False (no matching subscription asked for it), True (every one did) or, when
some did, the ``OwnTerms`` of the others. Truthy whenever a check against the publisher is needed."""


def merge_options(options: Iterable[SubscriptionOptions]) -> tuple[int, NoLocal, bool, tuple[int, ...]]:
    """One session's matching subscriptions merged: the highest QoS, its ``NoLocal``, Retain As Published
    when any asked, every Subscription Identifier once (in the order given)."""
    qos, retain_as_published, ids = 0, False, []
    own: list | None = None  # qos, retain as published, identifiers of those without No Local
    some_no_local = False
    for option in options:
        qos = max(qos, option.qos)
        retain_as_published = retain_as_published or option.retain_as_published
        sub_id = option.subscription_id
        if sub_id is not None and sub_id not in ids:
            ids.append(sub_id)
        if option.no_local:
            some_no_local = True
        elif own is None:
            own = [option.qos, option.retain_as_published, [] if sub_id is None else [sub_id]]
        else:
            own[0] = max(own[0], option.qos)
            own[1] = own[1] or option.retain_as_published
            if sub_id is not None and sub_id not in own[2]:
                own[2].append(sub_id)
    no_local: NoLocal = own is None
    if own is not None and some_no_local:
        no_local = OwnTerms(own[0], own[1], tuple(own[2]))
    return qos, no_local, retain_as_published, tuple(ids)


class SharedGroup(Generic[S]):
    """The members of one shared subscription (group name + filter); each message goes to one of them.

    Members are picked round robin, skipping offline members while any member is online, so a group keeps
    flowing when some of its consumers are away (their persistent sessions only get messages when nobody
    else of the group can take them), and online members that cannot take a message now while another can
    (a slow consumer at its Receive Maximum).
    """

    __slots__ = ("_cursor", "_order", "filter", "members", "name")

    def __init__(self, name: str, topic_filter: str) -> None:
        self.name = name
        self.filter = topic_filter
        self.members: dict[S, SubscriptionOptions] = {}
        self._order: list[S] = []
        self._cursor = 0

    def add(self, member: S, options: SubscriptionOptions) -> None:
        if member not in self.members:
            self._order.append(member)
        self.members[member] = options

    def remove(self, member: S) -> bool:
        if self.members.pop(member, None) is None:
            return False
        self._order.remove(member)
        return True

    def pick(
        self,
        is_online: Callable[[S], bool],
        has_room: Callable[[S], bool] | None = None,
        takes: Callable[[S, SubscriptionOptions], bool] | None = None,
    ) -> tuple[S, SubscriptionOptions] | None:
        """The next member in round-robin order, preferring online members and, among them, one that
        ``has_room`` for a message now (when given: one whose window is full would only hold it in its
        queue); an online member that cannot ``take`` the message at all (when given: larger than its
        Maximum Packet Size) comes after every other, offline ones included. None if the group is empty."""
        order = self._order
        count = len(order)
        if not count:
            return None
        members = self.members
        start = self._cursor % count
        chosen = 0  # steps from ``start`` to the member chosen
        best = _CANNOT_TAKE + 1
        for step in range(count):
            member = order[(start + step) % count]
            if not is_online(member):
                rank = _OFFLINE
            elif takes is not None and not takes(member, members[member]):
                rank = _CANNOT_TAKE
            elif has_room is None or has_room(member):
                chosen = step
                break
            else:
                rank = _FULL
            if rank < best:
                best, chosen = rank, step
        self._cursor = start + chosen + 1
        member = order[(start + chosen) % count]
        return member, members[member]


_FULL = 1
"""``SharedGroup.pick``'s ranks after an online member with room: online, its window full;"""
_OFFLINE = 2
"""offline (its persistent session holds the message);"""
_CANNOT_TAKE = 3
"""online, and the message would be dropped for it."""


class Match(Generic[S]):
    """A topic's subscribers, merged per session; the cached unit of the trie.

    ``subscribers`` holds ``(session, qos, no_local, retain_as_published, subscription_ids)`` tuples
    (``merge_options``): ``qos`` is the highest granted QoS among the session's matching subscriptions,
    ``no_local`` True when every matching subscription asked for No Local, False when none did, and the
    ``OwnTerms`` of the others when some did; ``retain_as_published`` when any asked, and ``subscription_ids``
    is a tuple of every matching subscription identifier (v5), usually empty.
    """

    __slots__ = ("groups", "subscribers")

    def __init__(
        self,
        subscribers: list[tuple[S, int, NoLocal, bool, tuple[int, ...]]],
        groups: list[SharedGroup[S]],
    ) -> None:
        self.subscribers = subscribers
        self.groups = groups

    def __len__(self) -> int:
        return len(self.subscribers) + len(self.groups)


_EMPTY_MATCH: Match[Any] = Match([], [])


class _Node(Generic[S]):
    __slots__ = ("children", "shared", "subscribers", "walk")

    def __init__(self) -> None:
        self.children: dict[str, _Node[S]] | None = None
        self.subscribers: dict[S, SubscriptionOptions] | None = None
        self.shared: dict[str, SharedGroup[S]] | None = None
        self.walk = 1
        """The most nodes a match's walk from here visits for any topic: 1 + its ``+`` and ``#`` children's
        + the largest of its exact children's. Exact as filters are added; removing one leaves it as it
        was, an upper bound, until ``SubscriptionTrie.recount_walks``."""

    def is_empty(self) -> bool:
        return not self.children and not self.subscribers and not self.shared


def _walk_above(parent: _Node[Any] | None, level: str, below_before: int, below: int) -> int:
    """``parent``'s ``walk`` (None: a node not there yet) once its child ``level`` counts ``below`` instead of
    ``below_before``."""
    before = parent.walk if parent is not None else 0
    if level == "+" or level == "#":  # a wildcard branch is walked beside the others: it adds
        return max(before, 1) + below - below_before
    wild = 0  # one exact branch is walked: the largest counts
    children = parent.children if parent is not None else None
    if children:
        for key in ("+", "#"):
            branch = children.get(key)
            if branch is not None:
                wild += branch.walk
    return max(before, 1 + wild + below)


class SubscriptionTrie(Generic[S]):
    """Topic filters → subscribers, with a per-topic match cache.

    ``cache_size`` bounds the cache (entries). A full cache stays as it is until as many topics as it holds
    have missed it, then it is emptied and fills again: a fleet with a few more topics than it holds keeps
    most of them cached (emptying it at once when full made a cycle of such topics miss every time), a
    broker with far more topics than it holds refills it now and then, and the hit path stays a single
    lookup. Topics that match the same filters share one ``Match`` (a fleet's device topics under
    ``fleet/+/telemetry`` all do), so an entry costs its slot and the topic name, usually the decoder's own
    copy (``decoder._TOPIC_NAMES``): 16,384 entries take about 2 MB at most. A miss walks the trie but
    merges the subscriptions of filters already matched together only once.
    """

    __slots__ = ("_cache", "_cache_size", "_merged", "_misses", "_root", "count", "walks_exact")

    def __init__(self, cache_size: int = 16_384) -> None:
        self._root: _Node[S] = _Node()
        self._cache: dict[str, Match[S]] = {}
        self._cache_size = cache_size
        self._merged: dict[tuple[_Node[S], ...], Match[S]] = {}
        """The ``Match`` of each combination of matching nodes the cache holds."""
        self._misses = 0
        """Topics that missed the cache since it was last full."""
        self.count = 0
        """Subscriptions held (shared memberships included)."""
        self.walks_exact = True
        """False once a filter was removed since the walks were last counted (they are upper bounds)."""

    # -- changes ------------------------------------------------------------------------------------------

    def add(
        self,
        topic_filter: str,
        subscriber: S,
        options: SubscriptionOptions,
        share_group: str | None = None,
    ) -> bool:
        """Add or replace a subscription; True if it is new (False when it replaced one)."""
        levels = topic_filter.split("/")
        node = self._root
        path = [node]
        new_from = 0  # the depth of the first node made (0: none)
        for depth, level in enumerate(levels, 1):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
                child.walk = len(levels) - depth + 1  # a new chain: each walks itself and those below
                if not new_from:
                    new_from = depth
            path.append(child)
            node = child
        if new_from:  # the counts above the new chain grow, up to where one does not change
            below_before, below = 0, path[new_from].walk
            for depth in range(new_from - 1, -1, -1):
                parent = path[depth]
                before = parent.walk
                walk = _walk_above(parent, levels[depth], below_before, below)
                if walk == before:
                    break
                parent.walk = walk
                below_before, below = before, walk
        self._forget_matches()
        if share_group is None:
            if node.subscribers is None:
                node.subscribers = {}
            new = subscriber not in node.subscribers
            node.subscribers[subscriber] = options
        else:
            if node.shared is None:
                node.shared = {}
            group = node.shared.get(share_group)
            if group is None:
                group = node.shared[share_group] = SharedGroup(share_group, topic_filter)
            new = subscriber not in group.members
            group.add(subscriber, options)
        if new:
            self.count += 1
        return new

    def remove(self, topic_filter: str, subscriber: S, share_group: str | None = None) -> bool:
        """Remove a subscription; False if there was none. Empty branches are pruned."""
        path: list[tuple[_Node[S], str]] = []
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level) if node.children else None
            if child is None:
                return False
            path.append((node, level))
            node = child
        if share_group is None:
            if not node.subscribers or node.subscribers.pop(subscriber, None) is None:
                return False
            if not node.subscribers:
                node.subscribers = None
        else:
            shared = node.shared
            group = shared.get(share_group) if shared else None
            if shared is None or group is None or not group.remove(subscriber):
                return False
            if not group.members:
                del shared[share_group]
                if not shared:
                    node.shared = None
        self.count -= 1
        self.walks_exact = False
        self._forget_matches()
        for parent, level in reversed(path):
            if not node.is_empty():
                break
            children = parent.children
            if children is not None:
                del children[level]
            if not children:
                parent.children = None
            node = parent
        return True

    # -- the cost of a match -------------------------------------------------------------------------------

    @property
    def walk(self) -> int:
        """The most nodes one match visits now (an upper bound unless ``walks_exact``)."""
        return self._root.walk

    def walk_with(self, topic_filter: str) -> int:
        """The most nodes one match would visit (the root's ``walk``) with ``topic_filter`` added too; an
        upper bound unless ``walks_exact``."""
        return self._walks_with(topic_filter.split("/"))[0]

    def _walks_with(self, levels: list[str]) -> list[int]:
        """The ``walk`` of each node on the path of a filter of ``levels``, the root's first, once it is added
        (a node not there yet counts as a new one)."""
        path: list[_Node[S] | None] = []
        node: _Node[S] | None = self._root
        for level in levels:
            path.append(node)
            children = node.children if node is not None else None
            node = children.get(level) if children else None
        below_before = node.walk if node is not None else 0
        below = node.walk if node is not None else 1
        walks = [below]
        for parent, level in zip(reversed(path), reversed(levels), strict=True):
            walk = _walk_above(parent, level, below_before, below)
            walks.append(walk)
            below_before, below = (parent.walk if parent is not None else 0), walk
        walks.reverse()
        return walks

    def recount_walks(self) -> None:
        """Count every node's ``walk`` again, exactly (removals left upper bounds): visits every node."""
        order: list[_Node[S]] = []
        stack = [self._root]
        while stack:
            node = stack.pop()
            order.append(node)
            if node.children:
                stack.extend(node.children.values())
        for node in reversed(order):  # children before their parent
            children = node.children
            walk = 1
            if children:
                widest = 0
                for level, child in children.items():
                    if level == "+" or level == "#":
                        walk += child.walk
                    elif child.walk > widest:
                        widest = child.walk
                walk += widest
            node.walk = walk
        self.walks_exact = True

    # -- lookups ------------------------------------------------------------------------------------------

    def shared_group(self, topic_filter: str, group: str) -> SharedGroup[S] | None:
        """The shared group ``group`` of ``topic_filter`` (None if it has no member here)."""
        node = self._root
        for level in topic_filter.split("/"):
            child = node.children.get(level) if node.children else None
            if child is None:
                return None
            node = child
        return node.shared.get(group) if node.shared else None

    def match(self, topic: str) -> Match[S]:
        """Every subscriber of ``topic`` (a topic name, no wildcards), merged per session; cached.

        Without any subscription the answer is known without a walk, and caching it would only fill the
        cache with one entry per topic published to."""
        if not self.count:
            return _EMPTY_MATCH
        cached = self._cache.get(topic)
        if cached is not None:
            return cached
        found: list[_Node[S]] = []
        self._collect(self._root, topic.split("/"), 0, topic.startswith("$"), found)
        key = tuple(found)
        result = self._merged.get(key)
        if result is None:
            merged: dict[S, list[SubscriptionOptions]] = {}
            groups: list[SharedGroup[S]] = []
            for node in found:
                _merge(node, merged, groups)
            if merged or groups:
                result = Match([(s, *merge_options(options)) for s, options in merged.items()], groups)
            else:
                result = _EMPTY_MATCH
        cache = self._cache
        if len(cache) >= self._cache_size:
            self._misses += 1
            if self._misses < self._cache_size:
                return result
            self._forget_matches()
        cache[topic] = result
        self._merged[key] = result
        return result

    def _forget_matches(self) -> None:
        """Empty the cache (full and missed as often as it holds topics, or the trie changed)."""
        self._cache.clear()
        self._merged.clear()
        self._misses = 0

    def _collect(
        self, node: _Node[S], levels: list[str], index: int, dollar: bool, found: list[_Node[S]]
    ) -> None:
        """Append to ``found`` the nodes whose subscriptions match ``levels[index:]`` below ``node``, in the
        walk's order (the same filters matched always give the same order)."""
        children = node.children
        if index == len(levels):
            found.append(node)
            if children is not None:
                hash_node = children.get("#")
                if hash_node is not None:  # "a/#" also matches "a"
                    found.append(hash_node)
            return
        if children is None:
            return
        wildcard_ok = not (dollar and index == 0)  # $-topics are not matched by a leading wildcard
        if wildcard_ok:
            hash_node = children.get("#")
            if hash_node is not None:
                found.append(hash_node)
            plus_node = children.get("+")
            if plus_node is not None:
                self._collect(plus_node, levels, index + 1, dollar, found)
        exact = children.get(levels[index])
        if exact is not None:
            self._collect(exact, levels, index + 1, dollar, found)

    def subscriptions(self) -> Iterator[tuple[str, S, SubscriptionOptions, str | None]]:
        """Every ``(filter, subscriber, options, share_group)``; for diagnostics and tests."""
        stack: list[tuple[_Node[S], list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            if path:
                topic_filter = "/".join(path)
                for subscriber, options in (node.subscribers or {}).items():
                    yield topic_filter, subscriber, options, None
                for group in (node.shared or {}).values():
                    for subscriber, options in group.members.items():
                        yield topic_filter, subscriber, options, group.name
            for level, child in (node.children or {}).items():
                stack.append((child, [*path, level]))

    def cached_topics(self) -> int:
        return len(self._cache)


def _merge(node: _Node[S], merged: dict[S, list[SubscriptionOptions]], groups: list[SharedGroup[S]]) -> None:
    subscribers = node.subscribers
    if subscribers:
        for subscriber, options in subscribers.items():
            entry = merged.get(subscriber)
            if entry is None:
                merged[subscriber] = [options]
            else:
                entry.append(options)
    if node.shared:
        groups.extend(node.shared.values())
