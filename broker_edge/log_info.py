"""The public state of one log: what the store reports, the offsets API lists and its clients decode.

One type for all of them, so what the store lists is what a reader gets. It lives apart from the storage
engine and the offsets API, at the bottom of the broker's layers: the store reports it, and a reader of the
API (the Spark source on an executor, a peer broker) gets it without loading the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LogInfo"]


@dataclass(slots=True, frozen=True)
class LogInfo:
    """The public state of one log (what the offsets API lists)."""

    topic: str
    start_offset: int
    end_offset: int
    bytes: int
    last_append_ms: int | None
