"""`timestone` run with a bench-only hook that looks inside the broker process while it serves.

    python -m bench.traced_broker CONTROL_DIR broker --config FILE

Runs the `timestone` command (`pipelines.cli.main`) unchanged, plus a thread that polls `CONTROL_DIR`
twice a second for a request file and answers it with a file of the same name and a `.done` suffix:

* `start`: start `tracemalloc` (10 frames; `start-<n>`: n frames, 1 being the cheapest). Started once the
  broker is warm, it traces only what is allocated from then on, so the broker runs at full speed through
  its warm-up.
* `probe-<name>`: after a full garbage collection, write `<name>.probe`: the broker's containers by their
  path from the `Broker` object and their sizes (`container_sizes`), the objects the garbage collector
  tracks by type, Python's allocated blocks (`sys.getallocatedblocks`), glibc's `mallinfo2`, Python's
  own allocator's arenas and the free space inside them (`pymalloc_stats`) and VmRSS;
  with tracing started, the 40 source lines holding most traced memory. A probe is light enough to repeat
  every minute of a long run at a small load (`bench.soak_probe`).
* `snap-<name>`: after a full garbage collection, write `<name>.snapshot` (a `tracemalloc` snapshot, if
  tracing was started), `<name>.malloc` (glibc's `mallinfo2`: bytes in use and free in the C heap, the
  memory `tracemalloc` itself holds, Python's allocator's arenas (`pymalloc_stats`), the threads of the
  process, the objects the garbage collector tracks)
  and `<name>.types` (those objects counted by type); `.malloc` also names the Python threads and counts
  glibc's heaps (`malloc_info`).

Without `start` the broker is not traced and runs as fast as the `timestone` command: the type counts of
two snapshots then tell which Python objects grow, at full load (tracing a broker at full load slows it
until it cannot keep up).

The soak uses it to compare two snapshots taken once warm (`soak_bench.traced_growth`); nothing of it is in
the broker itself.
"""

from __future__ import annotations

import collections
import gc
import json
import os
import sys
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from broker_edge.process.heap_trim import MALLINFO2_FIELDS, bound_arenas, heap_count, mallinfo2_function

FRAMES = 10


def malloc_stats() -> dict[str, int]:
    """glibc's view of the C heap (all arenas): `arena` bytes from sbrk/heaps, `hblkhd` in mmapped blocks,
    `uordblks` in use, `fordblks` free; empty where there is no `mallinfo2`."""
    mallinfo2 = mallinfo2_function()
    if mallinfo2 is None:
        return {}
    info = mallinfo2()
    return {name: int(getattr(info, name)) for name in MALLINFO2_FIELDS}


_PYMALLOC_LINES = {
    "# arenas allocated current": "arenas",
    "# bytes in allocated blocks": "allocated_bytes",
    "# bytes in available blocks": "available_bytes",
    "unused pools": "unused_pool_bytes",
}


def pymalloc_stats() -> dict[str, int]:
    """Python's own allocator (`sys._debugmallocstats`): its arenas held, the bytes of its blocks in use, the
    bytes of free blocks in pools in use, and of the unused pools inside its arenas (an arena goes back to
    the system only when all of its pools are unused: the free blocks and unused pools of arenas still in
    use are resident memory that holds no object). Empty where the function does not exist."""
    report = getattr(sys, "_debugmallocstats", None)
    if report is None:
        return {}
    with tempfile.TemporaryFile("w+") as captured:
        sys.stderr.flush()
        saved = os.dup(2)  # the report is written to the C library's stderr
        try:
            os.dup2(captured.fileno(), 2)
            report()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        captured.seek(0)
        text = captured.read()
    stats: dict[str, int] = {}
    for line in text.splitlines():
        label, _, value = line.partition("=")
        for prefix, name in _PYMALLOC_LINES.items():
            if prefix in label and name not in stats:
                stats[name] = int(value.strip().replace(",", ""))
    return stats


_BROKERS: list[Any] = []
"""The `Broker` objects made in this process (recorded by `_record_brokers`)."""
_CONTAINERS = (dict, list, set, frozenset, tuple, bytearray, bytes, collections.deque)
_LEAVES = (type, type(sys), type(len), str, int, float, bool)


