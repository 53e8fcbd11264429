"""A fleet of simulated devices in one asyncio process, connected at a bounded rate."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass, field

from pipelines.actions.buckets import DEFAULT_BUCKETS
from pipelines.fleet.device import TERMINAL_STATES, DeviceBehaviour, SimulatedDevice


@dataclass
class FleetSpec:
    """Which devices to simulate and where they connect."""

    brokers: list[tuple[str, int]]
    count: int = 10
    id_prefix: str = "dev"
    groups: list[str] = field(default_factory=lambda: ["canary", "fleet"])
    buckets: int = DEFAULT_BUCKETS
    """Device buckets of the fleet (``pipelines/actions/buckets.py``), as the actions job's."""
    connects_per_second: float = 150.0
    """Stay under the broker's new-connection rate limit (200/s by default)."""
    seed: int = 7
    first_index: int = 0
    """Index of this spec's first device in the whole fleet (a fleet split over processes)."""
    fleet_size: int | None = None
    """Devices in the whole fleet (default ``count``): sets the width of the numbers in device ids."""
    source_addresses: list[str] = field(default_factory=list)
    """Local addresses devices connect from, in turn (empty: the system picks)."""
    failover: bool = False
    """The brokers are members of one cluster: a device that cannot connect to its broker tries the next."""

    def device_id(self, index: int) -> str:
        width = max(5, len(str(self.fleet_size or self.count)))
        separator = "" if self.id_prefix.endswith(("-", "_", ".")) else "-"
        return f"{self.id_prefix}{separator}{index:0{width}d}"


def _others(brokers: list[tuple[str, int]], index: int) -> list[tuple[str, int]]:
    """The brokers after ``index``, in list order, wrapping around."""
    return [brokers[(index + n) % len(brokers)] for n in range(1, len(brokers))]


class Fleet:
    """Starts ``spec.count`` devices (device ``i`` on broker ``i % len(brokers)``) and tracks them."""

    def __init__(self, spec: FleetSpec, behaviour: DeviceBehaviour | None = None) -> None:
        if not spec.brokers:
            raise ValueError("a fleet needs at least one broker")
        self.spec = spec
        self.behaviour = behaviour or DeviceBehaviour()
        self.stats: Counter = Counter()
        self.connect_error: str | None = None
        """Why the last device that failed to connect at start failed (None: none failed)."""
        rng = random.Random(spec.seed + spec.first_index)
        sources: list[str | None] = list(spec.source_addresses) or [None]
        self.devices = [
            SimulatedDevice(
                device_id=spec.device_id(i),
                group=spec.groups[i % len(spec.groups)],
                buckets=spec.buckets,
                broker=spec.brokers[i % len(spec.brokers)],
                fallbacks=_others(spec.brokers, i % len(spec.brokers)) if spec.failover else (),
                behaviour=self.behaviour,
                rng=random.Random(rng.random()),
                stats=self.stats,
                source_address=sources[i % len(sources)],
            )
            for i in range(spec.first_index, spec.first_index + spec.count)
        ]

    async def start(self) -> None:
        """Connect every device, ``connects_per_second`` at a time, and wait until all are subscribed."""
        batch = max(1, int(self.spec.connects_per_second / 10))
        for first in range(0, len(self.devices), batch):
            group = self.devices[first : first + batch]
            results = await asyncio.gather(*(device.start() for device in group), return_exceptions=True)
            for device, result in zip(group, results, strict=True):
                if isinstance(result, BaseException):  # refused or timed out: retry like a real device
                    self.stats["connect_failures"] += 1
                    self.connect_error = str(result) or type(result).__name__
                    device.retry_later(result)
            if first + batch < len(self.devices):
                await asyncio.sleep(0.1)

    async def stop(self) -> None:
        await asyncio.gather(*(device.stop() for device in self.devices), return_exceptions=True)

    def states(self, action_id: str) -> Counter:
        """How many devices are in each state for one action (devices that never saw it are absent)."""
        return Counter(
            device.actions[action_id].state for device in self.devices if action_id in device.actions
        )

    def finished(self, action_id: str) -> int:
        """Devices that reached a terminal state for ``action_id``."""
        return sum(count for state, count in self.states(action_id).items() if state in TERMINAL_STATES)

    def connected(self) -> int:
        return sum(1 for device in self.devices if device.client is not None and device.client.connected)
