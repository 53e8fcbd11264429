"""A fleet (or any asyncio client) on its own event-loop thread, for synchronous callers (the demo, tests,
benchmarks)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import Fleet, FleetSpec


class LoopThread:
    """An event loop running on a thread of its own from :meth:`start` to :meth:`close`, which ends it as
    ``asyncio.run`` ends its loop: the tasks still on it (a device's reconnect under way, say) cancelled
    and awaited, its asynchronous generators closed, the loop closed."""

    def __init__(self, name: str = "fleet") -> None:
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

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 120.0) -> Any:
        """Run a coroutine on the fleet's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def call(self, function: Callable[[], Any]) -> Any:
        """Run a plain function on the fleet's loop (devices are not thread-safe)."""

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


class BackgroundFleet(LoopThread):
    """Start with ``with BackgroundFleet(spec, behaviour) as fleet:``; devices run until the block ends."""

    def __init__(self, spec: FleetSpec, behaviour: DeviceBehaviour) -> None:
        super().__init__("fleet")
        self.fleet = Fleet(spec, behaviour)

    async def on_start(self) -> None:
        """Hook for subclasses: runs on the loop before the devices connect."""

    async def on_stop(self) -> None:
        """Hook for subclasses: runs on the loop after the devices disconnected."""

    async def _start(self) -> None:
        await self.on_start()
        await self.fleet.start()

    async def _stop(self) -> None:
        await self.fleet.stop()
        await self.on_stop()

    def __enter__(self) -> BackgroundFleet:
        self.start()
        self.run(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.run(self._stop())
        finally:
            self.close()
