"""The cluster under faults: many seeds per nemesis, each run checked, counted and written as a table.

    flock /tmp/timestone-bench.lock python -m bench.cluster_faults_bench [--seeds 20] [--five 2]
        [--minutes M] [--nemeses kill,pause,etcd-restart,rolling,mixed] [--output FILE.md]

Each run is the fault suite's (``tests/e2e/faults/harness.py``): etcd (TLS, user auth) and three brokers
(member TLS, replication factor 3, lease TTL 2 s), six QoS 1 publishers (MQTT 5 and 3.1.1 alternately, each
on its own topic, 8 publishes in flight, never resending) spread over the brokers, a subscriber on each
broker, one nemesis; then the checker (``tests/e2e/faults/checker.py``). ``--five N`` adds N seeds per
nemesis on five brokers. Per nemesis the table gives the runs, the publishes acknowledged, refused and left
unanswered (their connection failed), the deliveries, the anomalies the checker found, the partitions whose
leader moved, and unavailability: the longest time a publisher went without an acknowledgement from the
fault's start (median and worst over the runs). ``--minutes`` stops starting runs after that long (the
file says how many ran); the file is rewritten after every run.
"""

from __future__ import annotations

import datetime as dt
import statistics
import sys
import time
from collections import defaultdict
from functools import partial
from pathlib import Path

from bench.report import output_parser, run_in_tempdir, write_result
from bench.sysinfo import machine_info
from tests.e2e.faults.harness import NEMESES, RunResult, run_case

DEFAULT_OUTPUT = Path(__file__).parent / "results" / "cluster-faults.md"


def render(results: list[RunResult], command: str, started: float, planned: int) -> str:
    machine = machine_info()
    groups: dict[tuple[str, int], list[RunResult]] = defaultdict(list)
    for result in results:
        groups[(result.nemesis, result.brokers)].append(result)
    lines = [
        "## Cluster under faults",
        "",
        f"Written by `{command}` on {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{time.monotonic() - started:.0f} s, {len(results)} of {planned} planned runs. Machine: "
        f"{machine.cpu_model}, {machine.cores} CPUs, {machine.memory_gib:.1f} GiB, {machine.kernel}, "
        f"Python {machine.python}. The machine was shared with other work while this ran (other test "
        "suites): unavailability is longer than on an idle machine; the counts of anomalies do not depend on "
        "it.",
        "",
        "| nemesis | brokers | runs | acknowledged | refused | unanswered | deliveries | anomalies | "
        "runs with a leader moved | unavailable, median / worst (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for (nemesis, brokers), group in sorted(groups.items()):
        gaps = [result.unavailable_s for result in group]
        lines.append(
            f"| {nemesis} | {brokers} | {len(group)} | {sum(r.acknowledged for r in group):,} | "
            f"{sum(r.refused for r in group):,} | {sum(r.unanswered for r in group):,} | "
            f"{sum(r.deliveries for r in group):,} | {sum(len(r.anomalies) for r in group)} | "
            f"{sum(1 for r in group if r.leader_moves)} | {statistics.median(gaps):.1f} / {max(gaps):.1f} |"
        )
    found = [(result, anomaly) for result in results for anomaly in result.anomalies]
    lines += ["", f"Anomalies: {len(found)}."]
    lines += [f"- {r.nemesis} seed {r.seed} ({r.brokers} brokers): {anomaly}" for r, anomaly in found[:40]]
    lines.append("")
    return "\n".join(lines)


def _one_run(nemesis: str, seed: int, brokers: int, directory: Path) -> RunResult:
    return run_case(nemesis, seed, directory, brokers=brokers)


def main(argv: list[str] | None = None) -> int:
    parser = output_parser("cluster_faults_bench", __doc__, DEFAULT_OUTPUT)
    parser.add_argument("--seeds", type=int, default=20, help="seeds per nemesis on three brokers")
    parser.add_argument("--five", type=int, default=2, help="seeds per nemesis on five brokers")
    parser.add_argument("--nemeses", default=",".join(NEMESES), help="comma-separated nemeses")
    parser.add_argument(
        "--minutes", type=float, default=0.0, help="start no run after this long (0: no limit)"
    )
    args = parser.parse_args(argv)
    nemeses = [name for name in args.nemeses.split(",") if name]
    unknown = sorted(set(nemeses) - set(NEMESES))
    if unknown:
        parser.error(f"--nemeses: unknown {', '.join(unknown)} (known: {', '.join(NEMESES)})")
    plan = [(n, seed, 3) for seed in range(1, args.seeds + 1) for n in nemeses]
    five = [(n, 1000 + seed, 5) for seed in range(1, args.five + 1) for n in nemeses]
    plan[len(nemeses) : len(nemeses)] = five  # early, so that a run cut short by --minutes has them too
    command = "python -m bench.cluster_faults_bench " + " ".join(argv if argv is not None else sys.argv[1:])
    started = time.monotonic()
    results: list[RunResult] = []
    for nemesis, seed, brokers in plan:
        if args.minutes and time.monotonic() - started > args.minutes * 60:
            break
        result = run_in_tempdir("faults-", partial(_one_run, nemesis, seed, brokers))
        results.append(result)
        print(
            f"{nemesis} seed {seed} brokers {brokers}: {result.acknowledged} acknowledged, "
            f"{len(result.anomalies)} anomalies, unavailable {result.unavailable_s:.1f} s",
            flush=True,
        )
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(render(results, command.strip(), started, len(plan)))
    write_result(render(results, command.strip(), started, len(plan)), args.output)
    return 1 if any(result.anomalies for result in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
