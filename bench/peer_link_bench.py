"""The peer link's CPU per forwarded publish: two members' links in one process, forwarding and answering.

    .venv/bin/python -m bench.peer_link_bench [--against REV] [--seconds 2] [--rounds 3]

Member ``a`` dials member ``b``'s ``/v1/peer`` over loopback (plain WebSocket, as members without
`cluster.tls`) and forwards QoS 1 publishes (100-byte payloads, each topic its own publisher); ``b`` answers
every batch at once with consecutive offsets, as a leader that appended it does. Each topic keeps one batch on
its way, as a forwarding lane does. The shapes: ``TxK`` = T topics, K publishes per batch (1x1: one publish
per round trip; 48x64: the many-core kit's publishers, 64 in flight each). Figure: microseconds of the
process's CPU per answered publish, both ends of the link together (encoding, the WebSocket, decoding, the
answer), not the PUBLISH path on either side. With ``--against REV`` the same measurement runs from
``git archive REV``'s ``broker_edge`` too, the two taking turns in each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.revisions import tree_of

SHAPES = ((1, 1), (16, 1), (16, 16), (48, 64))
ROOT = Path(__file__).resolve().parent.parent


async def _measure(topics: int, per_batch: int, seconds: float) -> float:
    """Microseconds of CPU per answered publish for ``topics`` lanes of ``per_batch`` publishes."""
    from aiohttp import web

    from broker_edge.cluster.links.peer_link import PeerLink, PeerLinks
    from broker_edge.engine.message import Message
    from broker_edge.engine.ports import ForwardAck
    from broker_edge.offsets_api.requests import ACCESS
    from broker_edge.security.access import member_access

    class Leader:
        def __init__(self) -> None:
            self.next = 0

        def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
            first, self.next = self.next, self.next + len(messages)
            link.answer(batch, [ForwardAck(0, offset) for offset in range(first, self.next)])

        def unlogged(self, message: Message) -> None:
            raise AssertionError("nothing unlogged is sent")

    class Forwarder:
        def forwarded(self, link: PeerLink, batch: int, messages: list[Message]) -> None:
            raise AssertionError("a forwards to b only")

        def unlogged(self, message: Message) -> None:
            raise AssertionError("nothing unlogged is sent")

    @web.middleware
    async def as_member_a(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        request[ACCESS] = member_access("a")
        return await handler(request)

    b = PeerLinks("b", None, Leader())
    app = web.Application(middlewares=[as_member_a])
    b.add_routes(app)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    a = PeerLinks("a", None, Forwarder())
    a.update({"a": "http://127.0.0.1:1", "b": f"http://127.0.0.1:{port}"})
    while not a.up("b"):
        await asyncio.sleep(0.01)
    link = a.link("b")
    while getattr(link, "format", 2) < 2:  # the peer's answer to the format question (a rev without it: none)
        await asyncio.sleep(0.01)
    batches = {
        topic: [Message(f"bench/{topic}", bytes(100), 1, False, None, f"device-{topic}")] * per_batch
        for topic in range(topics)
    }
    answered = 0
    lanes_done = asyncio.Event()
    open_lanes = topics
    deadline = time.monotonic() + seconds

    def send(topic: int) -> None:
        def done(acks: object) -> None:
            nonlocal answered, open_lanes
            answered += per_batch
            if time.monotonic() < deadline:
                send(topic)
                return
            open_lanes -= 1
            if not open_lanes:
                lanes_done.set()

        link.forward(f"bench/{topic}", batches[topic], done)

    started = time.process_time()
    for topic in range(topics):
        send(topic)
    await lanes_done.wait()
    cpu = time.process_time() - started
    await a.close()
    await b.close()
    await runner.cleanup()
    return 1e6 * cpu / answered


def _child(seconds: float) -> None:
    """Measure every shape with the ``broker_edge`` on ``sys.path``; print them as JSON."""
    import uvloop

    figures = {f"{t}x{k}": uvloop.run(_measure(t, k, seconds)) for t, k in SHAPES}
    print(json.dumps(figures))


def _run(source: Path, seconds: float) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", f"import bench.peer_link_bench as b; b._child({seconds})"],
        env={**os.environ, "PYTHONPATH": f"{source}{os.pathsep}{ROOT}"},
        cwd=source,
        check=True,
        capture_output=True,
        text=True,
    )
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", help="a commit whose peer link is measured too, taking turns")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sources = {"this checkout": ROOT}
    with tempfile.TemporaryDirectory(prefix="peer-link-bench-") as scratch:
        if args.against:
            sources[args.against] = tree_of(args.against, Path(scratch), "broker_edge")
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in sources}
        for _ in range(args.rounds):
            for name, source in sources.items():
                runs[name].append(_run(source, args.seconds))
    print(f"{'peer link':<16}" + "".join(f"{f'{t}x{k}':>22}" for t, k in SHAPES))
    for name, figures in runs.items():
        cells = []
        for t, k in SHAPES:
            shape = f"{t}x{k}"
            values = [run[shape] for run in figures]
            cells.append(f"{statistics.median(values):6.2f} ({', '.join(f'{v:.2f}' for v in values)})")
        print(f"{name:<16}" + "".join(f"{cell:>22}" for cell in cells))
    print("microseconds of CPU per answered publish (median, each round in brackets)")


if __name__ == "__main__":
    main()
