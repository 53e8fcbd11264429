"""Members on one host: `timestone broker --workers 2` against one broker, QoS 1 publishers on one address.

    .venv/bin/python -m bench.workers_bench [--publishers 16] [--window 64] [--seconds 6] [--rounds 2]
        [--only one,rf1,redirect,rf2,rf3] [--against REV] [--cpu-samples DIR]

Five configurations, taking turns in each round, each started fresh with its data in a temporary directory
and, once it answers, every thread of it pinned to the first CPU (the publishers on the others): one broker
(`one`); `--workers 2` (its own etcd, replication factor 1: `rf1`); `--workers 2` joining an etcd the bench
runs, with replication factor 1 and `cluster.redirect_publishers`, its publishers MQTT 5 clients that follow a
Server Reference (so each ends up on the member leading its topic's partition: `redirect`); `--workers 2`
joining that etcd with replication factor 2 (every log on both members, acknowledged once both hold it:
`rf2`); `--workers 3` joining it with replication factor 3 (`rf3`: every member follows the partitions the two
others lead); the publishers of the others are MQTT 3.1.1 clients. Members hand a publisher's connection over
to the member leading its topic's partition (`cluster.hand_over_connections`, on by default; `redirect` turns
it off in this checkout, so that its publishers are sent away instead). `--only` picks some of them.
`--against REV` runs each configuration of the broker at git commit REV too (its `broker_edge` first on the
broker's PYTHONPATH), taking turns with this checkout's, and writes a section of its own (before and after a
change, as ratios from one run). P publishers, each on its own topic (so the topics spread over the
partitions, and over the members that lead them), keep W QoS 1 publishes in flight on the one port the kernel
spreads over the members; no subscriber. Figures: PUBACKs/s over the window, and PUBACKs per second of the CPU
of every process of the broker (members, and the etcd the command runs) together. On two cores every member
shares the first one: what this shows is what an acknowledged message costs a cluster on one host against a
broker alone, not N members on N cores, which needs a many-core machine (`../shared/bigbench`, KIT_MEMBERS).
`--cpu-samples DIR`: every broker process of each run samples where its CPU goes (`bench/cpu_samples.py`,
into `DIR/<configuration>-<round>`, `-against` for REV's); `python -m bench.cpu_samples --report` reads them.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cpu_samples, frames, net
from bench.brokers.base import stop_process_group
from bench.brokers.timestone import timestone_executable
from bench.report import RESULTS_DIR, replace_section
from bench.revisions import short_commit, tree_of
from bench.stream import FrameScanner
from bench.sysinfo import cpu_seconds, machine_info, pin_tree, split_cpus
from tests.harness.local_cluster import EtcdServer

PAYLOAD = bytes(64)
HEADING = "## Members on one host: --workers 2 against one broker"


@dataclass
class Run:
    label: str
    acked_per_s: float
    per_cpu: float


def _config(directory: Path, port: int, cluster: str = "") -> Path:
    path = directory / "broker.yaml"
    path.write_text(
        f"listeners:\n  - {{name: default, host: 127.0.0.1, port: {port}}}\n"
        f"storage: {{directory: {directory / 'data'}}}\n"
        f"offsets_api: {{port: {net.free_port()}}}\n"
        "admin_http: {port: 0}\n"
        "limits: {messages_per_second_per_client: 0, max_topics_per_client: 0,\n"
        "         new_connections_per_second: 0}\n"
        "logging: {level: WARNING}\n" + cluster
    )
    return path


@dataclass(frozen=True)
class Configuration:
    key: str
    label: str
    workers: int
    replication: int
    redirect: bool = False


_MACHINE_CPUS = os.sched_getaffinity(0)
"""The CPUs this bench may use, before it holds itself to the load generator's."""

CONFIGURATIONS = (
    Configuration("one", "one broker", 1, 1),
    Configuration("rf1", "--workers 2, replication factor 1 (its own etcd)", 2, 1),
    Configuration(
        "redirect", "--workers 2, replication factor 1, redirect_publishers, MQTT 5 publishers", 2, 1, True
    ),
    Configuration("rf2", "--workers 2, replication factor 2", 2, 2),
    Configuration("rf3", "--workers 3, replication factor 3", 3, 3),
)


