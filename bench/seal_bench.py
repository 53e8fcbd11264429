"""The sealer's CPU per record: a rolled segment's sealed index built from its rows, in process.

    .venv/bin/python -m bench.seal_bench [--rows 200000] [--passes 3] [--json]
    cd OTHER_CHECKOUT && PYTHONPATH=. python THIS_CHECKOUT/bench/seal_bench.py --json   # another checkout

A segment's rows (``ActiveIndex``) are filled the way a partition log fills them, then
``sealed_index.build`` makes the sealed index's bytes, as the sealer thread does for every rolled segment
(writing and fsyncing the file are not counted). Each figure is the process's CPU time
(``time.process_time``) per row, the best of ``--passes`` builds of the same segment:

- ``fanin``: 8 busy topics, appended in runs of 8 records (a turn's batch of a publisher's reads);
- ``fleet``: 2,000 topics, one record per append, about 100 rows each in the segment;
- ``fleet_40``: 5,000 topics, one record per append, about 40 rows each (a 10,000-device fleet's rolled
  segment);
- ``fleet_wide``: 20,000 topics, one record per append, about 10 rows each (quiet topics, below ``HOT``).

The script imports ``broker_edge`` from wherever Python finds it, so the same script measures another
checkout when run with that checkout on ``PYTHONPATH``. Where numpy is installed, the build gathers the
entries of every topic without a marker, a cut row or a gap with it (``sealed_columns``), as a broker
installed with the ``arrow`` extra does.
"""

from __future__ import annotations

import argparse
import json
import random
import time

from broker_edge.storage.active_index import NO_PREVIOUS, ActiveIndex
from broker_edge.storage.sealed_index import build

SHAPES = {"fanin": (8, 8), "fleet": (2_000, 1), "fleet_40": (5_000, 1), "fleet_wide": (20_000, 1)}
"""Shape -> (topics, records per append)."""
RECORD_BYTES = 120


def segment_rows(topics: int, per_append: int, rows: int, seed: int = 7) -> tuple[ActiveIndex, int]:
    """A segment of about ``rows`` rows over ``topics`` topics chosen at random; returns it and its size."""
    index = ActiveIndex()
    chosen = random.Random(seed)
    last: dict[int, int] = {}
    next_offset: dict[int, int] = {}
    size = time_ms = 0
    while len(index) < rows:
        topic_id = chosen.randrange(topics)
        positions = [size + RECORD_BYTES * record for record in range(per_append)]
        size += RECORD_BYTES * per_append
        offset = next_offset.get(topic_id, 0)
        last[topic_id] = index.add_rows(
            topic_id, positions, offset, time_ms, last.get(topic_id, NO_PREVIOUS), offset
        )
        next_offset[topic_id] = offset + per_append
        time_ms += 1
    return index, size


def measure(shape: str, rows: int, passes: int) -> float:
    """µs of CPU per row of the best of ``passes`` builds."""
    topics, per_append = SHAPES[shape]
    index, size = segment_rows(topics, per_append, rows)
    best = float("inf")
    for _ in range(passes):
        started = time.process_time()
        build(index, 1, 0, size)
        best = min(best, time.process_time() - started)
    return best / len(index) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="one JSON object of figures on stdout")
    args = parser.parse_args()
    figures = {shape: round(measure(shape, args.rows, args.passes), 3) for shape in SHAPES}
    if args.json:
        print(json.dumps(figures))
    else:
        for shape, figure in figures.items():
            print(f"{shape}: {figure:.2f} µs CPU per row")


if __name__ == "__main__":
    main()
