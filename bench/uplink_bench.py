"""Edge uplink: a site's backlog to its hub (records/s, MB/s, bytes on the wire per record by compression),
the publish → durable-on-the-hub latency, and one hub taking 20 sites at once.

    .venv/bin/python -m bench.uplink_bench [--output bench/results/uplink.md]

The hub is a broker in its own process (``timestone broker`` with ``uplink_hub:``, mutual TLS on loopback);
the sites run in this process, on one event loop. A backlog is written into a site's commitlog before the
site starts (an hour of 100 devices at one reading a second: 360,000 JSON readings of about 120 bytes, over
100 topics), then the site dials the hub and the clock runs until the hub has acknowledged every record
(durable there, ``storage.durability: group``). The same backlog is sent with each compression in turn.
Latency: once caught up, the site publishes a reading every 10 ms (``Broker.publish``, QoS 1, through the
PUBLISH path: durable on the site first), and a task polling every millisecond sees the hub's acknowledgement
of it; the figure is publish → acknowledged (durable on the hub), as the site sees it. 20 sites: each with a
backlog of 18,000 readings (a twentieth), all started at once, timed until the hub has every record.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import run_and_write
from bench.sysinfo import machine_info
from broker_edge.config import load_dataclass
from broker_edge.runtime.broker import Broker
from broker_edge.runtime.launcher import BrokerProcess, free_port
from broker_edge.runtime.local_pki import LocalPki
from broker_edge.settings.broker import BrokerConfig
from broker_edge.storage import AppendRecord, LogStore, StorageConfig

HOUR_OF_READINGS = 360_000
DEVICES = 100
SITES = 20
LATENCY_SAMPLES = 300
MB = 1_000_000
SHARED_MACHINE = (
    "**The machine was shared with other work while this ran**: absolute figures are low "
    "and noisy; compare rows of one run. The hub is a broker in its own process, the sites run in this "
    "one (one event loop), both `durability: group` on one disk."
)


def reading(device: int, second: int, rng: random.Random) -> bytes:
    document = {
        "device": f"dev-{device:04d}",
        "ts": 1_760_000_000_000 + second * 1000,
        "temperature": round(20 + rng.gauss(0, 2), 2),
        "humidity": round(45 + rng.gauss(0, 5), 1),
        "status": "ok",
    }
    return json.dumps(document).encode()


def write_backlog(directory: Path, records: int, seed: int) -> int:
    """``records`` readings over ``DEVICES`` topics in a fresh commitlog; returns their stored bytes."""
    rng = random.Random(seed)
    with LogStore(directory, StorageConfig(durability="none")) as store:
        for n in range(records):
            device = n % DEVICES
            store.append(
                f"plant/line-{device % 10}/dev-{device:04d}/telemetry",
                AppendRecord(reading(device, n // DEVICES, rng), qos=1, client_id=f"dev-{device:04d}"),
            )
        store.flush()
        return sum(info.bytes for info in store.logs())


def site_config(
    directory: Path, pki: LocalPki, site_id: str, hub_port: int, compression: str
) -> BrokerConfig:
    pair = pki.site(site_id)
    document: dict[str, Any] = {
        "listeners": [{"name": "tcp", "host": "127.0.0.1", "port": 0}],
        "admin_http": {"enabled": False},
        "offsets_api": {"enabled": False},
        "sys_topics": {"enabled": False},
        "storage": {"directory": str(directory), "durability": "group"},
        "uplink": {
            "hubs": [f"wss://127.0.0.1:{hub_port}/v1/uplink"],
            "site_id": site_id,
            "tls": {"certfile": str(pair.cert), "keyfile": str(pair.key), "cafile": str(pki.ca.cert)},
            "compression": compression,
            "downlink": [],
            "reconnect_min_s": 0.05,
        },
    }
    return load_dataclass(BrokerConfig, document)


def start_hub(directory: Path, pki: LocalPki) -> tuple[BrokerProcess, int]:
    server = pki.server("hub")
    port = free_port()
    tls = {"certfile": str(server.cert), "keyfile": str(server.key), "cafile": str(pki.ca.cert)}
    hub = BrokerProcess(
        directory,
        "hub",
        uplink_hub={"tls": tls, "host": "127.0.0.1", "port": port},
        storage={"directory": str(directory / "data"), "durability": "group"},
    ).start()
    return hub, port


def acknowledged(broker: Broker) -> int:
    link = broker.site_link
    assert link is not None
    return sum(link.hub_ends.values())


async def send_backlogs(sites: list[Broker], records: int) -> float:
    """Start every site, wait until the hub acknowledged ``records`` of each; the seconds it took."""
    began = time.perf_counter()
    for site in sites:
        await site.start()
    while any(acknowledged(site) < records for site in sites):
        await asyncio.sleep(0.01)
    return time.perf_counter() - began


async def latencies(site: Broker) -> list[float]:
    """Publish → acknowledged by the hub, in ms, for one reading every 10 ms."""
    link = site.site_link
    assert link is not None
    rng = random.Random(7)
    samples: list[float] = []
    topic = "plant/line-0/dev-0000/telemetry"
    for n in range(LATENCY_SAMPLES):
        target = acknowledged(site) + 1
        began = time.perf_counter()
        site.publish(topic, reading(0, 10_000 + n, rng), qos=1)
        while acknowledged(site) < target:
            await asyncio.sleep(0.001)
        samples.append((time.perf_counter() - began) * 1000)
        await asyncio.sleep(0.01)
    return samples


def run(directory: Path) -> dict[str, Any]:
    pki = LocalPki(directory / "pki", name="bench-ca")
    results: dict[str, Any] = {"backlog": [], "machine": machine_info()}
    for compression in ("zstd", "zlib", "none"):
        hub, port = start_hub(directory / f"hub-{compression}", pki)
        try:
            site_dir = directory / f"site-{compression}"
            stored = write_backlog(site_dir, HOUR_OF_READINGS, seed=1)
            site = Broker(site_config(site_dir, pki, "plant-1", port, compression))

            async def backlog_and_latency(
                site: Broker = site, measure: bool = compression == "zstd"
            ) -> tuple[float, list[float]]:
                seconds = await send_backlogs([site], HOUR_OF_READINGS)
                samples = await latencies(site) if measure else []
                await site.stop()
                return seconds, samples

            seconds, samples = asyncio.run(backlog_and_latency())
            link = site.site_link
            assert link is not None
            results["backlog"].append((compression, seconds, stored, link.sent_bytes, link.stored_bytes))
            if samples:
                results["latency"] = samples
        finally:
            hub.stop()
    hub, port = start_hub(directory / "hub-sites", pki)
    try:
        each = HOUR_OF_READINGS // SITES
        stored = sum(write_backlog(directory / f"site-{n}", each, seed=n) for n in range(SITES))
        sites = [
            Broker(site_config(directory / f"site-{n}", pki, f"plant-{n}", port, "zstd"))
            for n in range(SITES)
        ]

        async def all_sites() -> float:
            seconds = await send_backlogs(sites, each)
            for site in sites:
                await site.stop()
            return seconds

        results["sites"] = (asyncio.run(all_sites()), each * SITES, stored)
    finally:
        hub.stop()
    return results


def render(results: dict[str, Any], command: str) -> str:
    machine = results["machine"]
    lines = [
        "## Edge uplink",
        "",
        f"Run with `{command}` on {machine.cores} CPUs ({machine.cpu_model}), Python {machine.python}, "
        f"{time.strftime('%Y-%m-%d', time.gmtime())}, load average {os.getloadavg()[0]:.1f} at the end. "
        + SHARED_MACHINE,
        "",
        f"An hour's backlog of one site ({HOUR_OF_READINGS:,} JSON readings, {DEVICES} topics), sent from a "
        "standing start until the hub acknowledged every record (durable there):",
        "",
        "| compression | seconds | records/s | MB/s stored | bytes on the wire per record | wire / stored |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for compression, seconds, stored, wire, _sent_stored in results["backlog"]:
        rate = HOUR_OF_READINGS / seconds
        lines.append(
            f"| {compression} | {seconds:.1f} | {rate:,.0f} | {stored / seconds / MB:.1f} | "
            f"{wire / HOUR_OF_READINGS:.1f} | {wire / stored:.2f} |"
        )
    samples = sorted(results["latency"])
    p50 = statistics.median(samples)
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    seconds, records, stored = results["sites"]
    single = next(row for row in results["backlog"] if row[0] == "zstd")
    lines += [
        "",
        f"Publish → durable on the hub (a reading every 10 ms once caught up, {len(samples)} samples, zstd): "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {samples[-1]:.1f} ms.",
        "",
        f"{SITES} sites at once, each with a twentieth of the hour ({records // SITES:,} readings): "
        f"{records:,} records in {seconds:.1f} s, {records / seconds:,.0f} records/s "
        f"({stored / seconds / MB:.1f} MB/s stored) into one hub, "
        f"{records / seconds / (HOUR_OF_READINGS / single[1]):.2f}x the one-site rate of the same run.",
        "",
        "Catch-up after an hour's backlog is the first table: at the zstd rate, an hour of 100 devices "
        f"crosses in {single[1]:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_and_write(argv, "uplink", __doc__, run, render)


if __name__ == "__main__":
    sys.exit(main())