@contextmanager
def started(
    workers: int,
    replication: int,
    cpus: set[int] | None,
    redirect: bool = False,
    source: Path | None = None,
    samples: Path | None = None,
) -> Iterator[tuple[int, int]]:
    """A broker (``workers`` 1) or ``--workers`` members on a free port: (port, pid of the command).
    ``redirect``: with ``cluster.redirect_publishers`` (joining an etcd of the bench's); ``source``: a
    directory whose ``broker_edge`` runs instead of this checkout's; ``samples``: the directory where each
    broker process writes its CPU samples (``bench/cpu_samples.py``)."""
    directory = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    etcd = None
    try:
        cluster = ""
        if replication > 1 or redirect:
            etcd = EtcdServer(directory / "etcd", secure=False).start()
            if cpus and etcd.process is not None:  # beside the members, as the etcd `--workers` runs is
                pin_tree(etcd.process.pid, cpus)
            cluster = (
                f"cluster:\n  node_id: m\n  etcd: [{etcd.url}]\n  listen: {{host: 127.0.0.1, port: 0}}\n"
                f"  replication_factor: {replication}\n  min_insync_replicas: {replication}\n"
                f"  redirect_publishers: {'true' if redirect else 'false'}\n"
                + ("  hand_over_connections: false\n" if redirect and source is None else "")
            )
        port = net.free_port()
        config = _config(directory, port, cluster)
        command = [str(timestone_executable()), "broker", "--config", str(config)]
        if samples is not None:  # the script by its path: ``source``'s broker_edge is still the one imported
            command[:1] = [sys.executable, str(Path(cpu_samples.__file__)), str(samples)]
        if workers > 1:
            command += ["--workers", str(workers)]
        with open(directory / "broker.log", "wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: os.sched_setaffinity(0, _MACHINE_CPUS),  # not the load's, which this has
                env={**os.environ, "PYTHONPATH": str(source)} if source else None,
            )
        try:
            _wait_settled(port, process, directory)
            if cpus:  # once its members run: `--workers N` allows two members per CPU it may run on
                pin_tree(process.pid, cpus)
            yield port, process.pid
        finally:
            stop_process_group(process, grace=60)
    finally:
        if etcd is not None:
            etcd.kill()
        shutil.rmtree(directory, ignore_errors=True)


def _wait_settled(port: int, process: subprocess.Popen[bytes], directory: Path) -> None:
    """Until a QoS 1 publish on each of 64 topics is acknowledged (every partition has its leader)."""
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the broker exited: {(directory / 'broker.log').read_text()[-2000:]}")
        try:
            acked = uvloop.run(_load(port, [f"settle/{n}" for n in range(64)], 1, 0.0, 0.5))
        except OSError:
            acked = 0
        if acked >= 64:
            time.sleep(2.0)  # leadership spreads a few partitions at a time
            return
        time.sleep(0.5)
    raise RuntimeError("the broker did not settle")


class _Publisher:
    """One connection keeping ``window`` QoS 1 publishes in flight on its topic, counting PUBACKs. An MQTT 5
    one (``v5``) sent elsewhere (DISCONNECT with a Server Reference) connects there and goes on."""

    def __init__(self, topic: str, window: int, v5: bool = False) -> None:
        self.v5 = v5
        # an MQTT 5 PUBLISH is an MQTT 3.1.1 one whose payload starts with its properties' length (0)
        self.blob = frames.publish_run(topic, b"\x00" + PAYLOAD if v5 else PAYLOAD, 1, 1, 65535)
        self.frame_len = len(self.blob) // 65535
        self.window = window
        self.sent = 0
        self.acked = 0
        self.scanner = FrameScanner(bytes((frames.PUBACK, 2)), 4)
        self.transport: asyncio.Transport | None = None
        self.ready = asyncio.get_running_loop().create_future()
        self.redirects: list[asyncio.Task[tuple[asyncio.BaseTransport, asyncio.BaseProtocol]]] = []

    def send(self, count: int) -> None:
        assert self.transport is not None
        start = self.sent % 65535
        take = min(count, 65535 - start)
        self.transport.write(self.blob[start * self.frame_len : (start + take) * self.frame_len])
        if take < count:
            self.transport.write(self.blob[: (count - take) * self.frame_len])
        self.sent += count


