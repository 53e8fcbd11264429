"""The broker's own CPU seconds per round of the topics bench: 8 topics against N, the same messages.

    .venv/bin/python -m bench.topics_cpu [--topics 100000] [--profile DIR]

PUBACKs/s on a machine that other work shares move with its load; the CPU the broker process spent in a
round (user and system, every thread, from /proc/<pid>/stat) does not, so the cost of a publish to a new
topic (round 1) or to a quiet one (round 2: every topic again, once) is read against the same round on 8
topics. Same broker, settings, load and pinning as `bench/topics_bench.py`, without its memory, restart,
listing and Spark parts. `--profile DIR` runs each broker under cProfile (its figures then include the
profiler's cost: compare shares, not seconds) and leaves `DIR/8.prof` and `DIR/<N>.prof`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import net
from bench.sysinfo import split_cpus
from bench.topic_load import publish_rounds
from bench.topics_bench import PAYLOAD, WINDOW, BenchTimestone, fresh_process, shares, topic_name


@dataclass(frozen=True)
class Round:
    """One round: the broker's user and system CPU seconds, and the PUBACKs/s the load generator saw."""

    user: float
    system: float
    rate: float

    @property
    def cpu(self) -> float:
        return self.user + self.system


class ProfiledTimestone(BenchTimestone):
    """The bench's broker, under cProfile writing `profile` when it stops (None: as is)."""

    def __init__(self, offsets_port: int, profile: Path | None) -> None:
        super().__init__(offsets_port)
        self.profile = profile

    def command(self, port: int, workdir: Path) -> list[str]:
        command = super().command(port, workdir)
        if self.profile is None:
            return command
        return [sys.executable, "-m", "cProfile", "-o", str(self.profile), *command]


def _user_system(pid: int) -> tuple[float, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / ticks, int(fields[12]) / ticks


def run_rounds(topics: list[str], messages: int, profile: Path | None) -> list[Round]:
    """Two rounds of `messages` QoS 1 publishes over `topics` on a fresh broker: its CPU in each."""
    broker_cpus, load_cpus = split_cpus()
    rounds: list[Round] = []
    with fresh_process(
        ProfiledTimestone(net.free_port(), profile), "bench-topics-cpu-", broker_cpus
    ) as process:
        process.start()
        work = shares(topics, messages)
        for _ in range(2):
            user, system = _user_system(process.pid)
            result = publish_rounds(process.port, work, PAYLOAD, WINDOW, load_cpus)
            after_user, after_system = _user_system(process.pid)
            rounds.append(Round(after_user - user, after_system - system, result.rate))
        process.stop(signal.SIGTERM)
    return rounds


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--topics", type=int, default=100_000, help="topics (and messages per round)")
    parser.add_argument("--profile", type=Path, default=None, help="directory for the brokers' cProfile")
    args = parser.parse_args(argv)
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    count = args.topics
    cases = {
        "8 topics": ([topic_name(n) for n in range(8)], "8.prof"),
        f"{count:,} topics": ([topic_name(n) for n in range(count)], f"{count}.prof"),
    }
    results = {}
    for label, (topics, profile_name) in cases.items():
        profile = args.profile / profile_name if args.profile is not None else None
        results[label] = run_rounds(topics, count, profile)
    print(f"{count:,} QoS 1 messages per round; the broker's CPU seconds (user + system) and PUBACKs/s:")
    for label, rounds in results.items():
        for number, one in enumerate(rounds, 1):
            print(
                f"  {label}, round {number}: {one.cpu:.2f} s ({one.user:.2f} + {one.system:.2f}), "
                f"{one.rate:,.0f} PUBACKs/s"
            )
    few, many = results.values()
    for number, (base, other) in enumerate(zip(few, many, strict=True), 1):
        print(
            f"  round {number}: CPU {other.cpu / base.cpu:.2f}x the 8-topic round's, "
            f"PUBACKs/s {other.rate / base.rate:.2f}x"
        )


if __name__ == "__main__":
    main()
