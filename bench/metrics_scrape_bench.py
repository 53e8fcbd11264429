"""A paho QoS 1 publisher's PUBACK times, alone and while 70 connections pipeline one HTTP request: ``GET
/metrics`` (the default) or another endpoint of the admin port or the offsets API.

    .venv/bin/python -m bench.metrics_scrape_bench [--endpoint metrics] [--token valid|none|wrong]
        [--topics 20000] [--seconds 10]

The broker runs in its own process (``BrokerProcess``, commitlog on, the offsets API asking a reader
token), the askers in another (``tests.e2e.http_pipeliners``: 8 requests in flight per connection, a
connection closed by its answer opened again at once), the publisher here, one message in flight. Before
the phases, ``--topics`` topics get a record each and ``bench/records`` 1,000 records. ``--token``: the
askers of the offsets API send the reader's token, none, or a wrong one. Printed: the PUBACK median and p90
for each phase, the answers the askers read by status, the broker's CPU seconds during the second phase,
and for ``/metrics`` the pages the broker built and the seconds it spent on them (its own counters).
Nothing is written to bench/results.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import paho.mqtt.client as mqtt

from bench.topic_load import publish_rounds
from broker_edge.runtime.launcher import BrokerProcess

SCRAPERS = 70
TOKEN = "bench-reader-secret"
RECORDS_TOPIC = "bench/records"
FETCHED = [f"fleet/device-{number:05}/telemetry" for number in range(20)]

ADMIN_ENDPOINTS = {"metrics": "/metrics", "health": "/health"}
"""The admin port's endpoints (no token)."""
OFFSETS_ENDPOINTS = {
    "logs": ("GET", "/v1/logs", b""),
    "log": ("GET", "/v1/logs/bench%2Frecords", b""),
    "records": ("GET", "/v1/logs/bench%2Frecords/records?offset=earliest", b""),
    "offset": ("GET", "/v1/logs/bench%2Frecords/offset?timestamp_ms=0", b""),
    "fetch": (
        "POST",
        "/v1/fetch",
        json.dumps({"fetches": [{"topic": t, "offset": 0} for t in FETCHED]}).encode(),
    ),
    "partitions": ("GET", "/v1/partitions", b""),
    "partition": ("GET", "/v1/partitions/0/records?position=0&max_entries=2000", b""),
}
"""The offsets API's endpoints: method, path, body."""


def asked_request(endpoint: str, token: str) -> tuple[str, bytes]:
    """Which port (``admin`` or ``offsets``) and the bytes of the request asked flat out."""
    from tests.e2e.http_pipeliners import http_request

    if endpoint in ADMIN_ENDPOINTS:
        return "admin", http_request(ADMIN_ENDPOINTS[endpoint])
    method, path, body = OFFSETS_ENDPOINTS[endpoint]
    secret = {"valid": TOKEN, "wrong": "not-" + TOKEN, "none": None}[token]
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    if body:
        headers["Content-Type"] = "application/json"
    return "offsets", http_request(path, method, headers, body)


def ask_flat_out(port: int, request: bytes, seconds: float, answers: multiprocessing.Queue) -> None:
    """``SCRAPERS`` connections pipelining ``request`` for ``seconds``; put what they read."""
    from tests.e2e.http_pipeliners import HttpPipeliners

    pipeliners = HttpPipeliners(port, connections=SCRAPERS, request=request).start()
    time.sleep(seconds)
    answers.put(
        {
            "answers": pipeliners.answers,
            "statuses": dict(pipeliners.statuses),
            "reopened": pipeliners.reopened,
            "failures": len(pipeliners.failures),
        }
    )
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


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU seconds so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(phase: str, times: list[float]) -> None:
    median, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
    print(f"{phase}: {len(times)} PUBACKs, median {median * 1000:.2f} ms, p90 {p90 * 1000:.2f} ms")


def fill(port: int, topics: int) -> None:
    """A record on each of ``topics`` topics, and 1,000 on ``RECORDS_TOPIC``."""
    names = [f"fleet/device-{number:05}/telemetry" for number in range(topics)]
    shares = [names[start::20] for start in range(20)] + [[RECORDS_TOPIC] * 1000]
    publish_rounds(port, shares, b"x" * 64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", choices=[*ADMIN_ENDPOINTS, *OFFSETS_ENDPOINTS], default="metrics")
    parser.add_argument("--token", choices=["valid", "none", "wrong"], default="valid")
    parser.add_argument("--topics", type=int, default=20_000, help="topics holding a record each")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each phase")
    args = parser.parse_args()
    side, request = asked_request(args.endpoint, args.token)
    with tempfile.TemporaryDirectory() as directory:
        broker = BrokerProcess(
            Path(directory),
            limits={"messages_per_second_per_client": 0, "new_connections_per_second": 0},
            offsets_api={"tokens": [{"name": "bench", "token": TOKEN}]},
        ).start()
        try:
            assert broker.process is not None
            if side == "offsets":
                fill(broker.port, args.topics)
            report("alone", puback_times(broker.port, args.seconds))
            before = page_counters(broker.admin_port)
            port = broker.admin_port if side == "admin" else broker.offsets_port
            answers: multiprocessing.Queue = multiprocessing.Queue()
            askers = multiprocessing.Process(
                target=ask_flat_out, args=(port, request, args.seconds + 4, answers)
            )
            askers.start()
            time.sleep(2)  # every asker connected and asking
            cpu_before = cpu_seconds(broker.process.pid)
            phase = f"{SCRAPERS} connections pipelining {args.endpoint}"
            report(
                phase + (f" (token {args.token})" if side == "offsets" else ""),
                puback_times(broker.port, args.seconds),
            )
            cpu = cpu_seconds(broker.process.pid) - cpu_before
            print(f"broker CPU during it: {cpu:.2f} s in {args.seconds:.0f} s")
            print(f"what the askers read: {answers.get(timeout=60)}")
            askers.join()
            after = page_counters(broker.admin_port)
            for name, value in after.items():
                print(f"{name}: +{value - before.get(name, 0.0):.3f}")
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
