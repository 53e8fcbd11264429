"""The shared cache of recent logged messages: batches per topic, bounded, least recent topics dropped."""

from __future__ import annotations

from broker_edge.engine.message import Message
from broker_edge.engine.ports import AppendedRun
from broker_edge.engine.recent_messages import TOPIC_WEIGHT, RecentMessages


def _messages(topic: str, first: int, count: int) -> list[Message]:
    return [Message(topic, b"%d" % n, 1, False, None, "c", n, None) for n in range(first, first + count)]


def test_a_batch_is_found_by_offset_and_the_same_object_is_shared():
    recent = RecentMessages(100)
    batch = _messages("a", 10, 5)
    recent.add("a", 10, batch)
    assert [recent.get("a", n) for n in range(10, 15)] == batch
    assert recent.get("a", 12) is batch[2]
    assert recent.get("a", 9) is None and recent.get("a", 15) is None and recent.get("b", 10) is None
    assert len(recent) == 5


def test_over_the_bound_the_topic_added_to_least_recently_goes_first():
    recent = RecentMessages(10 + 2 * TOPIC_WEIGHT)
    recent.add("old", 0, _messages("old", 0, 4))
    recent.add("new", 0, _messages("new", 0, 4))
    recent.add("old", 4, _messages("old", 4, 2))  # "old" is now the most recent topic
    recent.add("new", 4, _messages("new", 4, 2))
    assert len(recent) <= 10
    assert recent.get("old", 0) is None  # dropped whole
    assert recent.get("new", 5) is not None and recent.get("new", 0) is not None


def test_one_topic_over_the_bound_keeps_its_latest_half():
    recent = RecentMessages(10)
    recent.add("t", 0, _messages("t", 0, 8))
    recent.add("t", 8, _messages("t", 8, 8))
    assert len(recent) == 5
    assert [n for n in range(16) if recent.get("t", n) is not None] == [11, 12, 13, 14, 15]


def test_adding_an_offset_again_replaces_it_without_counting_twice():
    recent = RecentMessages(10)
    recent.add("t", 0, _messages("t", 0, 3))
    again = _messages("t", 1, 1)
    recent.add("t", 1, again)
    assert len(recent) == 3 and recent.get("t", 1) is again[0]


def test_a_topic_weighs_against_the_bound_like_a_message():
    recent = RecentMessages(10)
    for number in range(10):  # a topic per message, as a fleet with a topic per device publishes
        recent.add(f"device/{number}", 0, _messages(f"device/{number}", 0, 1))

    kept = [number for number in range(10) if recent.get(f"device/{number}", 0) is not None]
    assert kept == list(range(10 - 10 // (1 + TOPIC_WEIGHT), 10))
    assert len(recent) == len(kept)


def test_a_topic_begun_by_one_message_weighs_as_one_begun_by_a_batch():
    def kept(recent: RecentMessages) -> list[tuple[str, int]]:
        recent.add("b", 0, _messages("b", 0, 5))  # over the bound: the least recent topic goes
        return [(topic, n) for topic in "ab" for n in range(5) if recent.get(topic, n) is not None]

    one, batch = RecentMessages(6 + 2 * TOPIC_WEIGHT), RecentMessages(6 + 2 * TOPIC_WEIGHT)
    one.add("a", 0, _messages("a", 0, 1))
    one.add("a", 1, _messages("a", 1, 2))
    batch.add("a", 0, _messages("a", 0, 3))
    assert len(one) == len(batch) == 3
    assert kept(one) == kept(batch) == [("b", n) for n in range(5)]


def test_a_turns_runs_added_at_once_keep_what_adding_each_keeps():
    def turn(number: int) -> list[AppendedRun]:  # a topic per device: each topic once per turn
        return [
            AppendedRun(f"device/{number}-{n}", n, _messages(f"device/{number}-{n}", n, 1 + n % 3))
            for n in range(9)
        ]

    def kept(recent: RecentMessages, runs: list[AppendedRun]) -> list[tuple[str, int]]:
        offsets = [(run.topic, n) for run in runs for n in range(run.first_offset, run.end_offset)]
        return [(topic, n) for topic, n in offsets if recent.get(topic, n) is not None]

    each, at_once = RecentMessages(12), RecentMessages(12)
    turns = [turn(number) for number in range(3)]
    for runs in turns:
        for run in runs:
            each.add(run.topic, run.first_offset, run.messages)
        at_once.add_runs(runs)

    every = [run for runs in turns for run in runs]
    assert kept(at_once, every) == kept(each, every) == kept(each, turns[-1][-5:])
    assert len(at_once) == len(each) <= 12
