"""A broker under a steady mixed load for minutes: its RSS and open files sampled, growth judged once warm.

The broker runs with its defaults (`footprint_startup.DefaultTimestone`: free ports, a temporary data
directory) against `soak_load` (devices at 1 QoS 1 message/s each, subscribers, reconnect churn). Every
`sample_s` the broker's VmRSS, open file descriptors, CPU time, the memory its tail caches hold against
their bound (its admin /metrics) and the load's counters are recorded. Warm starts at the later of the end
of the first `warmup_fraction` of the run (connecting the fleet, filling pools) and the first sample with
the tail caches full (`CACHES_FULL` of their bound): memory the caches take while they fill is not growth.
Growth is judged on the warm samples: the least-squares trend of RSS extrapolated to an hour, and the open
files of the last third of the warm samples next to those of the first third.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from bench import net, traced_broker
from bench.footprint_startup import DefaultTimestone
from bench.soak_load import LoadProcesses, SoakLoad
from bench.sysinfo import cpu_seconds, rss_bytes

MAX_HOURLY_GROWTH = 0.05
"""Growth allowed once warm: the RSS trend may add at most 5 % of the warm RSS per hour."""
CACHES_FULL = 0.95
"""The tail caches count as full from this share of their bound on (they drop whole caches when over)."""


@dataclass(frozen=True)
class SoakSample:
    """One sample of the broker and the load."""

    at_s: float
    rss: int
    open_files: int
    rss_anon: int
    """RssAnon: the broker's own memory (heap, Python objects, thread stacks)."""
    rss_file: int
    """RssFile + RssShmem: mapped files (the interpreter, its extension modules), not the broker's data."""
    threads: int
    cpu_s: float
    published: int
    acked: int
    delivered: int
    reconnects: int
    devices_connected: int
    tail_cache_bytes: int = -1
    """Memory the broker's tail caches hold (`TailCache.cost`); -1: not read."""
    tail_cache_max_bytes: int = -1
    """Their bound, `storage.tail_cache_total_bytes`."""

    @property
    def caches_full(self) -> bool:
        return (
            self.tail_cache_max_bytes > 0 and self.tail_cache_bytes >= CACHES_FULL * self.tail_cache_max_bytes
        )


@dataclass(frozen=True)
class SoakResult:
    """The samples of one soak and what they say about growth once warm."""

    load: SoakLoad
    duration_s: float
    warmup_s: float
    samples: list[SoakSample]
    broker_config: str = ""

    @property
    def caches_full_at(self) -> float | None:
        """Seconds into the soak of the first sample with the tail caches full (None: they never filled)."""
        return next((s.at_s for s in self.samples if s.caches_full), None)

    @property
    def warm_from_s(self) -> float | None:
        """Where the warm window starts: past the warm-up and with the caches full (None: they never filled,
        there is no warm window)."""
        full_at = self.caches_full_at
        return None if full_at is None else max(self.warmup_s, full_at)

    @property
    def warm(self) -> list[SoakSample]:
        start = self.warm_from_s
        return [] if start is None else [s for s in self.samples if s.at_s >= start]

    traced: list[str] = field(default_factory=list)
    """What grew between the two `tracemalloc` snapshots of a traced soak (`trace_at`), largest first."""

    @property
    def rss_trend_per_hour(self) -> float:
        """Bytes per hour of the least-squares line through the warm RSS samples."""
        return _slope([(s.at_s, s.rss) for s in self.warm]) * 3600

    @property
    def anon_trend_per_hour(self) -> float:
        """Bytes per hour of the least-squares line through the warm RssAnon samples."""
        return _slope([(s.at_s, s.rss_anon) for s in self.warm]) * 3600

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
    warmup_fraction: float = 0.5,
    cpus: tuple[set[int] | None, set[int] | None] = (None, None),
    storage: dict[str, int] | None = None,
    trace_at: tuple[float, float, float] | None = None,
    transport: str | None = None,
    log=print,
) -> SoakResult:
    """Run the soak for `duration_s` seconds (broker on `cpus[0]`, load on `cpus[1]`; `storage`: settings
    other than the defaults).

    `trace_at` (start, first, second), seconds into the soak: run the broker under `bench.traced_broker`,
    start `tracemalloc` at `start` (none if it is negative) and take snapshots at `first` and `second`;
    what grew between them is in the result's `traced`. Tracing slows the broker and its traces take
    memory: a traced soak finds what grows, an untraced one measures RSS. Without tracing the snapshots
    are of the objects by type and of the C heap, which cost the broker a garbage collection each.
    """
    control = Path(tempfile.mkdtemp(prefix="soak-trace-")) if trace_at else None
    admin_port = net.free_port()
    broker = DefaultTimestone(storage=storage, traced=control, transport=transport, admin_port=admin_port)
    broker.prepare()
    broker_cpus, load_cpus = cpus
    requests = [
        (at, name)
        for at, name in zip(trace_at or (), ("start", "snap-first", "snap-second"), strict=False)
        if at >= 0
    ]
    with broker.running(broker_cpus) as running:
        spec = load or SoakLoad(port=running.port)
        if spec.port != running.port:
            spec = SoakLoad(**{**spec.__dict__, "port": running.port})
        samples: list[SoakSample] = []
        with LoadProcesses(spec, load_cpus) as processes:
            started = time.monotonic()
            next_sample = started
            while (now := time.monotonic()) - started <= duration_s:
                if requests and now - started >= requests[0][0] and control is not None:
                    traced_broker.request(control, requests.pop(0)[1])
                if now >= next_sample:
                    samples.append(_sample(running.pid, admin_port, now - started, processes))
                    next_sample += sample_s
                    if len(samples) % max(1, int(60 / sample_s)) == 0:
                        last = samples[-1]
                        log(
                            f"  soak {last.at_s:5.0f} s: RSS {last.rss / 1e6:.1f} MB, "
                            f"{last.open_files} open files, {last.devices_connected} devices connected, "
                            f"tail caches {last.tail_cache_bytes / 1e6:.1f} of "
                            f"{last.tail_cache_max_bytes / 1e6:.1f} MB"
                        )
                time.sleep(min(0.2, max(0.0, next_sample - time.monotonic())))
    traced = traced_growth(control) if control is not None else []
    return SoakResult(spec, duration_s, duration_s * warmup_fraction, samples, broker.config_notes(), traced)


