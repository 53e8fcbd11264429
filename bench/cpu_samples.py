"""`timestone` run with its CPU time sampled stack by stack: where a broker's CPU goes, each member's too,
even while processes share a core.

    python -m bench.cpu_samples DIR broker --config FILE [--workers N]
    python -m bench.cpu_samples --report DIR [--under FUNCTION] [--top 40]

The first form runs the `timestone` command (`pipelines.cli.main`) unchanged, with a sampler in every process
that serves a broker: the command's own, or each member `--workers` forks. Every millisecond of CPU time the
process uses (`ITIMER_PROF`: the user and system time of all its threads; the kernel rounds it up to its
timer tick, 4 ms at 250 Hz) the main thread's Python stack is counted, if it runs through `run_broker`
(a tick in the sampler's own start or stop is not the broker's work); when the broker stops,
`DIR/cpu-<pid>.txt` holds the counts as collapsed stacks (`frame;frame;... count`, what flame graph tools
read). A wall-clock sampler (py-spy) also counts a process that waits for the CPU, at whatever line it was
preempted: with members, their writer threads and etcd taking turns on one core, those samples land mostly
where a thread wakes another. Here a process is sampled only for CPU it used. The signal is taken when the
main thread next runs Python, so CPU spent in C (uvloop, system calls) or in another thread (the group
committer's writer) is counted at the line that runs next: read the shares of Python functions, not of the
C below them.

`--report` adds up every file of DIR: the share of all samples in each function and below it (inclusive) and
in it alone (self); `--under FUNCTION` (a qualified name, `PublishPath._persist`) keeps the stacks through it,
each function's share still of all samples. Nothing of this is in the broker itself.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

INTERVAL_S = 0.001
"""CPU time between two samples asked for (the kernel rounds it up to its timer tick)."""

Stack = tuple[tuple[CodeType, int], ...]


class CpuSampler:
    """Counts the main thread's stacks, one per `INTERVAL_S` (or timer tick) of the process's CPU time; with
    `within`, only the stacks through a call of that code (a sample taken in the sampler's own start or stop,
    or as the sampled function returns, is not the work sampled)."""

    def __init__(self, directory: Path, within: CodeType | None = None) -> None:
        self.directory = directory
        self.within = within
        self.counts: collections.Counter[Stack] = collections.Counter()

    def _sample(self, _signal: int, frame: FrameType | None) -> None:
        stack = []
        while frame is not None:
            stack.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        if self.within is None or any(code is self.within for code, _ in stack):
            self.counts[tuple(reversed(stack))] += 1

    def start(self) -> None:
        signal.signal(signal.SIGPROF, self._sample)
        signal.setitimer(signal.ITIMER_PROF, INTERVAL_S, INTERVAL_S)

    def stop(self) -> Path:
        """Stop sampling and write the counts: the file written."""
        signal.setitimer(signal.ITIMER_PROF, 0, 0)
        path = self.directory / f"cpu-{os.getpid()}.txt"
        with path.open("w") as out:
            for stack, count in self.counts.items():
                out.write(f"{';'.join(_frame_name(code, line) for code, line in stack)} {count}\n")
        return path


def _frame_name(code: CodeType, line: int) -> str:
    return f"{code.co_qualname} ({_short_path(code.co_filename)}:{line})"


def _short_path(filename: str) -> str:
    """A file's path from its package on (`broker_edge/engine/publish.py`, `asyncio/runners.py`), wherever the
    package was imported from (this checkout, another one's tree, the virtual environment, the standard
    library)."""
    for package in _PACKAGES:
        if package in filename:
            return package[1:] + filename.split(package, 1)[1]
    for marker in ("/site-packages/", "/lib/python3."):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return tail if marker == "/site-packages/" else tail.split("/", 1)[-1]
    return filename


_PACKAGES = ("/broker_edge/", "/pipelines/", "/sources/", "/sinks/", "/bench/")


def sampled(run: Callable[..., int], directory: Path) -> Callable[..., int]:
    """`run` (`main.run_broker`) sampled from its start to its end, in whichever process calls it."""

    def run_sampled(*args: Any, **kwargs: Any) -> int:
        sampler = CpuSampler(directory, within=run.__code__)
        sampler.start()
        try:
            return run(*args, **kwargs)
        finally:
            sampler.stop()

    return run_sampled


def run_command(directory: Path, argv: list[str]) -> int:
    """The `timestone` command with `argv`, every broker it serves sampled into `directory`."""
    from broker_edge.runtime import main as broker_main
    from pipelines import cli

    directory.mkdir(parents=True, exist_ok=True)
    broker_main.run_broker = sampled(broker_main.run_broker, directory)
    return int(cli.main(argv) or 0)


# -- the report ----------------------------------------------------------------------------------------------


def read_stacks(directory: Path) -> list[tuple[list[str], int]]:
    """Every stack of `directory`'s files, each frame as its function (`name (path)`, lines merged)."""
    stacks = []
    for path in sorted(directory.glob("cpu-*.txt")):
        for line in path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            stacks.append(([frame.rsplit(":", 1)[0] + ")" for frame in stack.split(";")], int(count)))
    return stacks


def shares(
    stacks: Iterable[tuple[list[str], int]], under: str | None = None
) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """All samples, and per function the samples in it and below it (inclusive) and in it alone (self); with
    `under`, only the stacks through a function of that qualified name count towards the two."""
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for frames, count in stacks:
        total += count
        if under is not None:
            names = [frame.split(" (", 1)[0] for frame in frames]
            if under not in names:
                continue
            frames = frames[names.index(under) :]
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    return total, inclusive, own


def report(directory: Path, under: str | None = None, top: int = 40) -> str:
    """The inclusive and self shares of the `top` functions, as text."""
    stacks = read_stacks(directory)
    total, inclusive, own = shares(stacks, under)
    if not total:
        return f"no samples in {directory}"
    lines = [f"{total} samples in {len(list(directory.glob('cpu-*.txt')))} process(es)"]
    for title, counter in (("in it and below it", inclusive), ("in it alone", own)):
        lines += ["", f"share of all samples {title}" + (f", under {under}" if under else "") + ":"]
        lines += [f"{count * 100 / total:6.1f} %  {name}" for name, count in counter.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "--report":
        parser = argparse.ArgumentParser(prog="python -m bench.cpu_samples --report")
        parser.add_argument("directory", type=Path)
        parser.add_argument("--under", help="a function's qualified name: the stacks through it only")
        parser.add_argument("--top", type=int, default=40)
        options = parser.parse_args(args[1:])
        print(report(options.directory, options.under, options.top))
        return 0
    if len(args) < 2:
        print(__doc__.split("\n\n", 2)[1], file=sys.stderr)
        return 2
    return run_command(Path(args[0]), args[1:])


if __name__ == "__main__":
    raise SystemExit(main())
