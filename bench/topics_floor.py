"""What creating a topic costs in CPython: the store's own bookkeeping of a new topic, piece by piece, and the
least any Python broker that keeps a topic's state must spend on it.

    .venv/bin/python -m bench.topics_floor [--topics 100000] [--rounds 5]

The topics bench's round 1 (a message to each of 100,000 new topics) is read against the same messages on 8
topics; `bench/topics_cpu.py` gives the broker's CPU per message of each round. Round 1 can reach 0.8x the
8-topic PUBACKs/s only if a new topic costs no more than the difference between a quiet topic's append
(round 2) and 1.25x an 8-topic one. This measures, in one process and without I/O, each piece of what the
store does for a new topic (the name -> id table's two misses and its insertion, the catalog entry, the
persistence rule, the topic table's row and the sorted listing, in the batches a loop turn makes) and a
floor: a dict insertion, the catalog's bytes and two column appends, what no Python design can skip.
Medians of `--rounds` runs over fresh structures, in microseconds per topic.
"""

from __future__ import annotations

import argparse
import statistics
import struct
import sys
import time
from array import array
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.topics_bench import topic_name
from broker_edge.storage import record
from broker_edge.storage.catalog import TopicCatalog
from broker_edge.storage.config import PersistRule
from broker_edge.storage.persistence import PersistenceRules
from broker_edge.storage.topic_ids import TopicIds
from broker_edge.storage.topic_order import TopicOrder
from broker_edge.storage.topic_table import NO_RULE, TopicTable

TURN = 64
"""New topics per loop turn (what 4 connections with 64 in flight each give the store at a time)."""
_ENTRY = struct.Struct("<IIIH")


def _per_topic(work: Callable[[list[str]], None], names: list[str], rounds: int) -> float:
    """Median microseconds per name of `work` over fresh copies of `names`."""
    runs = []
    for _ in range(rounds):
        fresh = [name.encode().decode() for name in names]  # names as a decoder makes them: no cached hash
        began = time.perf_counter()
        work(fresh)
        runs.append((time.perf_counter() - began) / len(names) * 1e6)
    return statistics.median(runs)


def name_misses(names: list[str]) -> None:
    """The name -> id table's two misses of a new topic (`persist_as`, then the append), 100,000 ids in it."""
    known = [f"other/{number}" for number in range(len(names))]
    get = TopicIds(known).get
    for name in names:
        get(name)
        get(name)


def catalog_entry(names: list[str]) -> None:
    """`TopicCatalog.add`: the topic's entry, kept for the next write, and its id in the name -> id table."""
    add = TopicCatalog("/nonexistent/topics.catalog").add
    for name in names:
        add(name, 0)


def persistence_rule(names: list[str]) -> None:
    """The default persistence rule (`#`, QoS 1 and 2) asked twice: `should_persist`, then `rule_number`."""
    rules = PersistenceRules([PersistRule("#", (1, 2))])
    for name in names:
        rules.should_persist(name, 1)
        rules.rule_number(name)


def table_and_listing(names: list[str]) -> None:
    """The topic table's rows and the sorted listing's places, a loop turn's new topics at once."""
    table, order = TopicTable(), TopicOrder()
    for first in range(0, len(names), TURN):
        turn = names[first : first + TURN]
        table.add_many(array("H", bytes(2 * len(turn))), array("B", [NO_RULE]) * len(turn))
        order.add_many(turn)


def floor(names: list[str]) -> None:
    """The least a Python broker does for a new topic it keeps: a dict miss and insertion, the catalog's
    bytes with their check, a partition and a next offset."""
    ids: dict[str, int] = {}
    pending: list[bytes] = []
    partitions, nexts = array("H"), array("q")
    pack, crc32c = _ENTRY.pack, record.crc32c
    for name in names:
        if name in ids:
            continue
        topic_id = len(ids)
        ids[name] = topic_id
        raw = name.encode()
        pending.append(pack(len(raw), crc32c(raw), topic_id, 0) + raw)
        partitions.append(0)
        nexts.append(0)


PIECES: dict[str, Callable[[list[str]], None]] = {
    "name -> id table: two misses": name_misses,
    "catalog entry and the name -> id table's insertion": catalog_entry,
    "persistence rule, asked twice": persistence_rule,
    "topic table row and sorted listing (a turn at once)": table_and_listing,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    names = [topic_name(number) for number in range(args.topics)]
    print(f"microseconds per new topic, {args.topics:,} topics, median of {args.rounds} runs:")
    total = 0.0
    for label, work in PIECES.items():
        cost = _per_topic(work, names, args.rounds)
        total += cost
        print(f"  {label}: {cost:.2f}")
    print(f"  the store's pieces together: {total:.2f}")
    print(f"  floor (dict, catalog bytes, two columns): {_per_topic(floor, names, args.rounds):.2f}")


if __name__ == "__main__":
    main()