def traced_growth(control: Path, top: int = 15) -> list[str]:
    """The allocation sites that grew most between the traced broker's two snapshots, with the C heap's
    figures (glibc) at each snapshot."""
    lines = []
    for label in ("first", "second"):
        stats = control / f"{label}.malloc"
        if stats.exists():
            lines.append(f"{label}: {stats.read_text()}")
    types = [control / f"{label}.types" for label in ("first", "second")]
    if all(path.exists() for path in types):
        before_types, after_types = (json.loads(path.read_text()) for path in types)
        grown_types = sorted(
            ((after_types.get(name, 0) - before_types.get(name, 0), name) for name in after_types),
            reverse=True,
        )
        lines.append(
            "objects tracked by the garbage collector, by type, that grew most: "
            + ", ".join(f"{name} {diff:+,}" for diff, name in grown_types[:10] if diff > 0)
        )
    first, second = control / "first.snapshot", control / "second.snapshot"
    if not (first.exists() and second.exists()):
        return lines
    before, after = tracemalloc.Snapshot.load(str(first)), tracemalloc.Snapshot.load(str(second))
    before = before.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    after = after.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    grown = after.compare_to(before, "traceback")
    lines.append(
        f"traced: {sum(s.size for s in before.statistics('filename')):,} -> "
        f"{sum(s.size for s in after.statistics('filename')):,} bytes, "
        f"{sum(s.size_diff for s in grown):+,} bytes"
    )
    for stat in grown[:top]:
        frames = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(stat.traceback[-4:]))
        lines.append(f"{stat.size_diff:+,} bytes, {stat.count_diff:+,} blocks: {frames}")
    return lines


def _sample(pid: int, admin_port: int, at_s: float, processes: LoadProcesses) -> SoakSample:
    totals = processes.totals()
    caches = _metrics(admin_port, ("tail_cache_bytes", "tail_cache_max_bytes"))
    return SoakSample(
        at_s=at_s,
        rss=rss_bytes(pid),
        open_files=_open_files(pid),
        **_status(pid),
        cpu_s=cpu_seconds(pid),
        published=totals["published"],
        acked=totals["acked"],
        delivered=totals["delivered"],
        reconnects=totals["reconnects"],
        devices_connected=processes.by_role("devices")["connected"],
        tail_cache_bytes=caches.get("tail_cache_bytes", -1),
        tail_cache_max_bytes=caches.get("tail_cache_max_bytes", -1),
    )


def _metrics(admin_port: int, names: tuple[str, ...]) -> dict[str, int]:
    """The broker's gauges `timestone_broker_<name>` from its admin /metrics (those it answered)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    wanted = {f"timestone_broker_{name}": name for name in names}
    found = {}
    for line in text.splitlines():
        metric, _, value = line.partition(" ")
        if metric in wanted:
            found[wanted[metric]] = int(float(value))
    return found


def _status(pid: int) -> dict[str, int]:
    """RssAnon, RssFile (+ RssShmem) and Threads of the broker process, from /proc/<pid>/status."""
    fields: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile", "RssShmem", "Threads"):
                fields[name] = int(value.split()[0])
    except OSError:
        pass
    return {
        "rss_anon": fields.get("RssAnon", 0) * 1024,
        "rss_file": (fields.get("RssFile", 0) + fields.get("RssShmem", 0)) * 1024,
        "threads": fields.get("Threads", 0),
    }


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
