"""Process tuning of a long-running broker: CPython's cyclic garbage collector.

A broker holds a large heap that lives as long as the process (modules, the subscription trie, log indexes,
sessions) and allocates short-lived objects per publish, many of which outlive a few event-loop iterations (a
logged publish waits for its window to be durable). With the interpreter's defaults a young collection runs
every 700 allocations, those survivors are promoted, and every full collection walks the whole heap again (a
share of the broker's CPU under load: docs/commitlog.md). Freezing the heap built at
start (`gc.freeze`) takes it out of every later collection, and a larger young-generation threshold makes
collections rarer. Reference counting still frees nearly everything at once; the collector only finds cycles,
a little later.
"""

from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

from broker_edge.config.loader import ConfigError

__all__ = ["RuntimeConfig", "tune_garbage_collector"]

log = logging.getLogger(__name__)


_MAX_GC_THRESHOLD = 2**31 - 1


@dataclass
class RuntimeConfig:
    """The ``runtime`` section."""

    event_loop: str = "uvloop"
    """The event loop the broker runs on: ``uvloop`` or ``asyncio`` (the standard library's)."""
    gc_freeze_at_start: bool = True
    """Once started, move every object alive into the collector's permanent generation (`gc.freeze`), so
    that collections no longer walk the start-up heap."""
    gc_young_threshold: int = 100_000
    """Allocations between two collections of the youngest generation (Python's default is 700; 0 keeps the
    interpreter's setting). At 100,000 a fleet's messages in flight (one per device, between its read and
    its PUBACK) are not walked again and again by young collections (2-3 % of the broker's CPU at 20,000
    with 10,000 devices); the first collection after the offsets API loads pyarrow walks what it loaded at
    once, about 30 ms once (bench/results/ingest.md, 2026-12-01)."""

    def __post_init__(self) -> None:
        if self.event_loop not in ("uvloop", "asyncio"):
            raise ConfigError("event_loop", f"expected uvloop or asyncio, got {self.event_loop!r}")
        if isinstance(self.gc_young_threshold, bool) or not isinstance(self.gc_young_threshold, int):
            raise ConfigError("gc_young_threshold", f"must be an integer, got {self.gc_young_threshold!r}")
        if self.gc_young_threshold < 0:
            raise ConfigError("gc_young_threshold", f"must be >= 0, got {self.gc_young_threshold!r}")
        if self.gc_young_threshold > _MAX_GC_THRESHOLD:  # what gc.set_threshold takes (a C int)
            raise ConfigError(
                "gc_young_threshold", f"must be at most {_MAX_GC_THRESHOLD}, got {self.gc_young_threshold!r}"
            )


def tune_garbage_collector(config: RuntimeConfig) -> None:
    """Apply `config` to this process (call once the broker has started: its heap is then built)."""
    if config.gc_young_threshold:
        _young, middle, old = gc.get_threshold()
        gc.set_threshold(config.gc_young_threshold, middle, old)
    if config.gc_freeze_at_start:
        gc.collect()
        gc.freeze()
    log.debug(
        "garbage collector: thresholds %s, %d objects frozen", gc.get_threshold(), gc.get_freeze_count()
    )
