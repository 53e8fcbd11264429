"""A fleet on its own event-loop thread, for synchronous callers (the demo, tests, benchmarks)."""

from __future__ import annotations

from pipelines.fleet.device import DeviceBehaviour
from pipelines.fleet.fleet import Fleet, FleetSpec
from pipelines.loop_thread import LoopThread


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
