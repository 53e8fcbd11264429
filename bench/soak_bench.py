"""A broker under a steady mixed load for minutes: its RSS and open files sampled, growth judged once warm.

The broker runs with its defaults (`footprint_startup.DefaultTimestone`: free ports, a temporary data
directory) against `soak_load` (devices at 1 QoS 1 message/s each, subscribers, reconnect churn). Every
`sample_s` the broker's VmRSS, open file descriptors, CPU time and the load's counters are recorded. The
first `warmup_fraction` of the run is warm-up (connecting the fleet, filling caches and pools); growth is
judged on the rest: the least-squares trend of RSS extrapolated to an hour, and the open files of the last
third of the warm samples next to those of the first third.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from bench.footprint_startup import DefaultTimestone
from bench.soak_load import LoadProcesses, SoakLoad
from bench.sysinfo import cpu_seconds, rss_bytes

MAX_HOURLY_GROWTH = 0.05
"""Growth allowed once warm: the RSS trend may add at most 5 % of the warm RSS per hour."""


@dataclass(frozen=True)
class SoakSample:
    """One sample of the broker and the load."""

    at_s: float
    rss: int
    open_files: int
    cpu_s: float
    published: int
    acked: int
    delivered: int
    reconnects: int
    devices_connected: int


@dataclass(frozen=True)
class SoakResult:
    """The samples of one soak and what they say about growth once warm."""

    load: SoakLoad
    duration_s: float
    warmup_s: float
    samples: list[SoakSample]
    broker_config: str = ""

    @property
    def warm(self) -> list[SoakSample]:
        return [s for s in self.samples if s.at_s >= self.warmup_s]

    @property
    def rss_trend_per_hour(self) -> float:
        """Bytes per hour of the least-squares line through the warm RSS samples."""
        return _slope([(s.at_s, s.rss) for s in self.warm]) * 3600

    @property
    def warm_rss(self) -> int:
        return self.warm[0].rss if self.warm else 0

    @property
    def rss_grows(self) -> bool:
        return self.rss_trend_per_hour > MAX_HOURLY_GROWTH * self.warm_rss

    @property
    def open_files_grow(self) -> bool:
        """The median of open files over the last third of the warm samples above that of the first third
        by more than the devices reconnecting per second (those away at a given moment make it wander)."""
        warm = self.warm
        third = len(warm) // 3
        if third < 1:
            return False
        first = statistics.median(s.open_files for s in warm[:third])
        last = statistics.median(s.open_files for s in warm[-third:])
        return last > first + self.load.churn_per_s

    def rate(self, field: str) -> float:
        """Per-second rate of a counter over the warm period."""
        warm = self.warm
        if len(warm) < 2 or warm[-1].at_s <= warm[0].at_s:
            return 0.0
        return (getattr(warm[-1], field) - getattr(warm[0], field)) / (warm[-1].at_s - warm[0].at_s)


def run_soak(
    duration_s: float,
    load: SoakLoad | None = None,
    sample_s: float = 5.0,
    warmup_fraction: float = 0.2,
    cpus: tuple[set[int] | None, set[int] | None] = (None, None),
    storage: dict[str, int] | None = None,
    log=print,
) -> SoakResult:
    """Run the soak for `duration_s` seconds (broker on `cpus[0]`, load on `cpus[1]`; `storage`: settings
    other than the defaults)."""
    broker = DefaultTimestone(storage=storage)
    broker.prepare()
    broker_cpus, load_cpus = cpus
    with broker.running(broker_cpus) as running:
        spec = load or SoakLoad(port=running.port)
        if spec.port != running.port:
            spec = SoakLoad(**{**spec.__dict__, "port": running.port})
        samples: list[SoakSample] = []
        with LoadProcesses(spec, load_cpus) as processes:
            started = time.monotonic()
            next_sample = started
            while (now := time.monotonic()) - started <= duration_s:
                if now >= next_sample:
                    samples.append(_sample(running.pid, now - started, processes))
                    next_sample += sample_s
                    if len(samples) % max(1, int(60 / sample_s)) == 0:
                        last = samples[-1]
                        log(
                            f"  soak {last.at_s:5.0f} s: RSS {last.rss / 1e6:.1f} MB, "
                            f"{last.open_files} open files, {last.devices_connected} devices connected"
                        )
                time.sleep(min(0.2, max(0.0, next_sample - time.monotonic())))
    return SoakResult(spec, duration_s, duration_s * warmup_fraction, samples, broker.config_notes())


def _sample(pid: int, at_s: float, processes: LoadProcesses) -> SoakSample:
    totals = processes.totals()
    return SoakSample(
        at_s=at_s,
        rss=rss_bytes(pid),
        open_files=_open_files(pid),
        cpu_s=cpu_seconds(pid),
        published=totals["published"],
        acked=totals["acked"],
        delivered=totals["delivered"],
        reconnects=totals["reconnects"],
        devices_connected=processes.by_role("devices")["connected"],
    )


def _open_files(pid: int) -> int:
    try:
        return len(os.listdir(Path(f"/proc/{pid}/fd")))
    except OSError:
        return 0


def _slope(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
