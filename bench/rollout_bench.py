"""Exponential rollout benchmark: one action to a whole fleet at a rate that grows as devices are notified,
the measured send rate against the configured curve.

    flock /tmp/timestone-bench.lock .venv/bin/python bench/rollout_bench.py --devices 10000 --procs 4

A Timestone broker runs as its own process, the fleet in ``--procs`` processes (devices send telemetry every
``--telemetry-interval`` seconds), and the actions job on a local Spark session in this one, as in
``bench/ota_bench.py``. One OTA row goes to the group of every device with an exponential rate: from
``--base-per-minute``, multiplied by ``--factor`` each time ``--every`` more devices were sent it, up to
``--ceiling`` devices a minute. The configured curve is the number of devices the rate allows by each moment
since the rollout started (``pipelines/actions/rollout.py``); it is compared with when the job sent each
device the action (``action_executions.published_at``) and when each device received it (its own clock):

- per step of the rate, its configured rate and the rate measured over the devices of that step;
- how far the job ran ahead of the curve (it must not) and how far behind (seconds after the moment the
  curve allowed a device);
- the whole rollout's duration, configured and measured.

Results go to ``bench/results/ota.md`` under "Exponential rollout" (the other sections are kept), with a
chart in ``bench/results/ota-exponential.png``.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.compute as pc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ota_bench import GROUP, RESULTS, broker_limits, percentile, register_devices, save  # noqa: E402
from bench.sysinfo import cpu_seconds, machine_info  # noqa: E402
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402
from pipelines.actions.buckets import DEFAULT_BUCKETS  # noqa: E402
from pipelines.actions.rollout import Pace  # noqa: E402
from pipelines.fleet.device import DeviceBehaviour  # noqa: E402
from pipelines.fleet.fleet import FleetSpec  # noqa: E402
from pipelines.fleet.processes import FleetProcesses, loopback_sources, raise_open_files_limit  # noqa: E402

HEADING = "## Exponential rollout"
CHART = RESULTS.parent / "ota-exponential.png"
GRID_MS = 50


@dataclass
class Measured:
    """Epoch ms per device, in the rollout's order: when the job sent it, when the device received it."""

    start_ms: int
    published_ms: list[int]
    received_ms: list[int]
    facts: dict


def always(start: int, end: int) -> int:
    return max(0, end - start)


def curve(pace: Pace, start_ms: int, devices: int) -> list[int]:
    """When the configured rate allows the i-th device (i from 1), epoch ms, on a grid of ``GRID_MS``."""
    allowed_at: list[int] = []
    t = start_ms
    while len(allowed_at) < devices:
        allowed = pace.allowed(start_ms, t, always, 0, devices)
        allowed_at += [t] * (allowed - len(allowed_at))
        t += GRID_MS
    return allowed_at


