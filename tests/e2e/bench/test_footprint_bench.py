"""Smoke test of the footprint benchmark: every part on small settings, and the report it writes.

One start per broker, 2,000 idle connections (fewer may not move the RSS by a whole page), a 6 s soak with
30 devices (the install-size part, which builds virtualenvs, is left out). About 30 s.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def row(report: str, label: str) -> list[str]:
    """The cells of the table row whose first cell is `label`."""
    for line in report.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == label:
            return cells
    raise AssertionError(f"no row {label!r} in:\n{report}")


def test_footprint_bench_reports_every_part_with_its_targets(tmp_path):
    output = tmp_path / "footprint.md"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.footprint_bench",
            "--brokers=timestone",
            "--skip=install",
            "--starts=1",
            "--connections=2000",
            "--soak-seconds=6",
            "--devices=30",
            "--churn=2",
            f"--output={output}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = output.read_text()

    idle_rss, listening, serving, _cpu = row(report, "timestone (defaults, dev venv)")[1:]
    assert 5 < float(idle_rss.removesuffix(" MiB")) < 500
    assert 0 < float(listening.removesuffix(" s")) <= float(serving.removesuffix(" s"))
    connections, _before, _after, per_connection = row(report, "timestone")[1:]
    assert connections == "2,000"
    assert 0 < int(per_connection.replace(",", "")) < 100_000
    assert row(report, "uvloop floor (transport + 1-slot protocol)")[1] == "2,000"
    soak_rows = [line for line in report.splitlines() if re.match(r"\| \d+ s \| [\d.]+ MiB \|", line)]
    assert len(soak_rows) >= 3
    header = next(line for line in report.splitlines() if line.startswith("| time | RSS |"))
    columns = [cell.strip() for cell in header.split("|")]
    last = [cell.strip() for cell in soak_rows[-1].split("|")]
    assert int(last[columns.index("acknowledged")].replace(",", "")) > 0  # QoS 1 messages acknowledged
    assert last[columns.index("after trim")] == "-", "no trim within 6 s: the broker trims every 30 s"
    assert 1 < float(last[columns.index("C heap in use")].removesuffix(" MiB")) < 500
    assert int(last[columns.index("Python blocks")].replace(",", "")) > 10_000
    assert 0 <= int(last[columns.index("devices back once")].replace(",", "")) <= 30  # read from the load
    assert last[-2].endswith(" MiB"), last  # the tail caches' fill against their bound
    targets = report.split("### Targets", 1)[1]
    goals = ("idle RSS ≤ 40 MiB (dev venv)", "listening ≤ 0.3 s (dev venv)", "memory per idle connection")
    for goal in goals:
        assert re.search(re.escape(goal) + r".*: (met|NOT met) \(", targets), goal
    assert re.search(r"no growth once warm .*: (met|NOT met) \(RSS ", targets)
