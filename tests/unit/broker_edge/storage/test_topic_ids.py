"""Topic name -> id (`TopicIds`): every name found through the table's growth, none found twice, and a
footprint of a few bytes per topic (the names themselves are the catalog's)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest

from broker_edge.storage.topic_ids import TopicIds


def _name(number: int) -> str:
    return f"plant/{number % 7}/device-{number:06d}/telemetry"


def test_names_added_one_by_one_are_found_through_every_growth():
    names: list[str] = []
    ids = TopicIds(names)
    for number in range(20_000):
        names.append(_name(number))
        ids.added(number)
        if number % 1000 == 999:  # in the middle of moving ids to a larger table, too
            assert all(ids.get(_name(seen)) == seen for seen in range(0, number + 1, 37))

    assert len(ids) == 20_000
    assert [ids[_name(number)] for number in range(20_000)] == list(range(20_000))
    assert ids.get("plant/0/device-020000/telemetry") is None
    assert "plant/1/device-000001/telemetry" in ids and "nothing" not in ids and 7 not in ids
    with pytest.raises(KeyError):
        ids["nothing"]


def test_a_table_built_from_names_finds_them_and_refuses_a_name_given_twice():
    names = [_name(number) for number in range(5000)] + ["", "a/b", "a/b/"]
    ids = TopicIds(names)

    assert [ids.get(name) for name in names] == list(range(len(names)))
    with pytest.raises(ValueError, match="named twice"):
        TopicIds(["a", "b", "a"])


def _traced_bytes(build: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = build()
        traced = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept is not None
    return traced


def test_a_topic_costs_a_slot_or_two_of_four_bytes():
    names = [_name(number) for number in range(50_000)]

    def one_by_one() -> TopicIds:
        grown: list[str] = []
        ids = TopicIds(grown)
        for number, name in enumerate(names):
            grown.append(name)
            ids.added(number)
        return ids

    at_open = _traced_bytes(lambda: TopicIds(names))
    added = _traced_bytes(one_by_one)  # its list of names (8 bytes a topic) included

    assert at_open / len(names) <= 16, f"{at_open / len(names):.1f} bytes per topic"
    assert added / len(names) <= 16 + 10, f"{added / len(names):.1f} bytes per topic"
