"""An event loop on a thread of its own, for synchronous callers of asyncio clients (the simulated fleet, the
actions job's publisher, tests)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["LoopThread"]


class LoopThread:
    """An event loop running on a thread of its own from :meth:`start` to :meth:`close`, which ends it as
    ``asyncio.run`` ends its loop: the tasks still on it (a device's reconnect under way, say) cancelled
    and awaited, its asynchronous generators closed, the loop closed."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.ident is None:  # never started: nothing ran on the loop
            self.loop.close()
            return
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            try:
                _end_remaining_tasks(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float | None = 120.0) -> Any:
        """Run a coroutine on the loop and wait for its result (at most ``timeout_s``; None: however long
        it takes)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def call(self, function: Callable[[], Any]) -> Any:
        """Run a plain function on the loop (what lives on it, a fleet's devices say, is not thread-safe)."""

        async def call() -> Any:
            return function()

        return self.run(call())


def _end_remaining_tasks(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks left on the stopped ``loop`` and run it until each has ended (a task dropped
    unfinished would never run its ``finally`` and be reported destroyed while pending)."""
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