def run(args, workdir: Path, pace: Pace) -> Measured:
    from pipelines.actions.config import ActionsConfig, BrokerEndpoint
    from pipelines.actions.job import start_actions_job
    from pipelines.actions.operator import NewAction, create_action
    from pipelines.spark_session import local_spark_session
    from sinks import open_table_store

    devices = args.devices
    broker = BrokerProcess(
        workdir / "broker", limits=broker_limits(devices), logging={"level": "WARNING"}
    ).start()
    assert broker.process is not None
    spec = FleetSpec(
        brokers=[broker.address],
        count=devices,
        groups=[GROUP],
        buckets=DEFAULT_BUCKETS,
        connects_per_second=args.connects_per_second,
        source_addresses=loopback_sources(devices),
    )
    behaviour = DeviceBehaviour(telemetry_interval_s=args.telemetry_interval, download_delay_s=(0.5, 1.5))
    fleet = FleetProcesses(spec, behaviour, args.procs)
    facts: dict = {"load_before": os.getloadavg()}
    try:
        started = time.monotonic()
        fleet.start()
        facts["connected"] = fleet.status()[0]
        facts["connect_s"] = time.monotonic() - started
        print(f"{facts['connected']:,} devices connected in {facts['connect_s']:.1f} s", flush=True)
        spark = local_spark_session("timestone-rollout-bench", "local[2]")
        store = open_table_store(spark, str(workdir / "tables"), backend="delta-rs")
        register_devices(store, spec)
        config = ActionsConfig(
            tables_root=str(workdir / "tables"),
            checkpoint_root=str(workdir / "checkpoints"),
            brokers=[BrokerEndpoint(mqtt_port=broker.port, offsets_api=broker.offsets_url)],
            trigger_interval_s=args.trigger_interval,
            tick_interval_s=args.tick_interval,
        )
        job = start_actions_job(spark, config, store)
        job.process_available()
        cpu_before = (fleet.status()[2], cpu_seconds(broker.process.pid), cpu_seconds(os.getpid()))
        action = NewAction(
            group=GROUP,
            version="2.0.0",
            url="https://example.invalid/fw-2.0.0.bin",
            sha256="0" * 64,
            max_per_minute=pace.max_per_minute,
            exponential_rate={
                "base_per_minute": pace.base_per_minute,
                "increment_factor": pace.increment_factor,
                "notified_devices": pace.notified_devices,
            },
        )
        create_action(store, action)
        wall_started = time.time()
        expected_s = (curve(pace, 0, devices)[-1]) / 1000
        deadline = wall_started + expected_s + 120
        times = []
        while time.time() < deadline:
            time.sleep(5)
            times = fleet.times(action.action_id)
            reached = sum(1 for t in times if t.received_at is not None)
            print(
                f"  {reached:,} of {devices:,} devices have it after {time.time() - wall_started:.0f} s",
                flush=True,
            )
            if reached >= devices:
                break
        wall = time.time() - wall_started
        cpu_after = (fleet.status()[2], cpu_seconds(broker.process.pid), cpu_seconds(os.getpid()))
        facts |= {
            "simulator_cpu": (cpu_after[0] - cpu_before[0]) / wall * 100,
            "broker_cpu": (cpu_after[1] - cpu_before[1]) / wall * 100,
            "job_cpu": (cpu_after[2] - cpu_before[2]) / wall * 100,
        }
        job.stop()
        table = store.read_arrow("action_executions")
        table = table.filter(pc.equal(table["action_id"], action.action_id))
        queued = table["queued_at"].cast("int64").to_pylist()
        published = table["published_at"].cast("int64").to_pylist()
        facts["load_after"] = os.getloadavg()
        return Measured(
            start_ms=min(queued) // 1000,
            published_ms=sorted(p // 1000 for p in published if p is not None),
            received_ms=sorted(int(t.received_at * 1000) for t in times if t.received_at is not None),
            facts=facts,
        )
    finally:
        fleet.stop()
        broker.stop()


def steps(pace: Pace, devices: int) -> list[tuple[int, int, float]]:
    """(first device, last device, configured devices per minute) of each step of the rate."""
    size = pace.notified_devices or devices
    out = []
    for first in range(0, devices, size):
        last = min(devices, first + size)
        out.append((first, last, pace.rate(first // size)))
        if pace.rate(first // size) >= pace.ceiling:
            out[-1] = (first, devices, pace.ceiling)
            break
    return out


def rate_per_min(times_ms: list[int], first: int, last: int) -> float | None:
    """Devices per minute between the ``first``-th and ``last``-th device (0-based, in order of time)."""
    if len(times_ms) < last or last - first < 2:
        return None
    span = times_ms[last - 1] - times_ms[first]
    return (last - 1 - first) * 60_000 / span if span > 0 else None


def report(args, pace: Pace, measured: Measured) -> str:
    devices = args.devices
    allowed = curve(pace, measured.start_ms, devices)
    sent, got = measured.published_ms, measured.received_ms
    ahead = max((i + 1) - pace.allowed(measured.start_ms, p, always, 0, devices) for i, p in enumerate(sent))
    sent_lag = [(p - a) / 1000 for p, a in zip(sent, allowed, strict=False)]
    got_lag = [(r - a) / 1000 for r, a in zip(got, allowed, strict=False)]
    machine = machine_info()
    load = measured.facts
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    intro = (
        f"Measured {now} on {machine.cpu_model}, {machine.cores} cores, shared with other work: load "
        f"average {load['load_before'][0]:.1f} before the run, {load['load_after'][0]:.1f} after. Broker, "
        f"fleet ({args.procs} processes, each device sending telemetry every {args.telemetry_interval:g} s) "
        f"and Spark (`local[2]`) share the cores; {load['connected']:,} devices connected in "
        f"{load['connect_s']:.1f} s. CPU over the rollout (% of one core): simulator "
        f"{load['simulator_cpu']:.0f} %, broker {load['broker_cpu']:.0f} %, "
        f"job + Spark {load['job_cpu']:.0f} %."
    )
    setting = (
        f"One OTA row to a group of {devices:,} devices with `exponential_rate` {{base_per_minute "
        f"{pace.base_per_minute}, increment_factor {pace.increment_factor:g}, notified_devices "
        f"{pace.notified_devices}}} and `rollout.max_per_minute` {pace.max_per_minute} (the ceiling); the "
        f"job ticks every {args.tick_interval:g} s. Configured: when the rate allows each device since the "
        "rollout started; sent: `action_executions.published_at`; received: each device's own clock."
    )
    lines = [f"{HEADING}, {devices:,} devices", "", intro, "", setting, ""]
    lines += [
        "| step | devices | configured /min | sent /min (measured) | ratio | received /min (measured) |",
        "|---|---|---|---|---|---|",
    ]
    for number, (first, last, rate) in enumerate(steps(pace, devices)):
        measured_sent = rate_per_min(sent, first, last)
        ratio = f"{measured_sent / rate:.2f}" if measured_sent else "-"
        cells = [str(number), f"{first + 1:,}-{last:,}", f"{rate:,.0f}", _fmt(measured_sent), ratio]
        lines.append("| " + " | ".join([*cells, _fmt(rate_per_min(got, first, last))]) + " |")
    configured_s = (allowed[-1] - measured.start_ms) / 1000
    sent_s = (sent[-1] - measured.start_ms) / 1000 if len(sent) == devices else None
    got_s = (got[-1] - measured.start_ms) / 1000 if len(got) == devices else None
    lines += [
        "",
        "| | configured | sent by the job | received by the devices |",
        "|---|---|---|---|",
        f"| last device (s after the start) | {configured_s:.1f} | {_fmt(sent_s, 1)} | {_fmt(got_s, 1)} |",
        f"| devices | {devices:,} | {len(sent):,} | {len(got):,} |",
        f"| behind the curve, s (p50 / p95 / max) | - | {_lags(sent_lag)} | {_lags(got_lag)} |",
        "",
        f"Most devices sent ahead of the curve at any moment: {max(0, ahead)}. "
        "Chart: [ota-exponential.png](ota-exponential.png).",
    ]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _lags(values: list[float]) -> str:
    if not values:
        return "-"
    return " / ".join(f"{percentile(values, p):.2f}" for p in (50, 95, 100))


def chart(pace: Pace, measured: Measured, devices: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    start = measured.start_ms
    allowed = curve(pace, start, devices)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot(
        [(a - start) / 1000 for a in allowed],
        range(1, devices + 1),
        label="configured",
        linewidth=3,
        alpha=0.5,
    )
    ax.plot(
        [(p - start) / 1000 for p in measured.published_ms],
        range(1, len(measured.published_ms) + 1),
        label="sent by the job",
    )
    ax.plot(
        [(r - start) / 1000 for r in measured.received_ms],
        range(1, len(measured.received_ms) + 1),
        label="received by the devices",
        linestyle="--",
    )
    ax.set_xlabel("seconds since the rollout started")
    ax.set_ylabel("devices")
    ax.set_title(f"Exponential rollout to {devices:,} devices: configured curve and measured")
    ax.legend()
    fig.tight_layout()
    fig.savefig(CHART, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--procs", type=int, default=4, help="processes of the simulated fleet")
    parser.add_argument("--telemetry-interval", type=float, default=5.0)
    parser.add_argument("--trigger-interval", type=float, default=0.5)
    parser.add_argument("--tick-interval", type=float, default=0.5)
    parser.add_argument("--connects-per-second", type=float, default=2000.0)
    parser.add_argument("--base-per-minute", type=int, default=600)
    parser.add_argument("--factor", type=float, default=2.0)
    parser.add_argument("--every", type=int, default=1000, help="devices notified between growths")
    parser.add_argument("--ceiling", type=int, default=12_000, help="rollout.max_per_minute")
    parser.add_argument("--no-save", action="store_true", help="print only, do not update the results file")
    args = parser.parse_args(argv)
    pace = Pace(args.ceiling, args.base_per_minute, args.factor, notified_devices=args.every)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    raise_open_files_limit()
    logging.getLogger("pipelines").setLevel(logging.WARNING)
    workdir = Path(tempfile.mkdtemp(prefix="timestone-rollout-bench-"))
    try:
        measured = run(args, workdir, pace)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    section = report(args, pace, measured)
    if not args.no_save:
        save(section, HEADING)
        chart(pace, measured, args.devices)
    print(section)
    return 0


if __name__ == "__main__":
    sys.exit(main())