class _Protocol(asyncio.Protocol):
    def __init__(self, publisher: _Publisher, client_id: str) -> None:
        self.publisher = publisher
        self.client_id = client_id
        self.connected = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        publisher = self.publisher
        stream = publisher.transport = cast(asyncio.Transport, transport)  # a stream: it writes
        publisher.scanner = FrameScanner(bytes((frames.PUBACK, 2)), 4)
        stream.write(frames.connect(self.client_id, keepalive=120, level=5 if publisher.v5 else 4))

    def data_received(self, data: bytes) -> None:
        publisher = self.publisher
        scanner = publisher.scanner
        before = scanner.counts[4]
        scanner.feed(data)
        if not self.connected and scanner.connack_code == 0:
            self.connected = True
            if publisher.ready.done():  # connected again, where it was sent: a full window anew
                publisher.send(publisher.window)
            else:
                publisher.ready.set_result(None)
        got = scanner.counts[4] - before
        if got and scanner.server_reference is None:
            publisher.acked += got
            publisher.send(got)
        elif got:
            publisher.acked += got

    def connection_lost(self, exc: Exception | None) -> None:
        publisher = self.publisher
        if not publisher.ready.done():
            publisher.ready.set_exception(ConnectionError(str(exc)))
            return
        reference = publisher.scanner.server_reference
        if reference is not None:  # sent to another member: connect there
            host, _, port = reference.rpartition(":")
            loop = asyncio.get_running_loop()
            protocol = partial(_Protocol, publisher, self.client_id)
            publisher.redirects.append(loop.create_task(loop.create_connection(protocol, host, int(port))))


async def _load(
    port: int, topics: list[str], window: int, warmup_s: float, seconds: float, v5: bool = False
) -> float:
    """PUBACKs per second over ``seconds`` after ``warmup_s`` (or, with ``warmup_s`` 0 and window 1, the
    PUBACKs got within ``seconds``)."""
    loop = asyncio.get_running_loop()
    publishers = [_Publisher(topic, window, v5) for topic in topics]
    transports = []
    for n, publisher in enumerate(publishers):
        transport, _ = await asyncio.wait_for(
            loop.create_connection(partial(_Protocol, publisher, f"w-{os.getpid()}-{n}"), net.HOST, port), 10
        )
        transports.append(transport)
        await asyncio.wait_for(publisher.ready, 10)
    for publisher in publishers:
        publisher.send(window)
    await asyncio.sleep(warmup_s)
    before = sum(p.acked for p in publishers)
    began = time.monotonic()
    await asyncio.sleep(seconds)
    acked = sum(p.acked for p in publishers) - before
    elapsed = time.monotonic() - began
    for publisher in publishers:
        for redirect in publisher.redirects:
            redirect.cancel()
        if publisher.transport is not None:
            publisher.transport.close()
    for transport in transports:
        transport.close()
    redirected = sum(len(p.redirects) for p in publishers)
    if redirected:
        print(f"[workers] {redirected} publishers sent to another member", flush=True)
    return acked / elapsed if warmup_s else float(acked)


