"""A fleet split over several processes, so that the simulator is not what limits a benchmark.

Each process runs its slice of the devices (consecutive indices, so device ids are the same as in one
process) on its own event loop, raises its open-files limit to what the system allows, and answers requests
over a pipe: how many devices are connected, per-device action times, the CPU it has used.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import multiprocessing as mp
import os
import resource
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection

from pipelines.fleet.device import TERMINAL_STATES, DeviceBehaviour
from pipelines.fleet.fleet import Fleet, FleetSpec

PORTS_PER_SOURCE_ADDRESS = 20_000
"""Connections given to one loopback source address (Linux offers about 28,000 ephemeral ports)."""


def loopback_sources(count: int) -> list[str]:
    """Enough source addresses for ``count`` connections to one broker port: 127.0.0.2, 127.0.0.3, ...

    Not 127.0.0.1: the fleet's ephemeral ports then never collide with servers (or tests) that pick a
    free port on 127.0.0.1 while the fleet is connected.
    """
    return [f"127.0.0.{2 + i}" for i in range(max(1, math.ceil(count / PORTS_PER_SOURCE_ADDRESS)))]


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit; returns the limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass(frozen=True, slots=True)
class DeviceTimes:
    """One device's view of one action: epoch seconds it got the message and sent its final report."""

    device_id: str
    received_at: float | None
    finished_at: float | None
    state: str | None
    seq: int = 0
    """The sequence number of its latest report of the action (one per change of state)."""


def _slices(spec: FleetSpec, procs: int) -> list[FleetSpec]:
    """Consecutive slices of the fleet, each connecting at its share of the fleet's connection rate."""
    size = math.ceil(spec.count / procs)
    return [
        replace(
            spec,
            first_index=spec.first_index + first,
            count=min(size, spec.count - first),
            fleet_size=spec.fleet_size or spec.count,
            connects_per_second=spec.connects_per_second / procs,
        )
        for first in range(0, spec.count, size)
    ]


def _worker(spec: FleetSpec, behaviour: DeviceBehaviour, pipe: Connection) -> None:
    raise_open_files_limit()

    async def main() -> None:
        fleet = Fleet(spec, behaviour)
        await fleet.start()
        loop = asyncio.get_running_loop()
        while True:
            request, argument = await loop.run_in_executor(None, pipe.recv)
            if request == "status":
                pipe.send((fleet.connected(), dict(fleet.stats), sum(os.times()[:2])))
            elif request == "times":
                pipe.send([_times(device, argument) for device in fleet.devices])
            elif request == "stop":
                await fleet.stop()
                pipe.send("stopped")
                return

    asyncio.run(main())


def _times(device, action_id: str) -> DeviceTimes:
    progress = device.actions.get(action_id)
    return DeviceTimes(
        device.device_id,
        device.received_at.get(action_id),
        device.finished_at.get(action_id),
        progress.state if progress else None,
        progress.seq if progress else 0,
    )


class FleetProcesses:
    """``spec.count`` devices over ``procs`` processes; use as a context manager or call start/stop."""

    def __init__(self, spec: FleetSpec, behaviour: DeviceBehaviour, procs: int = 1) -> None:
        if procs < 1:
            raise ValueError(f"procs must be >= 1, got {procs}")
        self.spec = spec
        self.behaviour = behaviour
        self.slices = _slices(spec, procs)
        self._context = mp.get_context("spawn")
        self._processes: list = []
        self._pipes: list[Connection] = []

    def start(self) -> FleetProcesses:
        for fleet_slice in self.slices:
            ours, theirs = self._context.Pipe()
            process = self._context.Process(
                target=_worker, args=(fleet_slice, self.behaviour, theirs), name="fleet", daemon=True
            )
            process.start()
            self._processes.append(process)
            self._pipes.append(ours)
        return self

    def _ask(self, request: str, argument: object = None) -> list:
        for pipe in self._pipes:
            pipe.send((request, argument))
        return [pipe.recv() for pipe in self._pipes]

    def status(self) -> tuple[int, dict[str, int], float]:
        """Devices connected now, the fleet's counters, and CPU seconds its processes have used."""
        connected, cpu = 0, 0.0
        stats: dict[str, int] = {}
        for count, counters, seconds in self._ask("status"):
            connected += count
            cpu += seconds
            for key, value in counters.items():
                stats[key] = stats.get(key, 0) + value
        return connected, stats, cpu

    def times(self, action_id: str) -> list[DeviceTimes]:
        """Every device's receive and final-report time for ``action_id`` (None where it has not yet)."""
        return [times for answer in self._ask("times", action_id) for times in answer]

    def finished(self, action_id: str) -> int:
        return sum(1 for t in self.times(action_id) if t.state in TERMINAL_STATES)

    def stop(self) -> None:
        with contextlib.suppress(OSError, EOFError):
            self._ask("stop")
        for process in self._processes:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()

    def __enter__(self) -> FleetProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
