"""TLS handshakes a listener completes per second: the broker accepting its TLS sockets itself
(``broker_edge.http.tls_accept``, so that a failed handshake is known with its peer and reason) against
the event loop's own TLS server (``loop.create_server(ssl=...)``, which drops a failed handshake unseen).

Both servers run in this process on uvloop (as the broker does), with a protocol that takes the connection
and closes it; the clients run in a separate process (their TLS work does not share this one's interpreter),
``--concurrency`` handshakes in flight, ``--handshakes`` per round. The two servers take turns, ``--rounds``
rounds each; the result is each one's median rate and their ratio, measured in the same run, and the CPU the
rest of the machine used meanwhile. Writes its section into ``bench/results/tls-accept.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import resource
import ssl
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvloop

from bench.sysinfo import machine_busy_seconds, machine_info, machine_load_sentence
from broker_edge.http.tls_accept import start_tls_server
from broker_edge.security.tls import TlsConfig, server_ssl_context
from tests.tls_certs import make_test_pki

RESULTS = Path(__file__).parent / "results" / "tls-accept.md"


class _Taken(asyncio.Protocol):
    """A server connection that closes as soon as the handshake is done."""

    def connection_made(self, transport: Any) -> None:
        transport.close()


def _clients(port: int, ca_file: str, handshakes: int, concurrency: int, out: Any) -> None:
    """In the client process: ``handshakes`` TLS connections to ``port``, ``concurrency`` at once."""
    context = ssl.create_default_context(cafile=ca_file)

    async def run() -> float:
        left = [handshakes]

        async def one_after_another() -> None:
            while left[0] > 0:
                left[0] -= 1
                _reader, writer = await asyncio.open_connection(
                    "127.0.0.1", port, ssl=context, server_hostname="localhost"
                )
                writer.close()

        started = time.perf_counter()
        await asyncio.gather(*(one_after_another() for _ in range(concurrency)))
        return time.perf_counter() - started

    out.send(asyncio.run(run()))


async def _round(kind: str, server_context: ssl.SSLContext, ca_file: str, args: argparse.Namespace) -> float:
    """Handshakes per second of one round against the ``kind`` server."""
    server: Any
    if kind == "loop":
        server = await asyncio.get_running_loop().create_server(
            _Taken, "127.0.0.1", 0, ssl=server_context, ssl_handshake_timeout=10
        )
    else:
        server = await start_tls_server(_Taken, "127.0.0.1", 0, server_context, 10, lambda *_failure: None)
    port = server.sockets[0].getsockname()[1]
    receive, send = multiprocessing.Pipe(duplex=False)
    client = multiprocessing.Process(
        target=_clients, args=(port, ca_file, args.handshakes, args.concurrency, send)
    )
    client.start()
    seconds = await asyncio.get_running_loop().run_in_executor(None, receive.recv)
    client.join()
    server.close()
    await server.wait_closed()
    return args.handshakes / seconds


async def _measure(args: argparse.Namespace, pki_dir: Path) -> dict[str, list[float]]:
    pki = make_test_pki(pki_dir)
    context = server_ssl_context(TlsConfig(certfile=str(pki.server_cert), keyfile=str(pki.server_key)))
    rates: dict[str, list[float]] = {"loop": [], "broker": []}
    for _ in range(args.rounds):
        for kind in rates:
            rates[kind].append(await _round(kind, context, str(pki.ca_cert), args))
    return rates


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tls_accept_bench", description=__doc__)
    parser.add_argument("--handshakes", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tls-accept-") as tmp:
        busy, started, ours = machine_busy_seconds(), time.monotonic(), time.process_time()
        rates = uvloop.run(_measure(args, Path(tmp)))
        wall = time.monotonic() - started
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the client processes: our own load
        ours = time.process_time() - ours + children.ru_utime + children.ru_stime
        other_cpu = max(0.0, (machine_busy_seconds() - busy - ours) / wall)
    loop_rate, broker_rate = statistics.median(rates["loop"]), statistics.median(rates["broker"])
    m = machine_info()
    now = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## TLS accept",
        "",
        f"Written by `python -m bench.tls_accept_bench` on {now}, {wall:.0f} s. Machine: {m.cpu_model}, "
        f"{m.cores} CPUs, {m.memory_gib:.1f} GiB, {m.kernel}, Python {m.python}; uvloop. Server and client "
        "processes share the machine (no pinning).",
        "",
        f"Other processes used {other_cpu:.0%} of a CPU on average during the run ("
        + machine_load_sentence(
            other_cpu,
            "both rates are lower than on an idle machine; their ratio, measured "
            "in turns in the same run, is the figure to read",
        )
        + ").",
        "",
        f"{args.rounds} rounds of {args.handshakes:,} TLS 1.3 handshakes per server, {args.concurrency} in "
        "flight, the servers taking turns; the server closes each connection once its handshake is done.",
        "",
        "| server | handshakes/s (median) | rounds |",
        "|---|---:|---|",
        f"| the loop's own (`create_server(ssl=...)`) | {loop_rate:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in rates["loop"])
        + " |",
        f"| the broker's (`http.tls_accept`) | {broker_rate:,.0f} | "
        + ", ".join(f"{r:,.0f}" for r in rates["broker"])
        + " |",
        "",
        f"Ratio broker / loop: {broker_rate / loop_rate:.2f}.",
        "",
    ]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("\n".join(lines))
    sys.stdout.write("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
