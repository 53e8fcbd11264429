"""Broker memory per idle connection: RSS before and after N clients connect and sit idle."""

from __future__ import annotations

import time
from dataclasses import dataclass

from bench.brokers.base import RunningBroker
from bench.loadgen.processes import WorkerSet
from bench.loadgen.worker import WorkerSpec
from bench.sysinfo import rss_bytes


@dataclass(frozen=True)
class IdleResult:
    """Broker RSS with no clients and with `connected` idle clients."""

    connected: int
    rss_before: int
    rss_after: int
    connect_seconds: float

    @property
    def bytes_per_connection(self) -> float:
        """(RSS after - RSS before) / connections."""
        return (self.rss_after - self.rss_before) / self.connected if self.connected else float("nan")


def run_idle(
    broker: RunningBroker,
    clients: int,
    settle_s: float = 1.0,
    cpus: set[int] | None = None,
    timeout_s: float = 120,
) -> IdleResult:
    """Connect `clients` idle clients (keepalive 600 s, clean session), measure, disconnect them."""
    time.sleep(settle_s)
    before = rss_bytes(broker.pid)
    started = time.monotonic()
    with WorkerSet() as workers:
        connected = workers.start(
            WorkerSpec(
                role="idle",
                port=broker.port,
                clients=clients,
                client_prefix="bench-idle-",
                connect_concurrency=100,
                connect_timeout_s=timeout_s,
                cpus=tuple(sorted(cpus)) if cpus else None,
            ),
            ready_timeout=timeout_s + 30,
        )
        connect_seconds = time.monotonic() - started
        time.sleep(settle_s)
        after = rss_bytes(broker.pid)
        workers.send_all(("close",))
        workers.reports(timeout=30)
    return IdleResult(connected, before, after, connect_seconds)
