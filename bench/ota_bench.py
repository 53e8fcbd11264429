"""OTA fanout benchmark: one action row → 10,000 simulated devices, and rollout pacing accuracy.

    .venv/bin/python bench/ota_bench.py [--devices 10000] [--quick]

A Timestone broker runs as its own process, the fleet in a second one (neither shares a GIL with Spark), and
the actions job on a local Spark session in this one. Figures:

- broadcast: from the action row's commit, and from the job's publish, to 95 % and 100 % of devices having the
  action message, and to every device's final state recorded in Delta (action summary complete);
- rollout: a paced rollout's achieved rate against its configured ``max_per_minute``.

Writes ``bench/results/ota.md`` (``python -m bench`` folds it into ``bench/RESULTS.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.sysinfo import machine_info  # noqa: E402
from broker_edge.launcher import BrokerProcess  # noqa: E402

RESULTS = REPO / "bench" / "results" / "ota.md"


def fleet_process(port: int, count: int, commands: mp.Queue, answers: mp.Queue) -> None:
    """Runs the fleet; answers 'ready' once connected, then receive times and states on request."""
    from pipelines.fleet.device import DeviceBehaviour
    from pipelines.fleet.fleet import Fleet, FleetSpec

    async def main() -> None:
        spec = FleetSpec(
            brokers=[("127.0.0.1", port)], count=count, groups=["fleet"], connects_per_second=2000
        )
        behaviour = DeviceBehaviour(telemetry_interval_s=0, download_delay_s=(0.5, 1.5))
        fleet = Fleet(spec, behaviour)
        await fleet.start()
        loop = asyncio.get_running_loop()
        while fleet.connected() < count:
            await asyncio.sleep(0.2)
        answers.put(("ready", fleet.connected()))
        while True:
            command, arg = await loop.run_in_executor(None, commands.get)
            if command == "received":
                answers.put([d.received_at.get(arg) for d in fleet.devices])
            elif command == "stop":
                await fleet.stop()
                answers.put("stopped")
                return

    asyncio.run(main())


def register_devices(store, count: int) -> None:
    from pipelines.fleet.fleet import Fleet, FleetSpec

    ids = [d.device_id for d in Fleet(FleetSpec(brokers=[("x", 1)], count=count, groups=["fleet"])).devices]
    now = datetime.now(UTC)
    rows = [{"device_id": d, "group": "fleet", "last_seen": now, "firmware_version": "1.0.0"} for d in ids]
    store.append("devices", pa.Table.from_pylist(rows, schema=store.spec("devices").arrow_schema), "bench", 0)


def summary_row(store, action_id: str) -> dict | None:
    if not store.exists("action_summary"):
        return None
    table = store.read_arrow("action_summary")
    rows = table.filter(pc.equal(table["action_id"], action_id)).to_pylist()
    return rows[0] if rows else None


def published_times(store, action_id: str) -> list[float]:
    table = store.read_arrow("action_executions")
    table = table.filter(pc.equal(table["action_id"], action_id))
    return sorted(t.timestamp() for t in table["published_at"].to_pylist() if t is not None)


def wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def percentile(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1)]


def broadcast(store, commands: mp.Queue, answers: mp.Queue, devices: int, version: str) -> dict[str, float]:
    """Write one broadcast action row and time it to every device and to its final state in Delta."""
    from pipelines.actions.operator import NewAction, create_action

    action_id = create_action(
        store, NewAction(all_devices=True, version=version, url=f"https://example.invalid/fw-{version}.bin")
    )
    committed = time.time()
    wait(lambda: bool(published_times(store, action_id)), 120)
    published = published_times(store, action_id)[0]
    received: list[float | None] = []

    def all_received() -> bool:
        commands.put(("received", action_id))
        received[:] = answers.get(timeout=60)
        return all(r is not None for r in received)

    wait(all_received, 120)
    got = [r for r in received if r is not None]
    complete = wait(
        lambda: (s := summary_row(store, action_id)) is not None and s["action_state"] == "COMPLETED", 300
    )
    return {
        "committed": committed,
        "published": published,
        "p95": percentile(got, 95),
        "p100": max(got),
        "recorded": time.time(),
        "reached": len(got),
        "complete": complete,
    }


def run(devices: int, rollout_seconds: float) -> str:
    from pipelines.actions.config import ActionsConfig, BrokerEndpoint
    from pipelines.actions.job import start_actions_job
    from pipelines.actions.operator import NewAction, create_action
    from pipelines.spark_session import local_spark_session
    from sinks import open_table_store

    workdir = Path(tempfile.mkdtemp(prefix="timestone-ota-bench-"))
    handler = logging.FileHandler(REPO / "bench" / "results" / "ota-job.log", mode="w")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
    logging.getLogger("pipelines").addHandler(handler)
    logging.getLogger("pipelines").setLevel(logging.INFO)
    broker = BrokerProcess(
        workdir / "broker",
        limits={
            "max_connections": devices + 100,
            "new_connections_per_second": 5000,
            "new_connections_burst": 5000,
        },
        logging={"level": "WARNING"},
    ).start()
    port, offsets_port = broker.port, broker.offsets_port
    ctx = mp.get_context("spawn")
    commands, answers = ctx.Queue(), ctx.Queue()
    fleet = ctx.Process(target=fleet_process, args=(port, devices, commands, answers), daemon=True)
    lines: list[str] = []
    try:
        fleet.start()
        connect_started = time.monotonic()
        answers.get(timeout=300)  # ('ready', connected devices)
        connect_s = time.monotonic() - connect_started
        spark = local_spark_session("timestone-ota-bench", "local[2]")
        store = open_table_store(spark, str(workdir / "tables"), backend="delta-rs")
        register_devices(store, devices)
        config = ActionsConfig(
            tables_root=str(workdir / "tables"),
            checkpoint_root=str(workdir / "checkpoints"),
            brokers=[BrokerEndpoint(mqtt_port=port, offsets_api=f"http://127.0.0.1:{offsets_port}")],
            trigger_interval_s=1.0,
            tick_interval_s=0.5,
        )
        job = start_actions_job(spark, config, store)
        try:
            cold = broadcast(store, commands, answers, devices, "2.0.0")
            warm = broadcast(store, commands, answers, devices, "2.1.0")
            lines += [
                f"Broadcast of one action to {devices:,} connected devices (the fleet connected in "
                f"{connect_s:.1f} s). *Cold*: the first action after the job started (its first "
                "micro-batches start Python workers); *warm*: the next one.",
                "",
                "| measure | cold, from row commit | warm, from row commit | warm, from the job's publish |",
                "|---|---|---|---|",
            ]
            for label, key in (
                ("job picks up the row and publishes", "published"),
                ("95 % of devices have the message", "p95"),
                (f"100 % of devices have the message ({warm['reached']:,}/{devices:,})", "p100"),
                ("every device's final state recorded in Delta", "recorded"),
            ):
                from_publish = "—" if key == "published" else f"{warm[key] - warm['published']:.2f} s"
                cold_s, warm_s = cold[key] - cold["committed"], warm[key] - warm["committed"]
                lines.append(f"| {label} | {cold_s:.2f} s | {warm_s:.2f} s | {from_publish} |")
            reach = warm["p100"] - warm["published"]
            met = reach < 5 and warm["reached"] == devices and warm["complete"]
            lines += [
                "",
                f"Target: 10,000 devices reached within 5 s of the job picking up the action: "
                f"{'met' if met else 'NOT met'} ({reach:.2f} s warm, "
                f"{cold['p100'] - cold['published']:.2f} s cold).",
                "",
            ]
            rate = 1200
            rollout_id = create_action(
                store,
                NewAction(
                    all_devices=True,
                    version="3.0.0",
                    url="https://example.invalid/fw3.bin",
                    max_per_minute=rate,
                ),
            )
            wait(lambda: bool(published_times(store, rollout_id)), 60)
            first = published_times(store, rollout_id)[0]
            time.sleep(max(0.0, first + rollout_seconds - time.time()))
            window_end = time.time()
            times = published_times(store, rollout_id)
            achieved = len(times) / (window_end - first) * 60
            gaps = [b - a for a, b in itertools.pairwise(sorted(set(times)))]
            lines += [
                f"Paced rollout at max_per_minute={rate}: {len(times)} devices published in the "
                f"{window_end - first:.1f} s after the first publish → {achieved:.0f}/min "
                f"({achieved / rate * 100:.1f} % of configured; a rollout never runs ahead of its rate). "
                f"Publishes go out per tick (median gap between ticks that published "
                f"{statistics.median(gaps) if gaps else 0:.2f} s).",
                "",
            ]
        finally:
            job.stop()
            spark.stop()
    finally:
        commands.put(("stop", None))
        fleet.join(timeout=60)
        if fleet.is_alive():
            fleet.kill()
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="1,000 devices, short rollout")
    args = parser.parse_args(argv)
    devices = 1_000 if args.quick else args.devices
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    body = run(devices, rollout_seconds=5 if args.quick else 15)
    machine = machine_info()
    text = (
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {machine.cpu_model}, {machine.cores} cores; "
        "broker, fleet and Spark share the machine.\n\n" + body
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text("## OTA fanout\n\n" + text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
