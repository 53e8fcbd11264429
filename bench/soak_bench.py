"""A broker under a steady mixed load for minutes: its memory and open files sampled, growth judged once warm.

The broker runs with its defaults (`footprint_startup.DefaultTimestone`: free ports, a temporary data
directory holding the devices' logs at offsets a broker reaches after days, `LOGS_FROM`) against
`soak_load` (devices at 1 QoS 1 message/s each, subscribers, reconnect churn). Every `sample_s` the broker's
VmRSS, open file descriptors, CPU time and, from its admin /metrics, the memory its tail caches hold against
their bound, its sessions, its RSS right after its last heap trim, the C heap's bytes in use and Python's
allocated blocks are recorded, with the load's counters.

Warm starts at the first sample after the warm-up (`warmup_fraction` of the run, fixed before it starts)
with the tail caches full (`CACHES_FULL` of their bound), the map of sessions steady (within `STEADY_SHARE`
of its size `STEADY_S` earlier) and nearly every device back once (`RETURNED_SHARE` of them have dropped
their connection and resumed their session): memory the caches and maps take while they fill is not
growth, and neither is the heaps settling in the first minutes (the free space inside glibc's heap and
Python's arenas grows while what is in use stays flat, then keeps to a level). The warm window is not
chosen from the series it judges: a broker whose memory never settles is judged on it, and fails.

Growth is judged on what the heap holds, not on the free pages that come and go between trims: the RSS
read right after each trim of the C heap (one point per trim), by a trend that a sawtooth does not tilt:
the median of the last third of the warm points minus that of the first third, over the time between
the two thirds' middles, extrapolated to an hour (`robust_trend`). The raw RSS stays in every table, with
the same trend and the least-squares line through it; open files compare the same thirds.
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
from bench.soak_load import LoadProcesses, SoakLoad, device_topic
from bench.sysinfo import cpu_seconds, rss_bytes

MAX_HOURLY_GROWTH = 0.05
"""Growth allowed once warm: the RSS trend may add at most 5 % of the warm RSS per hour."""
CACHES_FULL = 0.95
"""The tail caches count as full from this share of their bound on (they drop whole caches when over)."""
STEADY_S = 60.0
"""The map of sessions is steady when its size is within `STEADY_SHARE` of its size this long before."""
STEADY_SHARE = 0.01
LOGS_FROM = 1_000_000
"""The devices' logs exist when the soak starts and continue at this offset (`footprint_startup.seed_logs`):
the soak is of a broker whose store has been written to for days (at one message a second, about eleven),
not of one filling a fresh store, whose every log first holds offsets CPython caches as small integers."""
RETURNED_SHARE = 0.99
"""Warm once this share of the devices have dropped their connection and resumed their session."""
MIN_POINTS = 6
"""Fewest points a trend is drawn from: two in each third."""
GAUGES = (
    "tail_cache_bytes",
    "tail_cache_max_bytes",
    "sessions",
    "heap_trims",
    "rss_after_trim_bytes",
    "heap_in_use_bytes",
    "python_allocated_blocks",
)
"""The broker's gauges each sample reads from its admin /metrics (`timestone_broker_<name>`, summed over
their labels)."""


@dataclass(frozen=True)
class Trend:
    """A trend per hour from the medians of the first and last third of a series (see `robust_trend`)."""

    per_hour: float
    first: float
    """Median of the first third."""
    last: float
    """Median of the last third."""
    spread: float
    """The larger of the two thirds' ranges (max - min): how much the series moves at a steady level."""
    points: int


