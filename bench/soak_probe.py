"""A long soak at a small load with the broker probed from inside every minute: does anything grow?

    .venv/bin/python -m bench.soak_probe [--seconds 1500] [--devices 500] [--churn 10] [--every 60]
        [--trace-from 120] [--tail-cache-mib 4] [--output FILE]

The broker (`timestone broker` with its defaults, under `bench.traced_broker`, its store holding the devices'
logs as the soak's does: `soak_bench.LOGS_FROM`) serves `soak_load` for
`--seconds`; every `--every` seconds it is asked for a probe (a full garbage collection, then the objects by
type, Python's allocated blocks, glibc's `mallinfo2`, Python's allocator's arenas and their free space,
VmRSS, the sizes of the containers reachable from the `Broker` object, and with `--trace-from` the source
lines holding most `tracemalloc`-traced memory, traced with one frame: the cheapest, still several times the
broker's CPU). The report lists the probes over time, then what grew between the first probe of the second
half of the run and the last one: growth that follows the clock at a steady load is a leak, whatever the
load is. A small load for long tells more than a big one briefly, and leaves the machine to others.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from bench import net, traced_broker
from bench.footprint_startup import DefaultTimestone
from bench.soak_bench import LOGS_FROM, metrics
from bench.soak_load import LoadProcesses, SoakLoad, device_topic
from bench.sysinfo import cpu_seconds

TOP = 15


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1500.0)
    parser.add_argument("--devices", type=int, default=500)
    parser.add_argument("--churn", type=int, default=10, help="devices reconnecting per second")
    parser.add_argument("--every", type=float, default=60.0, help="seconds between probes")
    parser.add_argument(
        "--trace-from", type=float, default=-1.0, help="start tracemalloc this many seconds in (<0: never)"
    )
    parser.add_argument("--tail-cache-mib", type=int, default=4, help="storage.tail_cache_total_bytes, MiB")
    parser.add_argument("--output", type=Path, default=None)
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> list[dict]:
    """Run the broker and the load, probing every `args.every` seconds; the probes, oldest first."""
    control = Path(tempfile.mkdtemp(prefix="soak-probe-"))
    admin_port = net.free_port()
    storage = {"tail_cache_total_bytes": args.tail_cache_mib * 2**20}
    broker = DefaultTimestone(
        storage=storage,
        traced=control,
        admin_port=admin_port,
        logs=[device_topic(index) for index in range(args.devices)],
        logs_from=LOGS_FROM,
    )
    broker.prepare()
    probes: list[dict] = []
    with broker.running(None) as running:
        load = SoakLoad(port=running.port, devices=args.devices, churn_per_s=args.churn)
        with LoadProcesses(load) as processes:
            started = time.monotonic()
            traced = args.trace_from < 0
            number = 0
            while (at := time.monotonic() - started) <= args.seconds:
                if not traced and at >= args.trace_from:
                    traced = traced_broker.request(control, "start-1")
                if at >= number * args.every:
                    label = f"{number:04d}"
                    if traced_broker.request(control, f"probe-{label}"):
                        probe = json.loads((control / f"{label}.probe").read_text())
                        probe.update(
                            at_s=at,
                            cpu_s=cpu_seconds(running.pid),
                            open_files=len(os.listdir(f"/proc/{running.pid}/fd")),
                            load=processes.totals(),
                            tail_cache_bytes=metrics(admin_port, ("tail_cache_bytes",)).get(
                                "tail_cache_bytes", -1
                            ),
                        )
                        probes.append(probe)
                        _log(_line(probe))
                    number += 1
                time.sleep(0.5)
    return probes


def report(probes: list[dict], args: argparse.Namespace) -> str:
    """The probes as a table, then the growth between the middle and the end of the run."""
    lines = [
        f"soak probe: {args.devices} devices at 1 QoS 1 message/s, {args.churn} reconnects/s, "
        f"{args.seconds:.0f} s, a probe every {args.every:.0f} s, tail caches bounded to "
        f"{args.tail_cache_mib} MiB; load average at the end {os.getloadavg()[0]:.2f}",
        "",
        "| time | RSS | allocated blocks | malloc in use | malloc free | pymalloc arenas | pymalloc free "
        "| GC objects | tail caches | open files | broker CPU | acknowledged |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in probes:
        malloc = p["malloc"]
        lines.append(
            f"| {p['at_s']:.0f} s | {p['rss'] / 2**20:.1f} MiB | {p['allocated_blocks']:,} | "
            f"{(malloc.get('uordblks', 0) + malloc.get('hblkhd', 0)) / 2**20:.2f} MiB | "
            f"{malloc.get('fordblks', 0) / 2**20:.2f} MiB | {_pymalloc(p)} | {p['gc_objects']:,} | "
            f"{p['tail_cache_bytes'] / 2**20:.2f} MiB | {p['open_files']} | {p['cpu_s']:.0f} s | "
            f"{p['load']['acked']:,} |"
        )
    if len(probes) >= 3:
        first, last = probes[len(probes) // 2], probes[-1]
        lines += ["", f"Grown from {first['at_s']:.0f} s to {last['at_s']:.0f} s:", ""]
        lines.append("objects by type: " + _grown(first["types"], last["types"]))
        lines.append("containers of the broker: " + _grown(first["maps"], last["maps"]))
        if "traced" in first and "traced" in last:
            before = {line: size for line, size, _count in first["traced"]}
            after = {line: size for line, size, _count in last["traced"]}
            lines.append("traced memory by source line (bytes): " + _grown(before, after))
    return "\n".join(lines) + "\n"


def _pymalloc(probe: dict) -> str:
    """Python's allocator's arenas (MiB) and the free space inside them, in free blocks and unused pools."""
    stats = probe.get("pymalloc") or {}
    if "arenas" not in stats:
        return "- | -"
    free = stats.get("available_bytes", 0) + stats.get("unused_pool_bytes", 0)
    return f"{stats['arenas']} | {free / 2**20:.2f} MiB"


def _grown(before: dict[str, int], after: dict[str, int]) -> str:
    changes = sorted(((after[k] - before.get(k, 0), k) for k in after), reverse=True)
    shown = [f"{name} {diff:+,}" for diff, name in changes[:TOP] if diff > 0]
    return ", ".join(shown) or "nothing"


def _line(probe: dict) -> str:
    malloc = probe["malloc"]
    return (
        f"{probe['at_s']:5.0f} s: RSS {probe['rss'] / 2**20:.1f} MiB, blocks {probe['allocated_blocks']:,}, "
        f"malloc in use {(malloc.get('uordblks', 0) + malloc.get('hblkhd', 0)) / 2**20:.2f} MiB, "
        f"free {malloc.get('fordblks', 0) / 2**20:.2f} MiB, pymalloc arenas | free {_pymalloc(probe)}, "
        f"objects {probe['gc_objects']:,}, "
        f"caches {probe['tail_cache_bytes'] / 2**20:.2f} MiB, fds {probe['open_files']}, "
        f"cpu {probe['cpu_s']:.0f} s"
    )


def _log(message: str) -> None:
    print(f"[soak-probe {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    text = report(run(args), args)
    print(text)
    if args.output is not None:
        args.output.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
