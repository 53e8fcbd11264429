"""Where a default broker's memory per idle connection goes, counted by ``tracemalloc`` rather than RSS.

    python -m bench.footprint_objects [--connections 10000] [--transport asyncio|native] [--output FILE]

A broker with the defaults (one plain TCP listener on port 0, the commitlog in a temporary directory, the
rate of new connections not limited: as in the RSS benchmark, clients arrive faster than the default 1,000
a second) runs in this process on uvloop; a child process connects 200 idle clients to warm it, then
``--connections`` more: MQTT 5, clean start, keep alive 60 s, no subscription, each accepted (CONNACK 0)
before the count. The blocks allocated
while the second group connected and still held once it is idle are grouped by the innermost line of
``broker_edge`` on their stack: the broker's own objects, and what the event loop made for a call of the
broker's (with ``transport: native``, the loop's watch of each socket is made at its ``add_reader``); blocks
with no such line are the event loop's own (with uvloop's transport: the transport, its libuv handle, its
entry in the loop's map of transports). Sizes are the ones asked for: pymalloc rounds them up to 16 bytes, and
glibc's malloc (blocks above 512 bytes) adds its own header, so RSS grows a little more (the RSS figures
are ``bench/footprint_bench.py``'s). Unlike RSS, the count does not move with the heap's layout or the
machine's load.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import subprocess
import sys
import tempfile
import threading
import tracemalloc
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvloop

from bench.frames import CONNACK, connect
from broker_edge.config import load_dataclass
from broker_edge.runtime.broker import Broker
from broker_edge.settings.broker import BrokerConfig

_MODULE = "bench.footprint_objects"
WARM_CONNECTIONS = 200
KEEPALIVE_S = 60
FRAMES = 8
SHOWN_BYTES = 4.0
"""Sites holding less than this per connection (amortised growth of shared tables) are summed, not listed."""


@dataclass(frozen=True)
class Site:
    """Blocks made at one line and still held, per measured connection."""

    owner: str
    """``broker`` (a line of ``broker_edge`` on the stack) or ``event loop``."""
    where: str
    block_size: int
    blocks: float
    bytes: float


@dataclass(frozen=True)
class ObjectFootprint:
    """What ``connections`` idle clients added to the traced memory of one broker."""

    transport: str
    connections: int
    total_bytes: float
    sites: list[Site]

    def owned_by(self, owner: str) -> float:
        """Bytes per connection of the listed sites of ``owner``."""
        return sum(site.bytes for site in self.sites if site.owner == owner)


def _client_main(port: int, count: int, prefix: str) -> None:
    """In the child: connect ``count`` clients, print ``ready`` once all have their CONNACK, hold them until
    stdin closes."""
    import socket

    sockets = []
    for n in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(connect(f"{prefix}{n:012d}", keepalive=KEEPALIVE_S, level=5))
        sockets.append(sock)
    for sock in sockets:
        answer = sock.recv(64)
        if len(answer) < 4 or answer[0] != CONNACK or answer[3] != 0:  # CONNACK, flags, return / reason code
            raise SystemExit(f"not accepted: {answer!r}")
    print("ready", flush=True)
    sys.stdin.read()


class _Clients:
    """A child process holding idle clients open (closed with ``close``)."""

    def __init__(self, port: int, count: int, prefix: str) -> None:
        command = [
            sys.executable,
            "-m",
            "bench.footprint_objects",
            "--clients",
            str(port),
            str(count),
            prefix,
        ]
        pipe = subprocess.PIPE
        self.process = subprocess.Popen(command, stdin=pipe, stdout=pipe, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError(f"the {count} clients {prefix}* did not all connect")

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)


class _BrokerThread:
    """A default broker on its own thread's uvloop loop; ``call`` runs a function on that loop."""

    def __init__(self, directory: Path, transport: str) -> None:
        document: dict[str, Any] = {
            "listeners": [
                {"name": "mqtt", "type": "tcp", "host": "127.0.0.1", "port": 0, "transport": transport}
            ],
            "admin_http": {"port": 0},
            "limits": {"new_connections_per_second": 0},
            "storage": {"directory": str(directory / "logs")},
        }
        self.config = load_dataclass(BrokerConfig, document)
        self.loop = uvloop.new_event_loop()
        self.broker = Broker(self.config)
        started: Future[None] = Future()
        self.thread = threading.Thread(target=self._run, args=(started,), daemon=True)
        self.thread.start()
        started.result(timeout=30)

    def _run(self, started: Future[None]) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self.broker.start())
        except BaseException as exc:
            started.set_exception(exc)
            return
        started.set_result(None)
        self.loop.run_forever()

    @property
    def port(self) -> int:
        return self.broker.ports["mqtt"]

    def call(self, function: Any) -> Any:
        future: Future[Any] = Future()
        self.loop.call_soon_threadsafe(lambda: future.set_result(function()))
        return future.result(timeout=60)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.broker.stop(), self.loop).result(timeout=30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)


