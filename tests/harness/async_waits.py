"""A wait for a condition on the running event loop, for tests that drive asyncio code in a loop of their
own (the synchronous suites wait with ``local_cluster.wait_until``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "condition") -> None:
    """Poll ``condition`` between loop turns until it holds; fail naming ``what`` after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)
