"""The actions engine's driver memory against its history: finished actions by the hundred, one in flight.

    flock /tmp/timestone-bench.lock .venv/bin/python bench/ota_engine_memory.py --against main

Builds the tables (delta-rs, in a temporary folder) for each history size: ``--devices`` devices in one
group, ``--finished`` OTA actions to that group that ended long ago (every device SUCCEEDED, ten actions
written per commit) with their COMPLETED summaries, and one action to the same group in flight (every device
sent it, half of them IN_PROGRESS, with a timeout so that the ticker reads it). Then, in a fresh Python
process per checkout and history (this tree and, with ``--against REV`` (repeatable), that revision's tree
from ``git archive``), an engine opens those tables and does what a running job does: a tick, a report
batch finishing a tenth of the action in flight, the compliance table. Each process reports its peak RSS
(``VmHWM``) above its RSS once the libraries were loaded (imports, a small table read), the Arrow memory
still allocated once the work is done (the engine alive), and the seconds the work took. Memory bounded by
what is in flight stays flat as the history grows. Results go to ``bench/results/ota.md``, section "Engine
memory against the history".
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, os.environ.get("ENGINE_MEMORY_CHECKOUT", str(REPO)))

import pyarrow as pa  # noqa: E402

RESULTS = REPO / "bench" / "results" / "ota.md"
HEADING = "## Engine memory against the history"
GROUP = "fleet"
ACTIVE = "in-flight"
ACTIONS_PER_COMMIT = 10


def _action_row(action_id: str, created: datetime, timeout_s: int | None) -> dict:
    from pipelines.actions.operator import NewAction

    action = NewAction(
        group=GROUP,
        version=f"2.{action_id}",
        url="https://fw.example/fw.bin",
        sha256="0" * 64,
        size=1024,
        in_progress_timeout_s=timeout_s,
        action_id=action_id,
    )
    return action.row(created)


def _executions(action_id: str, devices: list[str], at: datetime, state: str) -> list[dict]:
    done = state == "SUCCEEDED"
    return [
        {
            "action_id": action_id,
            "device_id": device,
            "state": state,
            "version": 3 if done else 2,
            "report_seq": 2 if done else 1,
            "status_details": "",
            "queued_at": at,
            "updated_at": at,
            "published_at": at,
            "started_at": at,
            "finished_at": at if done else None,
            "attempt": 1,
        }
        for device in devices
    ]


def _summary(action_id: str, counts: dict[str, int], state: str, at: datetime) -> dict:
    from sinks.tables import EXECUTION_STATES

    row: dict = {f"{s.lower()}_count": counts.get(s, 0) for s in EXECUTION_STATES}
    return row | {
        "action_id": action_id,
        "total_count": sum(counts.values()),
        "action_state": state,
        "updated_at": at,
        "retries_count": 0,
    }


def build_tables(root: str, devices: int, finished: int) -> None:
    """The tables as a job that ran ``finished`` actions to the fleet before this one leaves them."""
    from sinks import open_table_store

    store = open_table_store(None, root, backend="delta-rs")
    store.ensure_all()
    start = datetime.now(UTC) - timedelta(days=finished + 1)
    ids = [f"dev-{i:06d}" for i in range(devices)]
    registry = [
        {"device_id": d, "group": GROUP, "firmware_version": "1.0.0", "last_seen": start} for d in ids
    ]
    store.append("devices", pa.Table.from_pylist(registry, schema=store.spec("devices").arrow_schema), "b", 0)
    done = [f"old-{n:04d}" for n in range(finished)]
    actions = [_action_row(a, start + timedelta(days=n), None) for n, a in enumerate(done)]
    now = datetime.now(UTC)
    actions.append(_action_row(ACTIVE, now, 86_400))
    store.merge("actions", pa.Table.from_pylist(actions, schema=store.spec("actions").arrow_schema), "b", 0)
    schema = store.spec("action_executions").arrow_schema
    for batch, first in enumerate(range(0, finished, ACTIONS_PER_COMMIT)):
        rows = [
            row
            for n, action_id in enumerate(done[first : first + ACTIONS_PER_COMMIT], start=first)
            for row in _executions(action_id, ids, start + timedelta(days=n, hours=1), "SUCCEEDED")
        ]
        store.append("action_executions", pa.Table.from_pylist(rows, schema=schema), "b", batch)
    half = devices // 2
    open_rows = _executions(ACTIVE, ids[:half], now, "IN_PROGRESS") + _executions(
        ACTIVE, ids[half:], now, "QUEUED"
    )
    for row in open_rows[half:]:
        row.update(version=2, report_seq=0, started_at=None)
    store.append("action_executions", pa.Table.from_pylist(open_rows, schema=schema), "b", finished)
    summaries = [_summary(a, {"SUCCEEDED": devices}, "COMPLETED", start) for a in done]
    summaries.append(_summary(ACTIVE, {"IN_PROGRESS": half, "QUEUED": devices - half}, "IN_PROGRESS", now))
    schema = store.spec("action_summary").arrow_schema
    store.merge("action_summary", pa.Table.from_pylist(summaries, schema=schema), "b", 0)


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def child(root: str, port: int, devices: int) -> dict:
    """One engine's work on the tables, measured in this process."""
    from pipelines.actions.engine import ActionsEngine
    from pipelines.actions.publisher import MqttPublisher
    from pipelines.actions.states import StatusReport
    from sinks import open_table_store

    publisher = MqttPublisher([("127.0.0.1", port)], client_id="engine-memory-bench")
    store = open_table_store(None, root, backend="delta-rs")
    warm = store.read_arrow("action_summary")  # the libraries loaded before the baseline: delta-rs, datasets
    warm.group_by("action_state").aggregate([("action_id", "count")])
    del warm
    gc.collect()
    base_kib = _rss_kib("VmRSS")
    started = time.perf_counter()
    engine = ActionsEngine(store, publisher, compliance_interval_s=0)
    engine.tick()
    now = int(time.time() * 1000)
    finishing = [f"dev-{i:06d}" for i in range(devices // 10)]
    reports = [StatusReport(ACTIVE, d, "SUCCEEDED", 2, now, "applied", 1) for d in finishing]
    engine.on_reports(reports, "reports", 0)
    engine.refresh_compliance()
    seconds = time.perf_counter() - started
    gc.collect()
    held = pa.total_allocated_bytes()
    result = {
        "peak_growth_mib": (_rss_kib("VmHWM") - base_kib) / 1024,
        "arrow_held_mib": held / 1024**2,
        "seconds": seconds,
    }
    compliance = store.read_arrow("fleet_compliance").to_pylist()
    result["compliance"] = sorted((r["group"], r["installed_version"], r["devices"]) for r in compliance)
    publisher.close()
    return result


def measure(tree: Path, root: str, port: int, devices: int) -> dict:
    env = dict(os.environ, ENGINE_MEMORY_CHECKOUT=str(tree))
    command = [sys.executable, __file__, "--child", root, "--port", str(port), "--devices", str(devices)]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True, cwd=tree)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(args, runs: dict[tuple[str, int], dict], built_s: float) -> str:
    from bench.sysinfo import when_and_where

    sizes = sorted({finished for _, finished in runs})
    trees = list(dict.fromkeys(name for name, _ in runs))
    lines = [
        HEADING,
        "",
        when_and_where(),
        "",
        f"`bench/ota_engine_memory.py --devices {args.devices} --finished {args.finished}"
        + "".join(f" --against {rev}" for rev in args.against)
        + "`"
        + f": {' / '.join(str(n) for n in sizes)} finished actions x {args.devices:,} devices"
        f" plus one action in flight to the same {args.devices:,} devices (tables built in {built_s:.0f} s)."
        " Each checkout and history in a fresh process: a tick, a report batch, the compliance table.",
        "",
        "| checkout | finished actions (executions) | peak RSS growth | Arrow held after | seconds |",
        "|---|---:|---:|---:|---:|",
    ]
    for (name, finished), run in runs.items():
        peak, held, seconds = run["peak_growth_mib"], run["arrow_held_mib"], run["seconds"]
        executions = finished * args.devices
        lines.append(
            f"| {name} | {finished} ({executions:,}) | {peak:.1f} MiB | {held:.2f} MiB | {seconds:.2f} |"
        )
    if len(sizes) > 1:
        low, high = sizes[0], sizes[-1]
        lines.append("")
        for name in trees:
            grew = runs[(name, high)]["peak_growth_mib"] - runs[(name, low)]["peak_growth_mib"]
            held = runs[(name, high)]["arrow_held_mib"] - runs[(name, low)]["arrow_held_mib"]
            lines.append(
                f"- {name}: from {low} to {high} finished actions the peak RSS grew {grew:+.1f} MiB and the"
                f" Arrow held {held:+.2f} MiB."
            )
    if len(trees) > 1:
        same = all(
            runs[(tree, n)]["compliance"] == runs[(trees[0], n)]["compliance"]
            for tree in trees
            for n in sizes
        )
        lines += ["", f"Every checkout wrote the same `fleet_compliance` rows: {same}."]
    return "\n".join(lines) + "\n"


def save(section: str) -> None:
    text = RESULTS.read_text() if RESULTS.exists() else "# OTA fanout, stage by stage\n"
    if HEADING in text:
        before, _, after = text.partition(HEADING)
        rest = after.split("\n## ", 1)
        text = before + section + ("\n## " + rest[1] if len(rest) > 1 else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    RESULTS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument("--finished", default="50,200,800", help="finished actions, several comma separated")
    parser.add_argument(
        "--against", action="append", default=[], help="a git revision to measure side by side (repeatable)"
    )
    parser.add_argument("--child", metavar="TABLES", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.port, args.devices)))
        return 0
    from broker_edge.runtime.launcher import BrokerProcess

    with tempfile.TemporaryDirectory(prefix="engine-memory-") as work:
        started = time.perf_counter()
        sizes = sorted({int(n) for n in args.finished.split(",")})
        for finished in sizes:
            build_tables(f"{work}/tables-{finished}", args.devices, finished)
        built_s = time.perf_counter() - started
        from bench.revisions import short_commit, tree_of  # this tree's (sys.path may start elsewhere)

        trees: dict[str, Path] = {}
        for number, against in enumerate(args.against):
            rev = short_commit(against)
            trees[f"{against} ({rev})" if rev != against else rev] = tree_of(
                against, Path(work) / f"at-{number}"
            )
        trees["this tree"] = REPO
        with BrokerProcess(Path(work) / "broker") as broker:
            runs: dict[tuple[str, int], dict] = {}
            for finished in sizes:
                for name, tree in trees.items():
                    # each run on the tables as built: the engine's writes of one run do not reach the next
                    tables = Path(work) / f"run-{len(runs)}"
                    subprocess.run(["cp", "-r", f"{work}/tables-{finished}", str(tables)], check=True)
                    runs[(name, finished)] = measure(tree, str(tables), broker.port, args.devices)
    section = report(args, runs, built_s)
    print(section)
    if not args.no_save:
        save(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
