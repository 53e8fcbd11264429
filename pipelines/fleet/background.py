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
    """An event loop running on a thread of its own from :meth:`start` to :meth:`close`."""

    def __init__(self, name: str = "fleet") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)

    def run(self, coroutine: Coroutine[Any, Any, Any], timeout_s: float = 120.0) -> Any:
        """Run a coroutine on the fleet's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def call(self, function: Callable[[], Any]) -> Any:
        """Run a plain function on the fleet's loop (devices are not thread-safe)."""

        async def call() -> Any:
            return function()

        return self.run(call())


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
