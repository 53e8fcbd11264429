"""The telemetry job's duplicate check alone: its streaming part on the same rows with and without it, in
this checkout and in another, side by side.

    .venv/bin/python -m bench.dedup_bench [--rows 100000] [--devices 100] [--rounds 3] [--against COMMIT]

Rows shaped like the source's (JSON readings like the simulated fleet's, one topic per device, one reading
in a hundred resent through a second broker) are written once as a Parquet file. Each measurement is a
streaming query over that file, one micro-batch (``availableNow``), running the job's streaming part
(``pipelines.telemetry.job.telemetry_rows``: the ingest stamp, the payload parsed, the expectations, the
duplicate flags in the RocksDB state store); ``foreachBatch`` caches the batch and counts its duplicates,
as the job's first step does. The reference is the same query with ``dedup.message_id_fields`` empty (no
duplicate check: no shuffle, no Python). The difference between the two is the check's cost, the
reference's time the rest of the streaming part's. ``--against COMMIT`` (repeatable) measures that
commit's code too (a copy from ``git archive``) in the same run: each code runs in a fresh local[2] Spark
process of its own (its code on ``PYTHONPATH``, Spark's Python workers included), runs with and without
the check alternating after one unmeasured pair. Figures are the batch's ``addBatch`` time
(Spark's own step timer) and the CPU seconds of the Spark process tree (JVM and Python workers).
Printed as markdown; ``--output FILE`` also writes it there as a section.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HEADING = "### The duplicate check alone"


def write_rows(path: Path, rows: int, devices: int) -> int:
    """``rows`` source rows over ``devices`` topics as one Parquet file; a reading in 100 is resent (the
    same message through broker ``edge2``). Returns how many are resends."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from sources.slice_reader import SOURCE_ARROW_SCHEMA

    rng = random.Random(7)
    start_ms = 1_764_000_000_000
    columns: dict[str, list[Any]] = {name: [] for name in SOURCE_ARROW_SCHEMA.names}
    resent = 0
    for index in range(rows):
        device, seq = index % devices, index // devices
        if seq and rng.random() < 0.01:  # the device's previous reading again, via another broker
            seq, broker = seq - 1, "edge2"
            resent += 1
        else:
            broker = "edge1"
        reading = {
            "ts": start_ms + 1000 * seq,
            "seq": seq + 1,
            "temperature": round(rng.gauss(21.0, 3.0), 2),
            "humidity": round(rng.gauss(45.0, 10.0), 1),
            "battery": round(rng.uniform(20.0, 100.0), 1),
            "firmware": "1.0.0",
            "group": "fleet",
        }
        values = (
            broker,
            f"devices/bench-{device:04}/telemetry",
            index,
            datetime.fromtimestamp((start_ms + 1000 * seq) / 1000 + 0.05, UTC),
            f"bench-{device:04}",
            1,
            False,
            [("content-type", "application/json")],
            json.dumps(reading).encode(),
        )
        for name, value in zip(SOURCE_ARROW_SCHEMA.names, values, strict=True):
            columns[name].append(value)
    pq.write_table(pa.table(columns, schema=SOURCE_ARROW_SCHEMA), path / "rows.parquet")
    return resent


SOURCE_DDL = (
    "broker string, topic string, offset bigint, timestamp timestamp, client_id string, qos int, "
    "retain boolean, properties map<string,string>, payload binary"
)


