"""Payload formats side by side: rows/s of JSON, CBOR, Protobuf and Sparkplug B on the same readings.

    .venv/bin/python -m bench.payloads_bench [--readings N] [--runs N] [--output PATH]

The same readings (the simulated fleet's: ts, seq, temperature, humidity, battery, firmware, group) are
written in each format, then read two ways, in one run so that the formats share the machine's state:

- **decoder alone**: one Python process reading every payload into the declared columns as Arrow
  (``pipelines.payloads.fields.decode_payloads``; JSON with ``json_payloads.read_json``), and Sparkplug B
  DDATA messages through an edge node's session (``sparkplug.session``): one core, no Spark;
- **in Spark** (local[2], what the telemetry job runs): JSON with ``from_json`` (how the job parses it
  today), CBOR and Protobuf through ``spark_fields.with_decoded_fields`` (``mapInArrow``), Sparkplug B
  through ``spark_sparkplug.sparkplug_rows`` (``applyInPandasWithState``, a streaming query with
  ``availableNow`` over the records in Parquet), each into ``format("noop")``.

A Sparkplug B reading is one DDATA of three metrics by alias (temperature, humidity, battery): three silver
rows; its rows/s counts metric rows, its messages/s readings. Ratios are against JSON on the same readings.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import RESULTS_DIR, output_parser, run_in_tempdir, write_result
from bench.sysinfo import machine_busy_seconds, machine_info
from pipelines.fleet.readings import reading_encoder
from pipelines.payloads.cbor import read_cbor
from pipelines.payloads.descriptors import message_class
from pipelines.payloads.fields import Reader, decode_payloads
from pipelines.payloads.formats import FieldFormat
from pipelines.payloads.json_payloads import read_json
from pipelines.payloads.protobuf import EXAMPLE_MESSAGE, ProtobufReader, example_descriptor_set
from pipelines.payloads.sparkplug.encode import MetricOut, bdseq_metric, encode
from pipelines.payloads.sparkplug.session import EdgeNodeSession, Record
from pipelines.telemetry.config import PayloadConfig

FIELDS = PayloadConfig().fields
"""The default telemetry configuration's payload fields: the simulated fleet's reading."""
FORMATS = ("json", "cbor", "protobuf")
METRICS = (("temperature", "Double", 1), ("humidity", "Double", 2), ("battery", "Double", 3))
DEVICE = "spBv1.0/bench/{}/node1/dev1"
T0_MS = 1_795_000_000_000


def readings(count: int) -> list[dict]:
    rng = random.Random(7)
    return [
        {
            "ts": T0_MS + n,
            "seq": n,
            "temperature": round(rng.gauss(21.0, 3.0), 2),
            "humidity": round(rng.uniform(20, 80), 1),
            "battery": round(rng.uniform(20, 100), 1),
            "firmware": "1.4.2",
            "group": "fleet",
        }
        for n in range(count)
    ]


def sparkplug_records(rows: list[dict]) -> list[Record]:
    """A node's NBIRTH and the device's DBIRTH, then one DDATA per reading (metrics by alias alone)."""
    declared = [MetricOut(0.0, t, name=n, alias=a) for n, t, a in METRICS]
    node = DEVICE.format("NBIRTH").rsplit("/", 1)[0]
    births = [
        Record("edge1", node, 0, T0_MS - 2, encode([bdseq_metric(0)], timestamp_ms=T0_MS - 2, seq=0)),
        Record(
            "edge1", DEVICE.format("DBIRTH"), 0, T0_MS - 1, encode(declared, timestamp_ms=T0_MS - 1, seq=1)
        ),
    ]
    data = [
        Record(
            "edge1",
            DEVICE.format("DDATA"),
            n,
            row["ts"],
            encode(
                [MetricOut(row[name], t, alias=a, with_datatype=False) for name, t, a in METRICS],
                timestamp_ms=row["ts"],
                seq=(n + 2) % 256,
            ),
        )
        for n, row in enumerate(rows)
    ]
    return births + data


def best_rate(runs: int, rows: int, work: Callable[[], object]) -> tuple[float, list[float]]:
    """Rows per second of the median of ``runs`` timed runs, after one untimed run (warm-up)."""
    work()
    seconds = []
    for _ in range(runs):
        began = time.perf_counter()
        work()
        seconds.append(time.perf_counter() - began)
    return rows / statistics.median(seconds), seconds


def decoders_alone(rows: list[dict], records: list[Record], runs: int) -> dict[str, tuple[float, float]]:
    """(rows/s, payload bytes per reading) of each format's decoder, one Python process."""
    telemetry = message_class(example_descriptor_set(), EXAMPLE_MESSAGE)
    readers: dict[str, Reader] = {
        "json": read_json,
        "cbor": read_cbor,
        "protobuf": ProtobufReader(telemetry, FIELDS),
    }
    results = {}
    for name in FORMATS:
        payloads = [reading_encoder(name)(row) for row in rows]
        rate, _ = best_rate(runs, len(rows), partial(decode_payloads, payloads, readers[name], FIELDS))
        results[name] = (rate, statistics.mean(len(p) for p in payloads))
    data = records[2:]
    rate, _ = best_rate(runs, len(data) * len(METRICS), lambda: EdgeNodeSession().process(records))
    results["sparkplug_b"] = (rate, statistics.mean(len(r.payload or b"") for r in data))
    return results


