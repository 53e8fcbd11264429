"""What the machine is, and how much memory and CPU a process tree uses (read from /proc)."""

from __future__ import annotations

import os
import platform
import resource
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class MachineInfo:
    """The facts about the machine printed at the top of the results."""

    cpu_model: str
    cores: int
    memory_gib: float
    kernel: str
    python: str


def machine_info() -> MachineInfo:
    """Describe this machine from /proc and the platform module."""
    return MachineInfo(
        cpu_model=_cpu_model(),
        cores=os.cpu_count() or 1,
        memory_gib=_meminfo_kib("MemTotal") / 1024**2,
        kernel=f"{platform.system()} {platform.release()}",
        python=sys.version.split()[0],
    )


def when_and_where() -> str:
    """The date, the machine and its load average now, as the first line of a result section."""
    from datetime import UTC, datetime

    info = machine_info()
    load = os.getloadavg()
    return (
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC; {info.cpu_model}, {info.cores} cores,"
        f" {info.memory_gib:.0f} GiB; load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f};"
        f" Python {info.python}."
    )


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _meminfo_kib(field: str) -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants (a broker may fork workers: they count as the broker)."""
    seen: list[int] = []
    todo = [pid]
    while todo and len(seen) < 10_000:
        current = todo.pop()
        seen.append(current)
        try:
            for task in Path(f"/proc/{current}/task").iterdir():
                children = (task / "children").read_text().split()
                todo.extend(int(c) for c in children)
        except OSError:
            continue
    return seen


def pin_tree(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid`'s process tree held to `cpus` (threads made later inherit it from their maker).

    For a command whose own bounds count the CPUs it may run on (`timestone broker --workers N` takes at most
    two members per CPU): started free, held to its CPUs once running."""
    for process in process_tree(pid):
        try:
            tasks = list(Path(f"/proc/{process}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:  # (ended meanwhile)
                continue


def rss_bytes(pid: int) -> int:
    """Resident memory (VmRSS) of the process tree rooted at `pid`, in bytes."""
    total = 0
    for member in process_tree(pid):
        try:
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            continue
    return total


def cpu_seconds(pid: int) -> float:
    """User + system CPU time consumed so far by the process tree rooted at `pid`."""
    total = 0
    for member in process_tree(pid):
        try:
            stat = Path(f"/proc/{member}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return total / _CLOCK_TICKS


def machine_busy_seconds() -> float:
    """CPU seconds all CPUs of the machine spent busy since boot (everything but idle and iowait)."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / _CLOCK_TICKS


def dir_bytes(path: Path) -> int:
    """Total size of the files under `path` (0 if it does not exist)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
    return total


def raise_fd_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit; return the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def split_cpus() -> tuple[set[int] | None, set[int] | None]:
    """(CPUs for the broker, CPUs for the load generator), or (None, None) when there is only one CPU.

    The broker gets the first CPU this process may use and the load generator all the others, so that neither
    steals cycles from the other and the figures are repeatable.
    """
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    return {allowed[0]}, set(allowed[1:])


SHARED_MACHINE_CPU = 0.1
"""Other processes' mean use (in CPUs) above which a result says the machine was shared."""


def machine_load_sentence(other_cpu: float, effect: str) -> str:
    """Whether the run had the machine to itself, for a result's header: ``other_cpu`` is what everything
    else used on average, in CPUs; ``effect`` says how sharing skews this benchmark's figures."""
    if other_cpu > SHARED_MACHINE_CPU:
        return f"the machine was shared: {effect}"
    return "the machine was otherwise idle"


def spark_process_id(spark: SparkSession) -> int:
    """The process id of a local SparkSession's JVM (its CPU counts as Spark's)."""
    gateway = spark.sparkContext._gateway
    assert gateway is not None, "a local session has its JVM's gateway"
    return gateway.proc.pid
