"""What a read and a merge of the action in flight cost in ``action_executions``, against the history.

    flock /tmp/timestone-bench.lock .venv/bin/python bench/ota_executions_layout.py

For each history size (``--finished``, default 50, 200 and 800 finished actions of ``--devices`` devices
each, ids random as users name them, ten actions appended per commit) two copies of the table are
maintained, one the way compaction bin-packs files (``before``: delta-rs' ``optimize.compact``), one
clustered by action (``after``: the store's compaction of a ``cluster_by`` table, :mod:`sinks.clustering`).
Then, in both, one action is fanned out, a maintenance pass runs (the job runs one a minute), and the
action gets two report batches (the engine's ``EngineTables`` merges, narrowed to the action). Measured
for the action in flight: the files its filtered read opens and their bytes (of the table's), the bytes
that read took from the files (``rchar`` of ``/proc/self/io``), and for each report merge the files it
rewrote and the stored rows it copied into them (its Delta metrics: a merge rewrites whole files).
Results go to ``bench/results/ota.md``, section "Executions read per action in flight".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from random import Random

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import pyarrow as pa  # noqa: E402
from deltalake import DeltaTable  # noqa: E402

from bench.report import replace_section  # noqa: E402
from pipelines.actions.engine_tables import EXECUTIONS, EngineTables  # noqa: E402
from pipelines.actions.states import Execution  # noqa: E402
from sinks import open_table_store  # noqa: E402
from sinks.delta_rs import DeltaRsTableStore  # noqa: E402
from sinks.maintenance import RetentionPolicy  # noqa: E402
from sinks.store import Matching  # noqa: E402

RESULTS = REPO / "bench" / "results" / "ota.md"
HEADING = "## Executions read per action in flight"
ACTIONS_PER_COMMIT = 10
POLICY = RetentionPolicy()  # the job's defaults: 16 MiB files, min_files 10, 600 s to settle


def _rows(action_id: str, devices: int, state: str, version: int, first: int = 0) -> list[Execution]:
    return [
        Execution(action_id, f"dev-{i:06d}", state, version, version, state, 1_000, 1_000 + version)
        for i in range(first, devices)
    ]


def build(root: str, finished: int, devices: int, seed: int) -> DeltaRsTableStore:
    """``finished`` actions' executions, every device SUCCEEDED at its own times, as the job leaves them."""
    store = open_table_store(None, root, backend="delta-rs")
    assert isinstance(store, DeltaRsTableStore)
    rng = Random(seed)
    done = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(finished)]
    schema = store.spec(EXECUTIONS).arrow_schema
    start = 1_767_225_600_000  # 2026-01-01 in epoch ms
    for batch, first in enumerate(range(0, finished, ACTIONS_PER_COMMIT)):
        rows = []
        for n, action in enumerate(done[first : first + ACTIONS_PER_COMMIT], start=first):
            for i in range(devices):
                queued = start + n * 86_400_000
                started = queued + rng.randrange(1_000, 600_000)
                finished_at = started + rng.randrange(10_000, 900_000)
                rows.append(
                    {"action_id": action, "device_id": f"dev-{i:06d}", "state": "SUCCEEDED", "version": 3}
                    | {"report_seq": rng.randrange(2, 6), "status_details": "applied", "attempt": 1}
                    | {"queued_at": queued, "published_at": queued + rng.randrange(0, 60_000)}
                    | {"started_at": started, "finished_at": finished_at, "updated_at": finished_at}
                )
        table = pa.Table.from_pylist(rows)
        for column in ("queued_at", "published_at", "started_at", "finished_at", "updated_at"):
            stamps = table[column].cast(pa.timestamp("ms", tz="UTC"))
            table = table.set_column(table.schema.get_field_index(column), column, stamps)
        store.append(
            EXECUTIONS, table.cast(pa.schema([schema.field(c) for c in table.column_names])), "h", batch
        )
    return store


def settle_history(store: DeltaRsTableStore, layout: str) -> None:
    """The finished actions as maintenance leaves them long after they ended."""
    if layout == "before":
        DeltaTable(store.location(EXECUTIONS)).optimize.compact(target_size=POLICY.target_bytes)
    else:
        store.compact(EXECUTIONS, POLICY.target_bytes, POLICY.min_files, settle_s=0)