def in_spark(rows: list[dict], records: list[Record], runs: int, tmp: Path) -> dict[str, float]:
    """Rows/s of each format's parse step in Spark, local[2], into a noop sink."""
    from pyspark.sql import functions as F

    from pipelines.payloads.spark_fields import with_decoded_fields
    from pipelines.payloads.spark_sparkplug import sparkplug_rows
    from pipelines.spark_session import local_spark_session

    spark = local_spark_session("payloads-bench", "local[2]")
    schema = "broker string, topic string, offset bigint, timestamp timestamp, payload binary"
    stamp = dt.datetime.fromtimestamp(T0_MS / 1000, dt.UTC)
    results: dict[str, float] = {}
    formats = {
        "cbor": FieldFormat("cbor"),
        "protobuf": FieldFormat("protobuf", example_descriptor_set(), EXAMPLE_MESSAGE),
    }
    ddl = ", ".join(f"`{n}` {t}" for n, t in FIELDS.items())
    for name in FORMATS:
        path = tmp / name
        data = [
            ("edge1", "devices/d/telemetry", n, stamp, reading_encoder(name)(row))
            for n, row in enumerate(rows)
        ]
        spark.createDataFrame(data, schema).repartition(2).write.parquet(str(path))
        records_frame = spark.read.parquet(str(path))
        if name == "json":
            parsed = records_frame.select("*", F.from_json(F.col("payload").cast("string"), ddl).alias("j"))
            parsed = parsed.select("*", *[F.col("j").getField(n).alias(n) for n in FIELDS])
        else:
            parsed = with_decoded_fields(records_frame, formats[name], FIELDS)
        results[name], _ = best_rate(runs, len(rows), parsed.write.format("noop").mode("overwrite").save)
    path = tmp / "sparkplug"
    frame = [
        (r.broker, r.topic, r.offset, dt.datetime.fromtimestamp(r.timestamp_ms / 1000, dt.UTC), r.payload)
        for r in records
    ]
    spark.createDataFrame(frame, schema).coalesce(1).write.parquet(str(path))

    def sparkplug_query() -> None:
        checkpoint = tmp / f"checkpoint-{time.monotonic_ns()}"
        stream = spark.readStream.schema(schema).parquet(str(path))
        query = (
            sparkplug_rows(stream)
            .writeStream.format("noop")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        shutil.rmtree(checkpoint, ignore_errors=True)

    results["sparkplug_b"], _ = best_rate(runs, (len(records) - 2) * len(METRICS), sparkplug_query)
    spark.stop()
    return results


def render(count: int, runs: int, alone: dict, spark: dict, load: tuple, busy: float, elapsed: float) -> str:
    machine = machine_info()
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "## Payload formats",
        "",
        f"`bench/payloads_bench.py`: {count:,} readings of the simulated fleet in each format, median of "
        f"{runs} runs after a warm-up. Measured {when} on {machine.cpu_model}, {machine.cores} CPUs, "
        f"{machine.memory_gib:.1f} GiB, {machine.kernel}, Python {machine.python}; load average "
        f"{load[0]:.1f} before and {load[1]:.1f} after, the machine's CPUs {busy / elapsed:.1f} busy on "
        f"average over the {elapsed:.0f} s of the run "
        "(other work shared them: compare the ratios, which the formats measured side by side share, more "
        "than the rates). A many-core machine was not available: Spark ran local[2].",
        "",
        "| format | bytes per reading | decoder alone, rows/s | vs JSON | in Spark, rows/s | vs JSON |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in (*FORMATS, "sparkplug_b"):
        rate, size = alone[name]
        lines.append(
            f"| {name} | {size:.0f} | {rate:,.0f} | {rate / alone['json'][0]:.2f} | {spark[name]:,.0f} "
            f"| {spark[name] / spark['json']:.2f} |"
        )
    lines += [
        "",
        "Rows are silver rows: one per reading for JSON, CBOR and Protobuf (seven columns each), one per "
        "metric for Sparkplug B (three per reading, each with its name and datatype from the birth, its "
        "value and its timestamp). JSON in Spark is `from_json` in the JVM; the others run in Python "
        "workers over Arrow batches; Sparkplug B in Spark is a streaming query (its state store and the "
        "micro-batch's fixed cost included), grouped by edge node (here one node: one task reads them).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = output_parser("payloads_bench", __doc__, RESULTS_DIR / "payloads.md")
    parser.add_argument("--readings", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    load_before = os.getloadavg()[0]
    busy, began = machine_busy_seconds(), time.monotonic()
    rows = readings(args.readings)
    records = sparkplug_records(rows)
    alone = decoders_alone(rows, records, args.runs)
    spark = run_in_tempdir("payloads-bench-", lambda tmp: in_spark(rows, records, args.runs, tmp))
    elapsed = time.monotonic() - began
    load = (load_before, os.getloadavg()[0])
    text = render(args.readings, args.runs, alone, spark, load, machine_busy_seconds() - busy, elapsed)
    write_result(text, args.output)


if __name__ == "__main__":
    main()
