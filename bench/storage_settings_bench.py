"""Timestone against itself with other storage settings, on the ingest shapes, as CPU per message.

    .venv/bin/python -m bench.storage_settings_bench [--shape fanin|fleet] [--rounds 3] \\
        --variant "" --variant "group_commit_min_interval_ms: 2"

Each variant is YAML added to the broker's ``storage:`` section ("" is the defaults). The variants take
turns, round after round, the broker pinned to one CPU and the load generator to the other
(``bench.sysinfo.split_cpus``); each line is one run: delivered/s, the broker's CPU and delivered per second
of its CPU (what one core of it delivers), and why the run is void when it is. ``fanin``: 16 QoS 1
publishers, 64 in flight each, one QoS 1 subscriber; ``fleet``: 10,000 devices, one QoS 1 publish in
flight each, one consumer (``bench.scenarios``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.brokers import Timestone
from bench.loadgen.flow import FlowSpec, Timing
from bench.scenarios import fanin, fleet
from bench.scenarios.base import RunContext
from bench.scenarios.throughput import flow_row
from bench.sysinfo import machine_info, raise_fd_limit, split_cpus

TIMING = Timing(warmup_s=3.0, measure_s=8.0, drain_s=30.0, connect_timeout_s=120.0)


class WithStorage(Timestone):
    """Timestone with ``settings`` (YAML lines) added to its ``storage:`` section."""

    def __init__(self, settings: str) -> None:
        super().__init__(persist=True)
        self.settings = settings

    @property
    def config_key(self) -> tuple[str, ...]:
        return (*super().config_key, self.settings)

    def command(self, port: int, workdir: Path) -> list[str]:
        command = super().command(port, workdir)
        config = workdir / "timestone.yaml"
        lines = "".join(f"  {line.strip()}\n" for line in self.settings.split(";") if line.strip())
        config.write_text(config.read_text().replace("storage:\n", "storage:\n" + lines, 1))
        return command


def shape(name: str) -> FlowSpec:
    return fanin.spec(1, 16) if name == "fanin" else fleet.spec(fleet.DEVICES)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.storage_settings_bench", description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=("fanin", "fleet"), default="fanin")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", action="append", default=[], help="storage YAML, ';' between keys")
    args = parser.parse_args(argv)
    raise_fd_limit()
    broker_cpus, loadgen_cpus = split_cpus()
    machine = machine_info()
    print(f"{machine.cpu_model}, {machine.cores} CPUs, {machine.python}; shape {args.shape}", flush=True)
    for round_number in range(args.rounds):
        for settings in args.variant or [""]:
            broker = WithStorage(settings)
            ctx = RunContext(
                brokers=[broker],
                quick=False,
                timing=TIMING,
                repeat=1,
                broker_cpus=broker_cpus,
                loadgen_cpus=loadgen_cpus,
                log=lambda _message: None,
            )
            row = flow_row(ctx, broker, args.shape, shape(args.shape))
            if row.figure is None:
                print(
                    f"round {round_number + 1} [{settings or 'defaults'}] no figure: {row.note}", flush=True
                )
                continue
            cpu = float(row.cells["broker CPU"].rstrip("%")) / 100
            void = f" VOID: {row.invalid}" if row.invalid else ""
            print(
                f"round {round_number + 1} [{settings or 'defaults'}] delivered/s {row.figure:,.0f}, "
                f"broker CPU {cpu:.0%}, per CPU second {row.figure / cpu:,.0f}{void}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
