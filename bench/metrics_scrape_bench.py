"""A paho QoS 1 publisher's PUBACK times, alone and while 70 connections pipeline ``GET /metrics``.

    .venv/bin/python -m bench.metrics_scrape_bench [--seconds 10]

The broker runs in its own process (``BrokerProcess``, commitlog on), the scrapers in another
(``tests.e2e.observability.metrics_pipeliners``: 8 requests in flight per connection), the publisher here,
one message in flight. Printed: the PUBACK median and p90 for each phase, the answers the scrapers read, and
the pages the broker built for them and the seconds it spent on it (its own counters). Nothing is written
to bench/results.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt

from broker_edge.runtime.launcher import BrokerProcess

SCRAPERS = 70


def scrape_flat_out(port: int, seconds: float, answers: multiprocessing.Queue) -> None:
    """``SCRAPERS`` connections pipelining ``GET /metrics`` for ``seconds``; put the answers read."""
    from tests.e2e.observability.metrics_pipeliners import MetricsPipeliners

    pipeliners = MetricsPipeliners(port, connections=SCRAPERS).start()
    time.sleep(seconds)
    answers.put(pipeliners.answers)
    pipeliners.stop()


def puback_times(port: int, seconds: float) -> list[float]:
    """Seconds from each QoS 1 PUBLISH to its PUBACK, one in flight, for ``seconds``."""
    acknowledged = threading.Event()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="bench-device", protocol=mqtt.MQTTv5)
    client.on_publish = lambda *_: acknowledged.set()
    client.connect("127.0.0.1", port)
    client.loop_start()
    times: list[float] = []
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            acknowledged.clear()
            sent = time.monotonic()
            client.publish("devices/1/telemetry", b"x" * 64, qos=1)
            if not acknowledged.wait(30):
                raise RuntimeError("no PUBACK in 30 s")
            times.append(time.monotonic() - sent)
    finally:
        client.loop_stop()
        client.disconnect()
    return times


def page_counters(port: int) -> dict[str, float]:
    """The broker's counters of the pages it built."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        lines = answer.read().decode().splitlines()
    wanted = (
        "timestone_broker_metrics_pages_built_total",
        "timestone_broker_metrics_page_build_seconds_total",
    )
    return {line.split()[0]: float(line.split()[1]) for line in lines if line.startswith(wanted)}


def report(phase: str, times: list[float]) -> None:
    median, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
    print(f"{phase}: {len(times)} PUBACKs, median {median * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        broker = BrokerProcess(Path(directory), limits={"messages_per_second_per_client": 0}).start()
        try:
            report("alone", puback_times(broker.port, args.seconds))
            before = page_counters(broker.admin_port)
            answers: multiprocessing.Queue = multiprocessing.Queue()
            scrapers = multiprocessing.Process(
                target=scrape_flat_out, args=(broker.admin_port, args.seconds + 4, answers)
            )
            scrapers.start()
            time.sleep(2)  # every scraper connected and asking
            report(f"{SCRAPERS} connections pipelining /metrics", puback_times(broker.port, args.seconds))
            print(f"answers read by the scrapers: {answers.get(timeout=60)}")
            scrapers.join()
            after = page_counters(broker.admin_port)
            for name, value in after.items():
                print(f"{name}: +{value - before.get(name, 0.0):.3f}")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
