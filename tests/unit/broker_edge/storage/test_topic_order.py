"""The sorted listing of topic names: names added one by one or a loop turn's at once, walked by prefix."""

from __future__ import annotations

import random

from broker_edge.storage.topic_order import CHUNK, TopicOrder


def _chunk_sizes(order: TopicOrder) -> list[int]:
    return [len(chunk) for chunk in order.chunks_from()]


def test_names_added_in_turns_are_listed_sorted_in_chunks_below_the_bound():
    generator = random.Random(7)
    names = [f"site-{generator.randrange(40)}/device-{number}/telemetry" for number in range(9_000)]
    order = TopicOrder(names[:1_500])
    start = 1_500
    while start < len(names):  # turns of every size, one that fills several chunks at once among them
        size = generator.choice((1, 3, 100, 2_500))
        order.add_many(names[start : start + size])
        start += size

    assert list(order) == sorted(names)
    assert len(order) == len(names)
    assert max(_chunk_sizes(order)) < CHUNK
    assert [name for chunk in order.chunks_from("site-17/") for name in chunk] == sorted(
        name for name in names if name.startswith("site-17/")
    )


def test_a_fleets_new_devices_land_at_the_end_and_one_by_one_gives_the_same_order():
    one_by_one, in_turns = TopicOrder(), TopicOrder()
    names = [f"fleet/device-{number:07}" for number in range(5_000)]
    for name in names:
        one_by_one.add(name)
    for start in range(0, len(names), 100):
        in_turns.add_many(reversed(names[start : start + 100]))
    in_turns.add_many([])

    assert list(in_turns) == list(one_by_one) == names
    assert max(_chunk_sizes(in_turns)) < CHUNK
