"""The read turns' own CPU per read as a fleet's reads meet them: most kept for a later turn, handed back.

    .venv/bin/python -m bench.turns_cpu [--readers 1000] [--turns 200] [--passes 9] [--json]
    cd OTHER_CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/bench/turns_cpu.py --json   # another checkout

A ``ReadTurns`` with the default budget (64 KiB, 1,024 packets a turn) and ``--readers`` connections, each
reading one 140-byte packet a turn (a device's QoS 1 publish on a topic of its own): about 470 reads fit a
turn's bytes, the rest are kept and handed back at the start of the next turns, as in the fleet bench, where
10,000 devices' reads come about 1,000 to a turn of uvloop. The readers do nothing with their bytes, so the
figure is the turns' own work per read (the harness's loop included, the same on both sides): the best of
``--passes`` passes' process CPU time (``time.process_time``) per read, after 50 turns of warm-up.

The script imports ``broker_edge`` from wherever Python finds it: run it with another checkout on
``PYTHONPATH`` to measure that one (before and after a change, taking turns).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from broker_edge.runtime.transports.turns import ReadTurns

READ = bytes(140)
BUDGET = 64 * 1024


class Reader:
    """A connection that handles any bytes at once and is never held."""

    __slots__ = ("held",)

    def __init__(self) -> None:
        self.held = 0

    def handle_bytes(self, data: bytes) -> int:
        return 0

    def pause_for_turn(self) -> None:
        self.held = 1

    def resume_after_turn(self) -> None:
        if self.held:
            self.held = 0

    def may_read(self) -> bool:
        return not self.held & ~1

    def awaits_acknowledgements(self) -> bool:
        return False


def measure(readers: int, turns: int, passes: int) -> float:
    """CPU microseconds per read: the best of ``passes`` passes of ``turns`` turns of ``readers`` reads."""
    soon: list[Callable[[], None]] = []
    read_turns = ReadTurns(BUDGET, soon.append)
    line = [Reader() for _ in range(readers)]

    def turn() -> None:
        for reader in line:
            now = read_turns.take(reader, READ)
            if now is not None:
                reader.handle_bytes(now)
        while soon:  # the loop's callbacks: the next turn hands the kept reads back
            soon.pop(0)()

    for _ in range(50):
        turn()
    best = float("inf")
    for _ in range(passes):
        started = time.process_time()
        for _ in range(turns):
            turn()
        best = min(best, time.process_time() - started)
    return best / (turns * readers) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readers", type=int, default=1000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--passes", type=int, default=9)
    parser.add_argument("--json", action="store_true", help="one JSON object of figures on stdout")
    args = parser.parse_args()
    figure = round(measure(args.readers, args.turns, args.passes), 3)
    if args.json:
        print(json.dumps({"us_per_read": figure}))
    else:
        print(f"{figure:.3f} µs CPU per read")


if __name__ == "__main__":
    main()
