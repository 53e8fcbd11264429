"""The filters a broker read by topic was last listed with, and the new topics they tell apart."""

from __future__ import annotations

from sources.listed_filters import appeared, listed_filters, with_listed, without_listed
from sources.partition_offsets import MAX_KEPT_FILTERS, reads_partitions


def test_listed_brokers_name_the_filters_now_a_broker_down_keeps_those_of_its_last_listing() -> None:
    start = {"e1": {"#fplant/+/temp": 0, "plant/1/temp": 3}, "e2": {"#fold/#": 0, "old/a": 1}}
    end = with_listed(without_listed(start), start, ["e1", "e3"], ["plant/+/temp", "plant/+/alarm"])
    assert end == {
        "e1": {"#fplant/+/alarm": 0, "#fplant/+/temp": 0, "plant/1/temp": 3},
        "e2": {"#fold/#": 0, "old/a": 1},
        "e3": {"#fplant/+/alarm": 0, "#fplant/+/temp": 0},
    }
    assert listed_filters(end["e2"]) == ["old/#"]
    assert reads_partitions(end["e3"]) is False and reads_partitions(end["e1"]) is False


def test_more_filters_than_kept_name_none() -> None:
    filters = [f"plant/{number}/temp" for number in range(MAX_KEPT_FILTERS + 1)]
    assert with_listed({"e1": {"plant/1/temp": 3}}, {}, ["e1"], filters) == {"e1": {"plant/1/temp": 3}}


def test_a_topic_appeared_when_a_filter_its_broker_was_listed_with_matches_it() -> None:
    start = {"e1": {"#fplant/+/temp": 0, "plant/1/temp": 3}, "e2": {"plant/1/temp": 3}}
    listed = {
        "e1": ["plant/1/temp", "plant/2/temp", "plant/2/alarm", "$sys/x/temp"],
        "e2": ["plant/2/temp"],  # offsets written before the filters were kept: nothing is known
        "e3": ["plant/2/temp"],  # first listed now (down at the query's start)
    }
    assert appeared(start, listed) == {"e1": {"plant/2/temp"}}