def measure(
    label: str,
    configuration: Configuration,
    args: argparse.Namespace,
    broker_cpus: set[int] | None,
    source: Path | None = None,
    samples: Path | None = None,
) -> Run:
    """One run of ``configuration``, its processes held to ``broker_cpus``; this process is on the others."""
    workers, replication, redirect = configuration.workers, configuration.replication, configuration.redirect
    with started(workers, replication, broker_cpus, redirect, source, samples) as (port, pid):
        topics = [f"workers/{os.getpid()}/{n}" for n in range(args.publishers)]
        cpu0 = cpu_seconds(pid)
        began = time.monotonic()
        rate = uvloop.run(_load(port, topics, args.window, 1.0, args.seconds, v5=redirect))
        wall = time.monotonic() - began
        cpu = cpu_seconds(pid) - cpu0
    per_cpu = rate * wall / cpu if cpu > 0 else 0.0
    print(f"[workers] {label}: {rate:,.0f} PUBACKs/s, {per_cpu:,.0f} per CPU second", flush=True)
    return Run(label, rate, per_cpu)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.workers_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--publishers", type=int, default=16)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--only", help="configurations, comma-separated: " + ",".join(c.key for c in CONFIGURATIONS)
    )
    parser.add_argument("--against", metavar="REV", help="a commit whose broker runs each configuration too")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "workers.md")
    parser.add_argument(
        "--cpu-samples",
        type=Path,
        metavar="DIR",
        help="each run's broker processes sample their CPU into DIR/<configuration>-<round>",
    )
    args = parser.parse_args(argv)
    keys = args.only.split(",") if args.only else [c.key for c in CONFIGURATIONS]
    unknown = set(keys) - {c.key for c in CONFIGURATIONS}
    if unknown:
        parser.error(f"--only: no configuration {', '.join(sorted(unknown))}")
    configurations = [c for c in CONFIGURATIONS if c.key in keys]
    broker_cpus, load_cpus = split_cpus()  # once: this process then holds itself to the load's CPUs
    if load_cpus:
        os.sched_setaffinity(0, load_cpus)
    with tempfile.TemporaryDirectory(prefix="workers-bench-") as scratch:
        sources: dict[str, Path | None] = {"": None}
        if args.against:
            sources = {
                f", this checkout ({short_commit('HEAD')})": None,
                f", {short_commit(args.against)}": tree_of(args.against, Path(scratch), "broker_edge"),
            }
        load_before = os.getloadavg()
        runs: dict[str, list[Run]] = {c.label + name: [] for c in configurations for name in sources}
        turns = [(c, name, source) for c in configurations for name, source in sources.items()]
        for round_number in range(args.rounds):
            for configuration, name, source in turns if round_number % 2 == 0 else list(reversed(turns)):
                label = configuration.label + name
                samples = None
                if args.cpu_samples is not None:
                    run_name = f"{configuration.key}{'-against' if source else ''}-{round_number + 1}"
                    samples = args.cpu_samples / run_name
                runs[label].append(measure(label, configuration, args, broker_cpus, source, samples))
    text = render(runs, args, load_before, os.getloadavg(), list(sources))
    print(text)
    replace_section(args.output, _heading(args), text)  # the file's other sections are kept
    print(f"wrote {args.output}", flush=True)
    return 0


def _heading(args: argparse.Namespace) -> str:
    if args.against:
        return f"## Members on one host: this checkout against {short_commit(args.against)}"
    return HEADING


def render(
    runs: dict[str, list[Run]],
    args: argparse.Namespace,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    sources: list[str],
) -> str:
    machine = machine_info()
    lines = [
        _heading(args),
        "",
        f"{args.publishers} QoS 1 publishers, each on its own topic, {args.window} in flight each, 64-byte "
        "payloads, all on the one address; no subscriber. PUBACKs/s over "
        f"{args.seconds:.0f} s after a second's warm-up, and PUBACKs per second of the CPU of all the "
        "broker's processes together (members and the etcd `--workers` runs); the median of "
        f"{args.rounds} rounds, configurations taking turns, every run in brackets.",
        "",
        "| configuration | PUBACKs/s | per CPU second | runs | per CPU second against one broker |",
        "|---|---|---|---|---|",
    ]
    for label, measured in runs.items():
        source = next((name for name in sources if name and label.endswith(name)), "")
        single = runs.get("one broker" + source)
        rate = statistics.median(r.acked_per_s for r in measured)
        per_cpu = statistics.median(r.per_cpu for r in measured)
        shown = "; ".join(f"{r.acked_per_s:,.0f} ({r.per_cpu:,.0f})" for r in measured)
        ratio = f"{per_cpu / statistics.median(r.per_cpu for r in single):.2f}x" if single else "-"
        lines.append(f"| {label} | {rate:,.0f} | {per_cpu:,.0f} | {shown} | {ratio} |")
    lines += [
        "",
        f"`bench/workers_bench.py{' --against ' + args.against if args.against else ''}"
        f"{' --only ' + args.only if args.only else ''}`, measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} "
        f"UTC on {machine.cpu_model}, {machine.cores} CPUs, Python {machine.python}; the broker's processes "
        "pinned to CPU 0, the publishers to CPU 1. Load average "
        f"{load_before[0]:.2f} at the start and {load_after[0]:.2f} at the end.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
