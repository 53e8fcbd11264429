"""The job side of OTA at a fleet size one broker cannot hold here: N devices' reports into Delta.

    flock /tmp/timestone-heavy.lock .venv/bin/python bench/ota_reports_bench.py --devices 50000

One action lists N device ids (the job publishes one message per device bucket; no device is connected).
Once the job has written its N ``QUEUED`` executions, ``--clients`` MQTT clients publish each device's
``IN_PROGRESS`` and then its ``SUCCEEDED`` report on the device's bucket report topic, as N devices would.
Timed from the first report's publish: every report acknowledged by the broker (durable in its log), and
every final state counted in ``action_summary``. Each reports micro-batch (rows and Spark's milliseconds per
step) goes to the job log, with the engine's own time per batch.

What it shows: the broker's logs, the reports stream and the engine fold N devices' reports into Delta, and
how fast. What it does not: N device connections on one broker, the fanout to them, or device receipt
(bench/ota_bench.py measures those with a connected fleet). Prints a section for bench/results/ota.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.ota_bench import broker_limits, log_progress, terminal_count  # noqa: E402
from bench.sysinfo import cpu_seconds, machine_info  # noqa: E402
from broker_edge.offsets_api.client import OffsetsClient  # noqa: E402
from broker_edge.runtime.launcher import BrokerProcess  # noqa: E402
from pipelines.actions.buckets import DEFAULT_BUCKETS, REPORT_TOPICS, bucket_of, report_topic  # noqa: E402
from pipelines.actions.publisher import Outgoing  # noqa: E402

JOB_LOG = REPO / "bench" / "results" / "ota-job.log"


def reports(action_id: str, device_ids: list[str], state: str, seq: int, buckets: int) -> list[Outgoing]:
    """One report per device, each on its bucket's report topic."""
    now = int(time.time() * 1000)
    return [
        Outgoing(
            report_topic(bucket_of(device_id, buckets)),
            json.dumps(
                {"action_id": action_id, "device_id": device_id, "state": state, "seq": seq, "ts": now}
            ).encode(),
        )
        for device_id in device_ids
    ]