def _record_brokers() -> None:
    """Record every `Broker` made from now on: the probe starts its walk there (the broker's objects are
    frozen out of the garbage collector's lists once it has started)."""
    from broker_edge.runtime.broker import Broker

    made = Broker.__init__

    def init(self: Broker, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        _BROKERS.append(self)

    Broker.__init__ = init  # type: ignore[method-assign]  # a bench-only hook on the class, for the probe


def _attributes(obj: object) -> Iterator[tuple[str, object]]:
    names = getattr(obj, "__dict__", None)
    if isinstance(names, dict):
        yield from list(names.items())
    for klass in type(obj).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if hasattr(obj, slot):
                yield slot, getattr(obj, slot)


def container_sizes(root: object, depth: int = 5) -> dict[str, int]:
    """Sizes of the containers reachable from `root` through attributes (not through container items,
    except the first value of a dict, named `[*]`, which stands for the objects a map holds), by path."""
    sizes: dict[str, int] = {}
    seen: set[int] = set()
    todo: list[tuple[str, object, int]] = [("broker", root, 0)]
    while todo:
        path, obj, level = todo.pop()
        if id(obj) in seen or obj is None or isinstance(obj, _LEAVES) or (callable(obj) and level):
            continue
        seen.add(id(obj))
        if isinstance(obj, _CONTAINERS):
            try:
                sizes[path] = len(obj)
            except TypeError:
                continue
            if isinstance(obj, dict) and obj and level < depth:
                try:
                    first = next(iter(obj.values()))
                except (StopIteration, RuntimeError):
                    continue
                todo.append((f"{path}[*]", first, level + 1))
            continue
        if level < depth:
            for name, value in _attributes(obj):
                if not name.startswith("__"):
                    todo.append((f"{path}.{name}", value, level + 1))
    return sizes


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _probe(control: Path, label: str) -> None:
    gc.collect()
    maps: dict[str, int] = {}
    for number, broker in enumerate(_BROKERS):
        maps.update({f"{number}:{path}": size for path, size in container_sizes(broker).items()})
    probe: dict[str, Any] = {
        "at": time.time(),
        "rss": _rss(),
        "allocated_blocks": sys.getallocatedblocks(),
        "malloc": malloc_stats(),
        "pymalloc": pymalloc_stats(),
        "gc_objects": len(gc.get_objects()),
        "types": dict(collections.Counter(type(o).__qualname__ for o in gc.get_objects())),
        "maps": maps,
    }
    if tracemalloc.is_tracing():
        snapshot = tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__)]
        )
        probe["traced"] = [
            [f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}", s.size, s.count]
            for s in snapshot.statistics("lineno")[:40]
        ]
    (control / f"{label}.probe").write_text(json.dumps(probe))


def _answer(control: Path, request: Path) -> None:
    name = request.name
    if name == "start" or name.startswith("start-"):
        tracemalloc.start(int(name.partition("-")[2] or FRAMES))
    elif name.startswith("probe-"):
        _probe(control, name[len("probe-") :])
    elif name.startswith("snap-"):
        label = name[len("snap-") :]
        gc.collect()
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(str(control / f"{label}.snapshot"))
        stats = {
            **malloc_stats(),
            **{f"pymalloc_{name}": value for name, value in pymalloc_stats().items()},
            "tracemalloc_bytes": tracemalloc.get_tracemalloc_memory(),
            "threads": threading.active_count(),
            "thread_names": sorted(thread.name for thread in threading.enumerate()),
            "heaps": heap_count(),
            "gc_objects": len(gc.get_objects()),
        }
        (control / f"{label}.malloc").write_text(json.dumps(stats))
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        (control / f"{label}.types").write_text(json.dumps(dict(types)))
    request.rename(control / f"{name}.done")


def _watch(control: Path) -> None:
    while True:
        for request in sorted(control.iterdir()):
            if (
                request.suffix not in (".done", ".snapshot", ".malloc", ".types", ".probe")
                and request.is_file()
            ):
                _answer(control, request)
        time.sleep(0.5)


def request(control: Path, name: str, timeout_s: float = 60.0) -> bool:
    """Ask the traced broker for `name` (see the module docstring) and wait for its answer."""
    (control / name).write_text("")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (control / f"{name}.done").exists():
            return True
        time.sleep(0.2)
    return False


def main(argv: list[str]) -> int:
    control = Path(argv[0])
    control.mkdir(parents=True, exist_ok=True)
    bound_arenas()  # as `timestone broker` does first, before this module's thread starts
    _record_brokers()
    threading.Thread(target=_watch, args=(control,), name="bench-trace", daemon=True).start()
    from pipelines.cli import main as timestone

    return timestone(argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
