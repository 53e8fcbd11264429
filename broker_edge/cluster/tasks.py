"""Stopping the cluster's background tasks for sure.

On Python 3.11 ``asyncio.wait_for`` loses a cancellation that arrives just as the awaited thing completes
(and gRPC may turn one into an error of the call), so a task in a loop can survive one ``cancel()``.
``stop_task`` cancels until the task is done.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

__all__ = ["stop_task"]

log = logging.getLogger("broker_edge.cluster")


async def stop_task(task: asyncio.Task[Any] | None) -> None:
    """Cancel ``task`` (again and again, if it swallows a cancellation) and wait until it has ended."""
    if task is None:
        return
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.1)
    if not task.cancelled() and task.exception() is not None:
        log.error("%s had failed", task.get_name(), exc_info=task.exception())
