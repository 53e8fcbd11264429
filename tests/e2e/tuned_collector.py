"""A test process's garbage collector tuned as a broker process tunes its own (the ``runtime`` section).

A broker run in a thread of a test process shares that process's collector. A pytest worker's heap, after
hundreds of tests, is larger than a broker's and is not frozen: a full collection of it takes the broker's
event loop for 0.2 s or more whatever it runs (two in one replay flood test on this 2-core machine). A
broker process freezes the heap it starts with (`tune_garbage_collector`), so a bound on the loop's stalls
is measured with this process's collector tuned the same way.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from broker_edge.process.gc_tuning import RuntimeConfig, tune_garbage_collector


@contextmanager
def collector_tuned_as_a_broker() -> Iterator[None]:
    """This process's heap frozen and its young collections made rarer, as a broker's; both undone after."""
    threshold = gc.get_threshold()
    tune_garbage_collector(RuntimeConfig())
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
