"""Many topic filters (a topic per device, each named in ``topics``) sent to a broker as a few.

A broker filters a log listing (``GET /v1/logs?pattern=``, one request per filter) and a partition read
(``GET /v1/partitions/{p}/records?pattern=...``, every filter a parameter of one URL) by the filters it is
sent. Thousands of named topics made thousands of listing requests per batch, and a partition read's URL
longer than the broker takes (its 414 ``uri_too_long``, failing every task). Past ``MAX_SENT_FILTERS``
filters (or ``MAX_SENT_BYTES`` of them) the source sends a cover instead: a few filters matching every
topic the ``topics`` match, and maybe others (``dev/1/status`` and ``dev/2/status`` are sent as
``dev/+/status``), or none (every topic) when no few do; it then keeps only the topics ``topics`` match
itself (``TopicMatcher``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from broker_edge.protocol.topics import topic_matches

__all__ = ["MAX_SENT_BYTES", "MAX_SENT_FILTERS", "TopicMatcher", "listing", "sent_filters"]

MAX_SENT_FILTERS = 64
MAX_SENT_BYTES = 4096
"""Of filters in one request's URL (a broker takes a request target of 8190 bytes, escapes included)."""


def sent_filters(filters: Sequence[str]) -> tuple[str, ...] | None:
    """The filters to send a broker for ``filters``: themselves when few, else a cover (see the module
    docstring); None: every topic (no few filters cover them)."""
    if _fits(filters):
        return tuple(filters)
    cover = _cover(filters)
    return cover if _fits(cover) else None


def listing(filters: Sequence[str]) -> tuple[tuple[str | None, ...], TopicMatcher | None]:
    """The ``pattern`` of each listing request for ``filters`` (None: every log), and the matcher keeping
    the listed logs ``filters`` match (None: every listed log)."""
    sent = sent_filters(filters)
    if sent == tuple(filters):
        return sent, None
    return (sent if sent is not None else (None,)), TopicMatcher(filters)


def _fits(filters: Sequence[str]) -> bool:
    return (
        len(filters) <= MAX_SENT_FILTERS
        and sum(len(item.encode()) * 3 + 9 for item in filters) <= MAX_SENT_BYTES
    )


def _cover(filters: Iterable[str]) -> tuple[str, ...]:
    """Per shape (level count, ending in ``#`` or not, a ``$`` first level as it is), one filter whose
    levels are the shape's filters' where they all agree, ``+`` where they do not."""
    shapes: dict[tuple[int, bool, str | None], list[list[str]]] = {}
    for item in filters:
        levels = item.split("/")
        first = levels[0] if levels[0].startswith("$") else None  # a `+` first level matches no `$` topic
        shapes.setdefault((len(levels), levels[-1] == "#", first), []).append(levels)
    cover: list[str] = []
    for members in shapes.values():
        merged = [column[0] if len(set(column)) == 1 else "+" for column in zip(*members, strict=True)]
        cover.append("/".join(merged))
    return tuple(sorted(cover))


class TopicMatcher:
    """Whether a topic is one ``filters`` match: topic names (no wildcard) looked up, filters with one
    matched, each topic's answer kept."""

    def __init__(self, filters: Iterable[str]) -> None:
        self._names: set[str] = set()
        self._wild: list[str] = []
        for item in filters:
            if "+" in item or "#" in item:
                self._wild.append(item)
            else:
                self._names.add(item)
        self._seen: dict[str, bool] = {}

    def __call__(self, topic: str) -> bool:
        verdict = self._seen.get(topic)
        if verdict is None:
            verdict = topic in self._names or any(topic_matches(item, topic) for item in self._wild)
            self._seen[topic] = verdict
        return verdict