def _snapshot() -> tracemalloc.Snapshot:
    gc.collect()
    return tracemalloc.take_snapshot()


def measure(connections: int, transport: str = "asyncio") -> ObjectFootprint:
    """Trace one default broker while ``connections`` idle MQTT 5 clients connect (after a warm-up)."""
    with tempfile.TemporaryDirectory(prefix="footprint-objects-") as directory:
        broker = _BrokerThread(Path(directory), transport)
        warm = _Clients(broker.port, WARM_CONNECTIONS, "warm-")
        try:
            tracemalloc.start(FRAMES)
            before = broker.call(_snapshot)
            measured = _Clients(broker.port, connections, "idle-")
            try:
                after = broker.call(_snapshot)
            finally:
                tracemalloc.stop()
                measured.close()
        finally:
            warm.close()
            broker.stop()
    total = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    return ObjectFootprint(transport, connections, total / connections, _sites(before, after, connections))


def _site_of(trace: tracemalloc.Trace) -> tuple[str, str]:
    for frame in reversed(trace.traceback):  # innermost first
        if "/broker_edge/" in frame.filename:
            path = frame.filename[frame.filename.index("/broker_edge/") + 1 :]
            return "broker", f"{path}:{frame.lineno}"
    return "event loop", "uvloop, on its own"


def _sites(before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, connections: int) -> list[Site]:
    """Blocks by (owner, line, size) in ``after`` minus those in ``before``, per connection."""
    counts: dict[tuple[str, str, int], int] = {}
    for sign, snapshot in ((-1, before), (1, after)):
        for trace in snapshot.traces:
            owner, where = _site_of(trace)
            key = (owner, where, trace.size)
            counts[key] = counts.get(key, 0) + sign
    sites = [
        Site(owner, where, size, count / connections, size * count / connections)
        for (owner, where, size), count in counts.items()
        if size * count / connections >= SHOWN_BYTES
    ]
    return sorted(sites, key=lambda site: (site.owner, -site.bytes))


def render(results: list[ObjectFootprint]) -> str:
    """The results as a Markdown table per transport."""
    lines: list[str] = []
    for result in results:
        broker, loop = result.owned_by("broker"), result.owned_by("event loop")
        lines += [
            f"`transport: {result.transport}`, {result.connections:,} idle MQTT 5 clients (clean start, "
            f"keep alive {KEEPALIVE_S} s, no subscription): {result.total_bytes:,.0f} bytes per connection "
            "traced, "
            f"{loop:,.0f} of them the event loop's and {broker:,.0f} the broker's.",
            "",
            "| owner | made at | block | blocks per connection | bytes per connection |",
            "|---|---|---:|---:|---:|",
        ]
        lines += [
            f"| {site.owner} | `{site.where}` | {site.block_size} | {site.blocks:.2f} | {site.bytes:,.0f} |"
            for site in result.sites
        ]
        rest = result.total_bytes - broker - loop
        rest_line = f"| | (sites under {SHOWN_BYTES:.0f} bytes each: shared tables) | | | {rest:,.0f} |"
        lines += [rest_line, ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.footprint_objects", description=__doc__)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--transport", action="append", choices=("asyncio", "native"))
    parser.add_argument("--output", type=Path)
    parser.add_argument("--clients", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.clients:
        port, count, prefix = args.clients
        _client_main(int(port), int(count), prefix)
        return 0
    results = [measure(args.connections, transport) for transport in args.transport or ["asyncio"]]
    text = render(results)
    if args.output is not None:
        args.output.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