def run_in_flight(store: DeltaRsTableStore, layout: str, devices: int) -> tuple[str, list[tuple[int, int]]]:
    """One action fanned out, a maintenance pass (as the job runs one every minute), two report batches;
    the action, and the files each report merge rewrote and the stored rows it copied into new files."""
    tables = EngineTables(store)
    action = str(uuid.uuid4())
    tables.write_executions(_rows(action, devices, "QUEUED", 1), "job", 0)
    if layout == "before":
        DeltaTable(store.location(EXECUTIONS)).optimize.compact(target_size=POLICY.target_bytes)
    else:
        store.compact(EXECUTIONS, POLICY.target_bytes, POLICY.min_files, settle_s=POLICY.settle_seconds)
    merges = []
    for batch, (state, version) in enumerate((("IN_PROGRESS", 2), ("SUCCEEDED", 3)), start=1):
        tables.write_executions(_rows(action, devices // 10, state, version), "job", batch)
        metrics = DeltaTable(store.location(EXECUTIONS)).history(1)[0]["operationMetrics"]
        merges.append((int(metrics["num_target_files_removed"]), int(metrics["num_target_rows_copied"])))
    return action, merges


def _rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def measure(store: DeltaRsTableStore, action: str, devices: int) -> dict:
    actions = DeltaTable(store.location(EXECUTIONS)).get_add_actions(flatten=True)
    paths, sizes_bytes = actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist()
    sizes = dict(zip(paths, sizes_bytes, strict=True))
    where = [Matching("action_id", (action,))]
    opened = store.files_read(EXECUTIONS, where)
    before = _rchar()
    began = time.perf_counter()
    rows = store.read_arrow(EXECUTIONS, where=where)
    seconds = time.perf_counter() - began
    read = _rchar() - before
    assert rows.num_rows == devices, (rows.num_rows, devices)
    return {
        "files": len(sizes),
        "table_bytes": sum(sizes.values()),
        "opened": len(opened),
        "opened_bytes": sum(sizes[p] for p in opened),
        "read_bytes": read,
        "seconds": seconds,
    }


def report(args, runs: dict[tuple[int, str], dict]) -> str:
    from bench.sysinfo import when_and_where

    lines = [
        HEADING,
        "",
        when_and_where(),
        "",
        f"`bench/ota_executions_layout.py --devices {args.devices} --finished {args.finished}`: finished"
        f" actions x {args.devices:,} devices (random ids, {ACTIONS_PER_COMMIT} per commit), then one action"
        " in flight (its fanout, a maintenance pass, two report batches of a tenth of its devices each)."
        " before: compaction bin-packs (`optimize.compact`); after: clustered by action_id, the job's"
        " defaults (16 MiB files, the action in flight keeps its own file until it settled for 600 s).",
        "",
        "| finished actions | layout | files (table MiB) | files the read opens | their MiB | MiB read |"
        " read s | each report merge: files rewritten, stored rows copied |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for (finished, layout), run in runs.items():
        lines.append(
            f"| {finished} | {layout} | {run['files']} ({run['table_bytes'] / 2**20:.1f}) | {run['opened']} |"
            f" {run['opened_bytes'] / 2**20:.2f} | {run['read_bytes'] / 2**20:.2f} | {run['seconds']:.3f} |"
            f" {'; '.join(f'{files}, {copied:,}' for files, copied in run['merges'])} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--finished", default="50,200,800", help="finished actions, several comma separated")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    runs: dict[tuple[int, str], dict] = {}
    with tempfile.TemporaryDirectory(prefix="executions-layout-") as work:
        for finished in sorted({int(n) for n in args.finished.split(",")}):
            for layout in ("before", "after"):
                store = build(f"{work}/{finished}-{layout}", finished, args.devices, seed=finished)
                settle_history(store, layout)
                action, merges = run_in_flight(store, layout, args.devices)
                runs[(finished, layout)] = measure(store, action, args.devices) | {"merges": merges}
                print(finished, layout, runs[(finished, layout)], flush=True)
    section = report(args, runs)
    print(section)
    if not args.no_save:
        replace_section(RESULTS, HEADING, section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
