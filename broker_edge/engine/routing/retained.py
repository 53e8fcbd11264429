"""Retained messages: the last retained message of each topic, found by topic filter on SUBSCRIBE.

Stored in a trie of topic levels so a wildcard SUBSCRIBE walks only the branches its filter can match
instead of testing every retained topic. The stored value is the router's message object (with its own
encoding cache), so serving a retained message to many subscribers encodes it once per variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["RetainedStore"]


class _Node:
    __slots__ = ("children", "message")

    def __init__(self) -> None:
        self.children: dict[str, _Node] | None = None
        self.message: Any = None


class RetainedStore:
    """Topic → last retained message; ``max_retained`` bounds how many topics hold one (0 = unlimited).

    ``is_expired(message)`` lets the store drop messages whose v5 Message Expiry has passed when they are
    looked up, so expiry needs no timer.
    """

    __slots__ = ("_is_expired", "_root", "count", "max_retained")

    def __init__(self, max_retained: int = 0, is_expired: Callable[[Any], bool] | None = None) -> None:
        self._root = _Node()
        self.count = 0
        self.max_retained = max_retained
        self._is_expired = is_expired

    def set(self, topic: str, message: Any) -> bool:
        """Retain ``message`` for ``topic``, replacing the previous one; False if the store is full."""
        if self.max_retained and self.count >= self.max_retained and self.get(topic) is None:
            return False
        node = self._root
        for level in topic.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Node()
            node = child
        if node.message is None:
            self.count += 1
        node.message = message
        return True

    def clear(self, topic: str) -> bool:
        """Forget the retained message of ``topic`` (a PUBLISH with an empty retained payload)."""
        levels = topic.split("/")
        node = self._root
        for level in levels:
            child = node.children.get(level) if node.children else None
            if child is None:
                return False
            node = child
        if node.message is None:
            return False
        node.message = None
        self.count -= 1
        self._prune(levels)
        return True

    def get(self, topic: str) -> Any:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level) if node.children else None
            if child is None:
                return None
            node = child
        return node.message

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
