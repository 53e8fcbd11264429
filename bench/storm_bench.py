"""A reconnect storm on members on one host: N devices connecting at once to `timestone broker --workers 2`.

    .venv/bin/python -m bench.storm_bench [--devices 2000] [--seconds 15] [--rounds 2] [--against REV]

The command runs its own etcd; every member and that etcd are pinned to the first CPU, the devices to the
second. Every device connects at the same moment (MQTT 3.1.1, clean session, its own client id), then
publishes QoS 1 on its own topic with one publish in flight for `--seconds`. Each CONNECT claims its
client id in the cluster's session registry in etcd, and a connection is handed over to the member leading
its topic's partition, which claims it again: a burst of etcd calls beside the members' lease renewals. A
member whose renewals come late fences itself and disconnects its clients. Figures: how long the devices
took to connect, how many were disconnected afterwards, and PUBACKs/s over the window. `--against REV` runs
the broker of git commit REV too (its `broker_edge` first on the broker's PYTHONPATH), taking turns.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import frames, net
from bench.report import RESULTS_DIR, replace_section
from bench.revisions import short_commit, tree_of
from bench.stream import FrameScanner
from bench.sysinfo import machine_info
from bench.workers_bench import started

HEADING = "## A reconnect storm on --workers 2"
PAYLOAD = bytes(64)


@dataclass
class Storm:
    connect_s: float
    disconnected: int
    acked_per_s: float


class _Device(asyncio.Protocol):
    """One device: CONNECT, then one QoS 1 publish in flight on its own topic; counts its PUBACKs."""

    def __init__(self, number: int) -> None:
        self.client_id = f"storm-{os.getpid()}-{number}"
        self.topic = f"fleet/{number}/telemetry"
        self.scanner = FrameScanner(bytes((frames.PUBACK, 2)), 4)
        self.ready = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.packet_id = 0
        self.acked = 0
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream (uvloop's is not a subclass)
        self.transport.write(frames.connect(self.client_id, keepalive=120))

    def publish(self) -> None:
        assert self.transport is not None
        self.packet_id = self.packet_id % 65535 + 1
        self.transport.write(frames.publish(self.topic, PAYLOAD, 1, self.packet_id))

    def data_received(self, data: bytes) -> None:
        before = self.scanner.counts[4]
        self.scanner.feed(data)
        if not self.ready.done() and self.scanner.connack_code is not None:
            self.ready.set_result(self.scanner.connack_code)
        if self.scanner.counts[4] > before:
            self.acked += self.scanner.counts[4] - before
            self.publish()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ready.done():
            self.lost = True
        else:
            self.ready.set_exception(ConnectionError(f"closed before CONNACK: {exc}"))


async def _storm(port: int, devices: int, seconds: float) -> Storm:
    loop = asyncio.get_running_loop()
    fleet = [_Device(n) for n in range(devices)]

    async def connect(device: _Device) -> None:
        await loop.create_connection(lambda: device, net.HOST, port)
        code = await asyncio.wait_for(device.ready, 120)
        if code != 0:
            raise RuntimeError(f"{device.client_id} refused: CONNACK {code}")
        device.publish()

    began = time.monotonic()
    await asyncio.gather(*(connect(device) for device in fleet))
    connect_s = time.monotonic() - began
    before = sum(d.acked for d in fleet)
    await asyncio.sleep(seconds)
    acked = sum(d.acked for d in fleet) - before
    disconnected = sum(d.lost for d in fleet)  # counted before the bench's own closes below
    for device in fleet:
        if device.transport is not None:
            device.transport.close()
    return Storm(connect_s, disconnected, acked / seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.storm_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--against", metavar="REV", help="a commit whose broker takes turns with this one")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "workers.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="storm-bench-") as scratch:
        sources: dict[str, Path | None] = {short_commit("HEAD"): None}
        if args.against:
            sources[short_commit(args.against)] = tree_of(args.against, Path(scratch), "broker_edge")
        results: dict[str, list[Storm]] = {name: [] for name in sources}
        os.sched_setaffinity(0, {1})
        for round_number in range(args.rounds):
            turns = list(sources.items())
            for name, source in turns if round_number % 2 == 0 else reversed(turns):
                with started(2, 1, {0}, source=source) as (port, _pid):
                    storm = uvloop.run(_storm(port, args.devices, args.seconds))
                print(
                    f"[storm] {name}: connected in {storm.connect_s:.1f} s, "
                    f"{storm.disconnected} disconnected, {storm.acked_per_s:,.0f} PUBACKs/s",
                    flush=True,
                )
                results[name].append(storm)
    text = render(results, args)
    print(text)
    replace_section(args.output, HEADING, text)
    print(f"wrote {args.output}", flush=True)
    return 0


def render(results: dict[str, list[Storm]], args: argparse.Namespace) -> str:
    machine = machine_info()
    lines = [
        HEADING,
        "",
        f"{args.devices:,} devices connecting at once to `timestone broker --workers 2` (its own etcd), then "
        f"each publishing QoS 1 with one in flight for {args.seconds:.0f} s; every run in turn.",
        "",
        "| broker (commit) | connected in (s) | disconnected afterwards | PUBACKs/s |",
        "|---|---|---|---|",
    ]
    for name, storms in results.items():
        lines.append(
            f"| {name} | {'; '.join(f'{s.connect_s:.1f}' for s in storms)} "
            f"| {'; '.join(str(s.disconnected) for s in storms)} "
            f"| {'; '.join(f'{s.acked_per_s:,.0f}' for s in storms)} |"
        )
    lines += [
        "",
        f"`bench/storm_bench.py{' --against ' + args.against if args.against else ''}`, measured "
        f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC on {machine.cpu_model}, {machine.cores} CPUs, Python "
        f"{machine.python}; the members and their etcd pinned to CPU 0, the devices to CPU 1.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
