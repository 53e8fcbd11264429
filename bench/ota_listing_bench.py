"""What the reports stream's listing costs at each trigger: per-device report topics against bucket ones.

    .venv/bin/python bench/ota_listing_bench.py --devices 10000

A broker process holds one report on each of N per-device topics ``devices/<id>/actions`` (the earlier
protocol) and one on each bucket report topic ``actions/reports/<bucket>`` (as N devices fill them), and the
bytes and time of one listing of each filter over the offsets API are measured, as the reports stream lists
them at every trigger; and of a filter that the per-device topics' names are checked against but none match.
No Spark.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ota_bench import broker_limits  # noqa: E402
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402
from pipelines.actions.buckets import DEFAULT_BUCKETS, REPORT_TOPICS, bucket_of, report_topic  # noqa: E402
from pipelines.actions.publisher import MqttPublisher, Outgoing  # noqa: E402

PER_DEVICE = "devices/+/actions"
NONE_PER_DEVICE = "devices/+/absent"
"""Matches none of the per-device topics but is checked against each: the earlier protocol's filter when
every device is on bucket report topics and ``devices/<id>/...`` logs (telemetry) exist."""


def listing(offsets_url: str, pattern: str, repeat: int) -> tuple[int, int, float]:
    """Logs listed, bytes of the answer, median seconds of ``repeat`` listings."""
    url = f"{offsets_url}/v1/logs?pattern={urllib.parse.quote(pattern, safe='')}"
    timings, body = [], b""
    for _ in range(repeat):
        started = time.perf_counter()
        body = urllib.request.urlopen(url, timeout=30).read()
        timings.append(time.perf_counter() - started)
    return body.count(b'"topic"'), len(body), statistics.median(timings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    ids = [f"dev-{i:06d}" for i in range(args.devices)]
    with tempfile.TemporaryDirectory(prefix="timestone-ota-listing-") as workdir:
        quiet = {"level": "WARNING"}
        with BrokerProcess(Path(workdir) / "broker", limits=broker_limits(0), logging=quiet) as broker:
            publisher = MqttPublisher([broker.address], client_id="reports")
            try:
                publisher.publish_many([Outgoing(f"devices/{d}/actions", b"{}") for d in ids])
                reports = [Outgoing(report_topic(bucket_of(d, args.buckets)), b"{}") for d in ids]
                publisher.publish_many(reports)
            finally:
                publisher.close()
            load = os.getloadavg()[0]
            print(f"{args.devices:,} devices, {args.buckets:,} buckets; load average {load:.1f}")
            for pattern in (PER_DEVICE, REPORT_TOPICS, NONE_PER_DEVICE):
                logs, size, seconds = listing(broker.offsets_url, pattern, args.repeat)
                print(f"{pattern}: {logs:,} logs, {size:,} bytes, median {seconds * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