def measure(rows_dir: str, work: str, rounds: int) -> dict[str, Any]:
    """In this process (the checkout's code on ``sys.path``): ``rounds`` + 1 runs with and without the check,
    alternating, the first pair unmeasured. Returns each measured run's addBatch seconds, CPU seconds and
    rows flagged as duplicates."""
    from pyspark.sql import functions as F

    from bench.sysinfo import cpu_seconds, process_tree, spark_process_id
    from pipelines.spark_session import local_spark_session
    from pipelines.telemetry import job
    from pipelines.telemetry import quality as Q
    from pipelines.telemetry.config import DedupConfig, load_telemetry_config

    spark = local_spark_session("timestone-dedup-bench", "local[2]", conf=job.STATE_STORE_CONF)
    spark.sparkContext.setLogLevel("ERROR")
    spark.conf.set("spark.sql.adaptive.enabled", "false")
    jvm = spark_process_id(spark)
    config = load_telemetry_config(None)
    types = {name: kind.strip().lower() for name, kind in config.payload.fields.items()}
    conditions = Q.row_failure_conditions(config.quality.suites, types)
    variants = {"with": config, "without": replace(config, dedup=DedupConfig(message_id_fields=[]))}
    results: dict[str, dict[str, list[float]]] = {
        v: {"add_batch_s": [], "cpu_s": [], "dups": []} for v in variants
    }

    def tree_cpu() -> float:
        return sum(cpu_seconds(pid) for pid in process_tree(jvm))

    for number in range(rounds + 1):
        order = list(variants) if number % 2 == 0 else list(reversed(variants))
        for name in order:
            counted: list[int] = []

            def batch(frame: Any, batch_id: int, counted: list[int] = counted) -> None:
                cached = frame.persist()  # every column, as the job's batch holds them
                counted.append(cached.agg(F.count(F.when(F.col("duplicate"), 1))).first()[0])
                cached.unpersist()

            records = spark.readStream.schema(SOURCE_DDL).parquet(rows_dir)
            flagged = job.telemetry_rows(records, variants[name], conditions)
            checkpoint = tempfile.mkdtemp(prefix=f"{name}-", dir=work)
            cpu = tree_cpu()
            query = (
                flagged.writeStream.foreachBatch(batch)
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
            query.awaitTermination()
            cpu = tree_cpu() - cpu
            add_batch = sum(p["durationMs"].get("addBatch", 0) for p in query.recentProgress) / 1000
            if number:
                results[name]["add_batch_s"].append(add_batch)
                results[name]["cpu_s"].append(cpu)
                results[name]["dups"].append(float(sum(counted)))
            run = f"round {number}" if number else "warm-up"
            print(f"  {run}: {name} {add_batch:.2f} s", flush=True)
    spark.stop()
    return results


def run_checkout(checkout: Path, rows_dir: Path, work: Path, rounds: int) -> dict[str, Any]:
    """:func:`measure` in a fresh process, ``checkout``'s code first on the path (its Spark workers' too)."""
    out = work / f"result-{checkout.name}.json"
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    args = [sys.executable, __file__, "--measure", str(rows_dir), str(work), str(rounds), str(out)]
    subprocess.run(args, env=env, cwd=checkout, check=True, timeout=1800)
    return dict(json.loads(out.read_text()))


def render(figures: dict[str, dict[str, Any]], rows: int, resent: int, note: str) -> str:
    lines = [
        HEADING,
        "",
        note,
        "",
        f"{rows:,} rows in one micro-batch, {resent:,} of them resent readings; medians of the measured "
        "runs. CPU s: the Spark process tree's (JVM and Python workers) during the query, which moves less "
        "with other work on the machine than the wall time does.",
        "",
        "| code | addBatch with the check | without | the check's share | check per row "
        "| CPU s with / without | the check's CPU per row | duplicates flagged |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, result in figures.items():
        with_s = statistics.median(result["with"]["add_batch_s"])
        without_s = statistics.median(result["without"]["add_batch_s"])
        cpu_with = statistics.median(result["with"]["cpu_s"])
        cpu_without = statistics.median(result["without"]["cpu_s"])
        dups = int(statistics.median(result["with"]["dups"]))
        per_row_us = (with_s - without_s) / rows * 1e6
        lines.append(
            f"| {label} | {with_s:.2f} s | {without_s:.2f} s | {(with_s - without_s) / with_s:.0%} "
            f"| {per_row_us:.1f} µs | {cpu_with:.1f} / {cpu_without:.1f} "
            f"| {(cpu_with - cpu_without) / rows * 1e6:.1f} µs | {dups:,} |"
        )
    runs = [
        f"{label}: "
        + ", ".join(
            f"{w:.2f} / {o:.2f}"
            for w, o in zip(result["with"]["add_batch_s"], result["without"]["add_batch_s"], strict=True)
        )
        for label, result in figures.items()
    ]
    lines += ["", "Runs (addBatch s with / without the check): " + "; ".join(runs) + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--measure":
        Path(argv[4]).write_text(json.dumps(measure(argv[1], argv[2], int(argv[3]))))
        return 0
    parser = argparse.ArgumentParser(prog="bench.dedup_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--devices", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--against",
        metavar="COMMIT",
        action="append",
        default=[],
        help="a commit of this repository, measured beside (may be repeated)",
    )
    parser.add_argument("--output", type=Path, help="a markdown file to write the section into")
    args = parser.parse_args(argv)
    here = Path(__file__).resolve().parent.parent
    started, load_start = datetime.now(UTC), os.getloadavg()
    began = time.perf_counter()
    from bench.revisions import short_commit, tree_of

    with tempfile.TemporaryDirectory(prefix="dedup-bench-") as tmp:
        checkouts = {f"git {short_commit('HEAD')} (this checkout)": here}
        for number, commit in enumerate(args.against):
            checkouts[f"git {short_commit(commit)}"] = tree_of(commit, Path(tmp) / f"against-{number}")
        rows_dir = Path(tmp) / "rows"
        rows_dir.mkdir()
        resent = write_rows(rows_dir, args.rows, args.devices)
        figures = {
            label: run_checkout(path, rows_dir, Path(tmp), args.rounds) for label, path in checkouts.items()
        }
    from bench.sysinfo import machine_info

    machine = machine_info()
    note = (
        f"`python -m bench.dedup_bench --rows {args.rows} --devices {args.devices} --rounds {args.rounds}"
        + "".join(f" --against {commit}" for commit in args.against)
        + f"`, {started:%Y-%m-%d %H:%M} UTC, {time.perf_counter() - began:.0f} s in all. "
        f"{machine.cpu_model}, {machine.cores} cores. Load average (1 min) {load_start[0]:.1f} at the "
        f"start, {os.getloadavg()[0]:.1f} at the end."
    )
    text = render(figures, args.rows, resent, note)
    print(text)
    if args.output:
        from bench.report import replace_section

        replace_section(args.output, HEADING, text)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
