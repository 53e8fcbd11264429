"""Retained messages: the last retained message of each topic, found by topic filter on SUBSCRIBE.

Stored in a trie of topic levels so a wildcard SUBSCRIBE walks only the branches its filter can match
instead of testing every retained topic. The stored value is the router's message object (with its own
encoding cache), so serving a retained message to many subscribers encodes it once per variant.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RetainedBounds", "RetainedStore"]


class _Node:
    __slots__ = ("children", "message", "owner", "size")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.message: Any = None
        self.size = 0
        """Bytes the retained message is counted for (its topic and payload)."""
        self.owner = ""
        """The client id it is counted to (its publisher)."""


@dataclass(frozen=True, slots=True)
class RetainedBounds:
    """What the retained set may hold (0 = unlimited, each)."""

    max_retained: int = 0
    """Topics holding a retained message."""
    max_bytes: int = 0
    """Bytes (topics and payloads) of every retained message together."""
    max_bytes_per_client: int = 0
    """Bytes of the retained messages one client id published and that are still retained."""


class RetainedStore:
    """Topic → last retained message, within ``RetainedBounds``: a count, bytes in all, bytes per client.

    Each message is counted (topic + payload bytes) to the client id that published it until it is replaced,
    cleared or expires, so one device cannot fill the budget of all. ``is_expired(message)`` lets the store
    drop messages whose v5 Message Expiry has passed when they are looked up, so expiry needs no timer.
    """

    __slots__ = ("_by_owner", "_is_expired", "_root", "bounds", "bytes", "changes", "count")

    def __init__(
        self, bounds: RetainedBounds | None = None, is_expired: Callable[[Any], bool] | None = None
    ) -> None:
        self._root = _Node()
        self.count = 0
        self.bytes = 0
        """Bytes of every retained message (topics and payloads)."""
        self._by_owner: dict[str, int] = {}
        self.changes = 0
        """Messages retained or cleared since the start (a saved copy is current while this is unchanged)."""
        self.bounds = bounds if bounds is not None else RetainedBounds()
        self._is_expired = is_expired

    @property
    def max_retained(self) -> int:
        return self.bounds.max_retained

    def bytes_of(self, owner: str) -> int:
        """Bytes of the retained messages counted to client id ``owner``."""
        return self._by_owner.get(owner, 0)

    def set(self, topic: str, message: Any, size: int = 0, owner: str = "") -> str | None:
        """Retain ``message`` (``size`` bytes, published by ``owner``) for ``topic``, replacing the previous
        one; None, or why it was not retained: ``retained_full`` (topics), ``retained_bytes`` (all bytes),
        ``retained_client_bytes`` (the owner's bytes). The message it would replace stays then."""
        bounds = self.bounds
        node = self._find(topic)
        held = node is not None and node.message is not None
        if bounds.max_retained and self.count >= bounds.max_retained and not held:
            return "retained_full"
        freed = node.size if node is not None and held else 0
        if bounds.max_bytes and self.bytes - freed + size > bounds.max_bytes:
            return "retained_bytes"
        if bounds.max_bytes_per_client and owner:
            own = self.bytes_of(owner) - (freed if node is not None and node.owner == owner else 0)
            if own + size > bounds.max_bytes_per_client:
                return "retained_client_bytes"
        if node is None:
            node = self._make(topic)
        if node.message is None:
            self.count += 1
        else:
            self._uncount(node)
        node.message, node.size, node.owner = message, size, owner
        self.changes += 1
        self.bytes += size
        if owner:
            self._by_owner[owner] = self._by_owner.get(owner, 0) + size
        return None

    def _uncount(self, node: _Node) -> None:
        self.bytes -= node.size
        if node.owner:
            left = self._by_owner[node.owner] - node.size
            if left:
                self._by_owner[node.owner] = left
            else:
                del self._by_owner[node.owner]
        node.size, node.owner = 0, ""

    def _find(self, topic: str) -> _Node | None:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level) if node.children else None
            if child is None:
                return None
            node = child
        return node

    def _make(self, topic: str) -> _Node:
        node = self._root
        for level in topic.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
            node = child
        return node

    def clear(self, topic: str) -> bool:
        """Forget the retained message of ``topic`` (a PUBLISH with an empty retained payload)."""
        node = self._find(topic)
        if node is None or node.message is None:
            return False
        node.message = None
        self._uncount(node)
        self.count -= 1
        self.changes += 1
        self._prune(topic.split("/"))
        return True

    def get(self, topic: str) -> Any:
        node = self._find(topic)
        return node.message if node is not None else None

    def match(self, topic_filter: str) -> list[tuple[str, Any]]:
        """``(topic, message)`` of every retained topic the filter matches ($-topics only explicitly)."""
        found: list[tuple[str, Any]] = []
        self._walk(self._root, topic_filter.split("/"), 0, [], found)
        if self._is_expired is not None:
            expired = [topic for topic, message in found if self._is_expired(message)]
            if expired:
                for topic in expired:
                    self.clear(topic)
                found = [(t, m) for t, m in found if t not in set(expired)]
        return found

    def items(self) -> list[tuple[str, Any]]:
        """``(topic, message)`` of every retained topic, ``$`` topics included, the expired left out."""
        found: list[tuple[str, Any]] = []
        if self._root.children:
            self._collect_all(self._root.children, [], False, found)
        if self._is_expired is not None:
            found = [(topic, message) for topic, message in found if not self._is_expired(message)]
        return found

    def _walk(self, node: _Node, levels: list[str], index: int, path: list[str], found: list) -> None:
        if index == len(levels):
            if node.message is not None:
                found.append(("/".join(path), node.message))
            return
        level = levels[index]
        children = node.children
        if level == "#":
            if node.message is not None and index > 0:  # "a/#" matches "a" itself
                found.append(("/".join(path), node.message))
            if children:
                self._collect_all(children, path, index == 0, found)
            return
        if not children:
            return
        if level == "+":
            for name, child in children.items():
                if index == 0 and name.startswith("$"):
                    continue
                self._walk(child, levels, index + 1, [*path, name], found)
            return
        named = children.get(level)
        if named is not None:
            self._walk(named, levels, index + 1, [*path, level], found)

    def _collect_all(self, children: dict[str, _Node], path: list[str], at_root: bool, found: list) -> None:
        stack = [
            (child, [*path, name]) for name, child in children.items() if not (at_root and name[:1] == "$")
        ]
        while stack:
            node, node_path = stack.pop()
            if node.message is not None:
                found.append(("/".join(node_path), node.message))
            if node.children:
                stack.extend((child, [*node_path, name]) for name, child in node.children.items())

    def _prune(self, levels: list[str]) -> None:
        """Remove the now-empty branch ending at ``levels``."""
        path: list[tuple[_Node, str]] = []
        node = self._root
        for level in levels:
            child = node.children.get(level) if node.children else None
            if child is None:
                break
            path.append((node, level))
            node = child
        for parent, level in reversed(path):
            children = parent.children
            if children is None:
                break
            child = children[level]
            if child.message is not None or child.children:
                break
            del children[level]
            if not children:
                parent.children = None