def publish_reports(
    broker: BrokerProcess, action_id: str, ids: list[str], clients: int, buckets: int
) -> None:
    """Every device's IN_PROGRESS then SUCCEEDED report, from ``clients`` clients at once; returns when the
    broker has acknowledged all of them."""
    from pipelines.actions.publisher import MqttPublisher

    def run(part: list[str], number: int) -> None:
        publisher = MqttPublisher([broker.address], client_id=f"reports-{number}")
        try:
            publisher.publish_many(reports(action_id, part, "IN_PROGRESS", 1, buckets))
            publisher.publish_many(reports(action_id, part, "SUCCEEDED", 2, buckets))
        finally:
            publisher.close()

    threads = [
        threading.Thread(target=run, args=(ids[number::clients], number), name=f"reports-{number}")
        for number in range(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def wait_until(predicate, timeout_s: float) -> float | None:
    """When (epoch seconds) ``predicate`` first held, polled every 250 ms; None if it never did."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return time.time()
        time.sleep(0.25)
    return None


def run(args, workdir: Path) -> dict:
    from pipelines.actions.config import ActionsConfig, BrokerEndpoint
    from pipelines.actions.job import start_actions_job
    from pipelines.actions.operator import NewAction, create_action
    from pipelines.spark_session import local_spark_session
    from sinks import open_table_store

    facts: dict = {"load_before": os.getloadavg(), "start": datetime.now(UTC)}
    broker = BrokerProcess(workdir / "broker", limits=broker_limits(0), logging={"level": "WARNING"}).start()
    assert broker.process is not None  # started
    broker_pid = broker.process.pid
    try:
        spark = local_spark_session("timestone-ota-reports-bench", "local[2]")
        spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
        store = open_table_store(spark, str(workdir / "tables"), backend="delta-rs")
        config = ActionsConfig(
            tables_root=str(workdir / "tables"),
            checkpoint_root=str(workdir / "checkpoints"),
            brokers=[BrokerEndpoint(mqtt_port=broker.port, offsets_api=broker.offsets_url)],
            trigger_interval_s=args.trigger_interval,
            device_buckets=args.buckets,
        )
        job = start_actions_job(spark, config, store)
        try:
            job.process_available()
            ids = [f"dev-{i:06d}" for i in range(args.devices)]
            action = NewAction(
                device_ids=ids, version="2.0.0", url="https://example.invalid/fw-2.0.0.bin", sha256="0" * 64
            )
            create_action(store, action)
            queued = wait_until(lambda: _summary_total(store, action.action_id) >= args.devices, 120)
            facts["queued"] = queued is not None
            cpu_before = cpu_seconds(broker_pid), cpu_seconds(os.getpid())
            started = time.time()
            publish_reports(broker, action.action_id, ids, args.clients, args.buckets)
            facts["acknowledged_s"] = time.time() - started
            final = wait_until(lambda: terminal_count(store, action.action_id) >= args.devices, 180)
            facts["delta_s"] = None if final is None else final - started
            facts["final_count"] = terminal_count(store, action.action_id)
            wall = time.time() - started
            cpu_after = cpu_seconds(broker_pid), cpu_seconds(os.getpid())
            facts["broker_cpu"] = (cpu_after[0] - cpu_before[0]) / wall * 100
            facts["job_cpu"] = (cpu_after[1] - cpu_before[1]) / wall * 100
            facts["report_logs"] = len(OffsetsClient(broker.offsets_url).list_logs(REPORT_TOPICS))
            query = job.reports.query
            facts["batches"] = [
                (p.batchId, p.numInputRows, dict(p.durationMs))
                for p in (query.recentProgress if query is not None else [])
                if p.numInputRows
            ]
        finally:
            log_progress(job)
            job.stop()
            spark.stop()
    finally:
        broker.stop()
    facts["load_after"] = os.getloadavg()
    return facts


def _summary_total(store, action_id: str) -> int:
    import pyarrow.compute as pc

    if not store.exists("action_summary"):
        return 0
    table = store.read_arrow("action_summary")
    rows = table.filter(pc.equal(table["action_id"], action_id)).to_pylist()
    return rows[0]["total_count"] if rows else 0


def report(args, facts: dict) -> str:
    machine = machine_info()
    delta = facts["delta_s"]
    lines = [
        f"**`bench/ota_reports_bench.py --devices {args.devices} --clients {args.clients}`**, "
        f"{facts['start']:%Y-%m-%d %H:%M} UTC, {machine.cores} cores ({machine.cpu_model}); load average "
        f"{facts['load_before'][0]:.1f} before, {facts['load_after'][0]:.1f} after.",
        "",
        f"- reports: {2 * args.devices:,} ({args.devices:,} devices, IN_PROGRESS and SUCCEEDED each) on "
        f"{facts['report_logs']:,} report logs ({args.buckets:,} buckets)",
        f"- every report acknowledged by the broker: {facts['acknowledged_s']:.2f} s after the first publish",
        f"- every final state in `action_summary`: "
        f"{'not within 180 s' if delta is None else f'{delta:.2f} s'} after the first publish "
        f"({facts['final_count']:,} of {args.devices:,})",
        "- CPU (% of one core, from the first publish to the last final state): "
        f"broker {facts['broker_cpu']:.0f} %, "
        f"job + Spark + publishing clients {facts['job_cpu']:.0f} %",
        "",
        "| reports batch | rows | latestOffset ms | addBatch ms | triggerExecution ms |",
        "|---|---|---|---|---|",
    ]
    for batch_id, rows, durations in facts["batches"]:
        steps = (durations.get(step, "—") for step in ("latestOffset", "addBatch", "triggerExecution"))
        lines.append(f"| {batch_id} | {rows:,} | " + " | ".join(str(step) for step in steps) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=4, help="MQTT clients publishing the reports")
    parser.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS)
    parser.add_argument("--trigger-interval", type=float, default=0.5)
    args = parser.parse_args(argv)
    if args.buckets < 1 or args.clients < 1 or args.devices < 1:
        parser.error("--devices, --clients and --buckets must be at least 1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    job_log = logging.FileHandler(JOB_LOG, mode="w")
    job_log.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(name)s %(message)s"))
    logging.getLogger("pipelines").addHandler(job_log)
    logging.getLogger("pipelines").setLevel(logging.INFO)
    workdir = Path(tempfile.mkdtemp(prefix="timestone-ota-reports-bench-"))
    try:
        facts = run(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(report(args, facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
