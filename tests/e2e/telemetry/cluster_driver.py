"""The telemetry job as a driver process of its own, on a Spark cluster, for the tests that kill it.

    python cluster_driver.py CONFIG MASTER_URL [--pause STEP BATCH RELEASE]

Runs the job as ``timestone pipeline telemetry --available-now`` does (``supervise`` over the ``telemetry``
section of CONFIG) on the cluster at MASTER_URL. With ``--pause``, once step STEP of
batch BATCH is done it prints ``paused STEP BATCH`` and waits until the file RELEASE exists: the test then
kills this process, or an executor, in the middle of that batch, knowing where it is.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("master")
    parser.add_argument("--pause", nargs=3, metavar=("STEP", "BATCH", "RELEASE"))
    args = parser.parse_args(argv)

    from pipelines.spark_session import local_spark_session
    from pipelines.telemetry.config import TelemetryConfig, load_telemetry_config_file
    from pipelines.telemetry.job import TelemetryBatch, supervise
    from sinks import TableStore

    def make_batch(config: TelemetryConfig, store: TableStore) -> TelemetryBatch:
        batch = TelemetryBatch(config, store)
        if args.pause:
            step, batch_id, release = args.pause[0], int(args.pause[1]), Path(args.pause[2])

            def pause(name: str, done: int) -> None:
                if name == step and done == batch_id and not release.exists():
                    print(f"paused {name} {done}", flush=True)
                    while not release.exists():
                        time.sleep(0.05)

            batch.after_step = pause
        return batch

    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("pipelines").setLevel(logging.INFO)  # a line per batch, shown by a failing test
    spark = local_spark_session("timestone-telemetry-cluster", args.master)
    spark.sparkContext.setLogLevel("WARN")
    try:
        return supervise(
            spark, load_telemetry_config_file(args.config), available_now=True, make_batch=make_batch
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
