"""Rendering bench/RESULTS.md: the machine, the brokers, the targets, one table per scenario, and the
sections other benchmark scripts leave in bench/results/*.md (appended verbatim); and the steps every
benchmark script's ``main`` shares: parse ``--output``, run in a temporary directory, render, write, print."""

from __future__ import annotations

import argparse
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from bench.scenarios.base import ScenarioResult, Target
from bench.sysinfo import MachineInfo

F = TypeVar("F")
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def output_parser(prog: str, doc: str | None, default_output: Path) -> argparse.ArgumentParser:
    """An argument parser described by the first line of ``doc``, with ``--output`` (a markdown file)."""
    parser = argparse.ArgumentParser(prog=prog, description=(doc or "").split("\n")[0])
    parser.add_argument(
        "--output", type=Path, default=default_output, help=f"markdown file (default {default_output})"
    )
    return parser


def run_in_tempdir(prefix: str, run: Callable[[Path], F]) -> F:
    """``run(directory)`` in a fresh temporary directory, removed afterwards whatever happens."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        return run(Path(tmp))


def write_result(text: str, output: Path | None) -> None:
    """Print ``text``; with ``output``, also write it there (its folder made) and say so."""
    print(text)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        print(f"wrote {output}", flush=True)


def section_of(path: Path, heading: str) -> str:
    """The section of markdown file ``path`` that starts with the line ``heading``, up to the next heading
    of the same or a higher level (empty when the file or the section is missing)."""
    try:
        lines = path.read_text().splitlines(keepends=True)
    except OSError:
        return ""
    level = len(heading) - len(heading.lstrip("#"))
    start = next((i for i, line in enumerate(lines) if line.rstrip() == heading), None)
    if start is None:
        return ""
    end = start + 1
    while end < len(lines):
        marks = len(lines[end]) - len(lines[end].lstrip("#"))
        if 0 < marks <= level and lines[end][marks : marks + 1] == " ":
            break
        end += 1
    return "".join(lines[start:end])


def replace_section(path: Path, heading: str, text: str) -> None:
    """Write ``text`` as the section ``heading`` of ``path`` (see :func:`section_of`): in place of the one
    there, else at the end; the rest of the file is kept."""
    current = path.read_text() if path.exists() else ""
    old = section_of(path, heading)
    new = text.rstrip("\n") + "\n\n"
    updated = current.replace(old, new) if old else current.rstrip("\n") + "\n\n" + new
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(updated.rstrip("\n") + "\n")


def run_and_write(
    argv: Sequence[str] | None,
    name: str,
    doc: str | None,
    run: Callable[[Path], F],
    render: Callable[[F, str], str],
) -> int:
    """The whole ``main`` of benchmark ``bench/<name>_bench.py`` whose only option is ``--output`` (default
    ``bench/results/<name>.md``, dashes in ``name`` for the underscores of the module): run in a temporary
    directory, render the figures with the command that reruns it, write and print them; 0."""
    module = f"bench.{name.replace('-', '_')}_bench"
    args = output_parser(f"python -m {module}", doc, RESULTS_DIR / f"{name}.md").parse_args(argv)
    figures = run_in_tempdir(f"timestone-{name}-bench-", run)
    write_result(render(figures, f"flock /tmp/timestone-bench.lock python -m {module}"), args.output)
    return 0


@dataclass(frozen=True)
class BrokerInfo:
    """One broker configuration as the results describe it."""

    label: str
    version: str
    status: str  # "measured" or "not available: why"
    config: str


@dataclass(frozen=True)
class RunInfo:
    """How this run was made."""

    date: str
    command: str
    quick: bool
    repeat: int
    cpu_split: str
    load_average: str
    load_average_end: str = ""
    other_cpu_mean: float | None = None  # mean "other CPU" % over the measurements (100 = one core)


def render(
    run: RunInfo,
    machine: MachineInfo,
    brokers: list[BrokerInfo],
    results: list[ScenarioResult],
    extra_sections: list[tuple[str, str]],
) -> str:
    """The whole RESULTS.md as text."""
    out = ["# Broker benchmark results", ""]
    kind = (
        "**quick smoke run** (short and small: not for comparison)"
        if run.quick
        else f"full run, each figure the median of {run.repeat} runs against a fresh broker"
    )
    out += [f"Written by `{run.command}` on {run.date}: {kind}.", ""]
    out += _machine(run, machine)
    out += _brokers(brokers)
    out += _targets([t for r in results for t in r.targets])
    for result in results:
        out += scenario_table(result)
    if extra_sections:
        out += [
            "## Other benchmark results",
            "",
            "Sections written by other benchmark scripts, as they wrote them, without the earlier runs each "
            "file in bench/results/ keeps below its own results.",
            "",
        ]
        for name, text in extra_sections:
            out += [f"<!-- from bench/results/{name} -->", text.rstrip("\n"), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def _machine(run: RunInfo, m: MachineInfo) -> list[str]:
    return [
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        f"| CPU | {m.cpu_model} |",
        f"| cores | {m.cores} |",
        f"| memory | {m.memory_gib:.1f} GiB |",
        f"| kernel | {m.kernel} |",
        f"| Python | {m.python} |",
        f"| CPU split | {run.cpu_split} |",
        f"| load average when the run started | {run.load_average} |",
        f"| load average when it ended | {run.load_average_end} |",
        "",
        *_contention(run, m),
        "Everything runs on this one machine over 127.0.0.1. The 'other CPU' columns show what the rest of "
        "the machine used during each measurement (100% = one core busy): when it is high, other work "
        "competed with the broker and the load generator, and the figures are lower and noisier than on a "
        "quiet machine. 'load-gen CPU' near 100% would mean that the load generator, not the broker, set "
        "the pace.",
        "",
    ]


def _contention(run: RunInfo, m: MachineInfo) -> list[str]:
    """A warning when other work took a large share of the machine during the measurements."""
    if run.other_cpu_mean is None or run.other_cpu_mean < 25:
        return []
    return [
        f"**Warning: other processes used {run.other_cpu_mean:.0f}% CPU on average during the measurements "
        f"(of {100 * m.cores}% for the whole machine).** The broker and the load generator got only part of "
        "their CPUs: throughput is understated, latency overstated, and repeated runs vary widely (see the "
        "'runs' columns). Compare brokers within this run only, and re-run on a quiet machine for absolute "
        "figures.",
        "",
    ]


def _brokers(brokers: list[BrokerInfo]) -> list[str]:
    out = ["## Brokers", "", "| broker | version | status | configuration |", "|---|---|---|---|"]
    for b in brokers:
        out.append(f"| {b.label} | {b.version} | {_cell(b.status)} | {_cell(b.config)} |")
    return [*out, ""]


def _targets(targets: list[Target]) -> list[str]:
    out = ["## Targets (Timestone)", "", "| target | measured | met |", "|---|---|---|"]
    for t in targets:
        met = "not measured" if t.met is None else ("met" if t.met else "**not met**")
        out.append(f"| {t.goal} | {t.measured} | {met} |")
    return [*out, ""]


def scenario_table(r: ScenarioResult) -> list[str]:
    better = "higher is better" if r.higher_is_better else "lower is better"
    side = "above" if r.higher_is_better else "below"
    ratio_name = f"{r.reference} / this ({side} 1: {r.reference} better)"
    header = ["case", "broker", f"{r.figure_name} ({better})", ratio_name, *r.columns, "note"]
    out = [f"## {r.title}", "", r.description, ""]
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in r.rows:
        reference = r.figure(row.case, r.reference)
        ratio = _ratio(reference, None if row.invalid else row.figure) if row.broker != r.reference else ""
        cells = [
            row.case,
            row.broker,
            _figure(row.figure) + (" **(invalid)**" if row.invalid else ""),
            ratio,
            *(row.cells.get(c, "") for c in r.columns),
            _cell("; ".join(filter(None, [f"INVALID: {row.invalid}" if row.invalid else "", row.note]))),
        ]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    if any(row.invalid for row in r.rows):
        out += [
            "Rows marked **(invalid)** do not count: their load generator was saturated (it, not the broker, "
            "may have set the pace) or acknowledged messages were never delivered. Their figures are shown "
            "as measured and take part in no ratio and no target (n/a).",
            "",
        ]
    if r.targets:
        out += [f"Target: {t.goal}: {t.measured} — {_met(t)}." for t in r.targets]
        out.append("")
    out += [*r.notes, ""] if r.notes else []
    return out


def _met(t: Target) -> str:
    return "not measured" if t.met is None else ("met" if t.met else "**not met**")


def _figure(value: float | None) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.3f}"


def _ratio(mine: float | None, theirs: float | None) -> str:
    if mine is None or theirs is None or theirs == 0 or math.isnan(mine) or math.isnan(theirs):
        return "n/a"
    return f"{mine / theirs:.2f}"


def _cell(text: str) -> str:
    """Table-safe text: one line, no pipes, not endless."""
    text = " ".join(text.split()).replace("|", "/")
    return text if len(text) <= 300 else text[:297] + "..."


EARLIER_RUNS = "## Earlier runs"
"""Heading under which a results file keeps what earlier code measured; RESULTS.md leaves that part out."""


def extra_sections(results_dir: Path) -> list[tuple[str, str]]:
    """(file name, text) of every bench/results/*.md, by name, each without its earlier runs."""
    if not results_dir.is_dir():
        return []
    return [
        (p.name, current_run(p.read_text(errors="replace")))
        for p in sorted(results_dir.glob("*.md"))
        if p.is_file()
    ]


def current_run(text: str) -> str:
    """A results file's text up to its ``## Earlier runs`` heading: the figures the current code measured."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if line.rstrip() == EARLIER_RUNS:
            return "".join(lines[:index]).rstrip("\n") + "\n"
    return text