def robust_trend(points: list[tuple[float, float]]) -> Trend | None:
    """The change per hour between the medians of the first and last third of `points` (time in seconds,
    value), over the time between the medians of those thirds' times; None with fewer than `MIN_POINTS`."""
    third = len(points) // 3
    if len(points) < MIN_POINTS:
        return None
    head, tail = points[:third], points[-third:]
    first, last = statistics.median(v for _, v in head), statistics.median(v for _, v in tail)
    elapsed = statistics.median(t for t, _ in tail) - statistics.median(t for t, _ in head)
    spread = max(max(v for _, v in part) - min(v for _, v in part) for part in (head, tail))
    per_hour = (last - first) / elapsed * 3600 if elapsed > 0 else 0.0
    return Trend(per_hour, first, last, spread, len(points))


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
    sessions: int = -1
    """Sessions the broker holds, online and offline; -1: not read."""
    heap_trims: int = -1
    """Trims of the C heap the broker has done; -1: not read."""
    rss_after_trim: int = 0
    """The broker's RSS right after its last heap trim; 0: no trim yet (or not read)."""
    heap_in_use: int = -1
    """Bytes the C heap has handed out and not got back (glibc `mallinfo2`); -1: not known."""
    python_blocks: int = -1
    """Python's allocated blocks (`sys.getallocatedblocks`); -1: not read."""
    devices_returned: int = -1
    """Devices that have dropped their connection and resumed their session at least once; -1: not read."""

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

    def steady_at(self, field: str) -> float | None:
        """Seconds into the soak of the first sample whose `field` is within `STEADY_SHARE` of its value
        `STEADY_S` before (None: never, or not read)."""
        for sample in self.samples:
            earlier = [s for s in self.samples if s.at_s <= sample.at_s - STEADY_S]
            value = getattr(sample, field)
            if earlier and value > 0:
                before = getattr(earlier[-1], field)
                if abs(value - before) <= STEADY_SHARE * max(before, 1):
                    return sample.at_s
        return None

    @property
    def sessions_steady_at(self) -> float | None:
        """Where the map of sessions is steady (`steady_at`)."""
        return self.steady_at("sessions")

    @property
    def returned_at(self) -> float | None:
        """Seconds into the soak of the first sample where `RETURNED_SHARE` of the devices have come back once
        (None: never; 0 where the load does not report it)."""
        if not self.samples or self.samples[0].devices_returned < 0:
            return 0.0
        wanted = RETURNED_SHARE * self.load.devices
        return next((s.at_s for s in self.samples if s.devices_returned >= wanted), None)

    @property
    def warm_from_s(self) -> float | None:
        """Where the warm window starts: past the warm-up, with the caches full, the sessions steady and the
        devices back once (None: one of them never happened, there is no warm window)."""
        full_at, steady_at, returned_at = self.caches_full_at, self.sessions_steady_at, self.returned_at
        if full_at is None or steady_at is None or returned_at is None:
            return None
        start = max(self.warmup_s, full_at, steady_at, returned_at)
        return next((s.at_s for s in self.samples if s.at_s >= start and s.caches_full), None)

    @property
    def warm(self) -> list[SoakSample]:
        start = self.warm_from_s
        return [] if start is None else [s for s in self.samples if s.at_s >= start]

    traced: list[str] = field(default_factory=list)
    """What grew between the two `tracemalloc` snapshots of a traced soak (`trace_at`), largest first."""

    @property
    def rss_least_squares_per_hour(self) -> float:
        """Bytes per hour of the least-squares line through the warm raw RSS samples (for comparison: the
        trims' sawtooth tilts it)."""
        return _slope([(s.at_s, s.rss) for s in self.warm]) * 3600

    def trend(self, measure: str) -> Trend | None:
        """`robust_trend` of a sample field over the warm window: for `rss_after_trim` one point per trim
        (the samples where `heap_trims` moved on), for the others every warm sample."""
        warm = self.warm
        if measure == "rss_after_trim":
            warm = [
                s
                for i, s in enumerate(warm)
                if s.rss_after_trim > 0 and (i == 0 or s.heap_trims != warm[i - 1].heap_trims)
            ]
        return robust_trend([(s.at_s, getattr(s, measure)) for s in warm])

    @property
    def growth(self) -> Trend | None:
        """The trend the verdict uses: of the RSS after each trim where the broker reports it (the raw RSS
        otherwise)."""
        reported = any(s.rss_after_trim > 0 for s in self.samples)
        return self.trend("rss_after_trim" if reported else "rss")

    @property
    def warm_rss(self) -> int:
        """The median raw RSS of the warm window."""
        return int(statistics.median(s.rss for s in self.warm)) if self.warm else 0

    @property
    def allowed_per_hour(self) -> float:
        return MAX_HOURLY_GROWTH * self.warm_rss

    @property
    def rss_grows(self) -> bool:
        growth = self.growth
        return growth is not None and growth.per_hour > self.allowed_per_hour

    @property
    def open_files_grow(self) -> bool:
        """The median of open files over the last third of the warm samples above that of the first third
        by more than the devices reconnecting per second (those away at a given moment make it wander)."""
        trend = self.trend("open_files")
        return trend is not None and trend.last > trend.first + self.load.churn_per_s

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
    devices = (load or SoakLoad(port=0)).devices
    broker = DefaultTimestone(
        storage=storage,
        traced=control,
        transport=transport,
        admin_port=admin_port,
        logs=[device_topic(index) for index in range(devices)],
        logs_from=LOGS_FROM,
    )
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
    gauges = metrics(admin_port, GAUGES)
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
        tail_cache_bytes=gauges.get("tail_cache_bytes", -1),
        tail_cache_max_bytes=gauges.get("tail_cache_max_bytes", -1),
        sessions=gauges.get("sessions", -1),
        heap_trims=gauges.get("heap_trims", -1),
        rss_after_trim=gauges.get("rss_after_trim_bytes", 0),
        heap_in_use=gauges.get("heap_in_use_bytes", -1),
        python_blocks=gauges.get("python_allocated_blocks", -1),
        devices_returned=processes.by_role("devices")["returned"],
    )


def metrics(admin_port: int, names: tuple[str, ...]) -> dict[str, int]:
    """The broker's gauges `timestone_broker_<name>` from its admin /metrics (those it answered; a gauge with
    labels summed over them)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5) as answer:
            text = answer.read().decode()
    except OSError:
        return {}
    wanted = {f"timestone_broker_{name}": name for name in names}
    found: dict[str, int] = {}
    for line in text.splitlines():
        metric, _, value = line.partition(" ")
        name = wanted.get(metric.partition("{")[0])
        if name is not None:
            found[name] = found.get(name, 0) + int(float(value))
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
