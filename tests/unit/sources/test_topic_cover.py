"""Many topic filters sent to a broker as a few that cover them (``sources.topic_cover``)."""

from __future__ import annotations

from broker_edge.protocol.topics import topic_matches
from sources.topic_cover import MAX_SENT_FILTERS, TopicMatcher, listing, sent_filters


def covered(cover: tuple[str, ...] | None, topic: str) -> bool:
    return cover is None or any(topic_matches(item, topic) for item in cover)


def test_few_filters_are_sent_as_they_are() -> None:
    filters = ("plant/+/temp", "plant/1/alarms/#")
    assert sent_filters(filters) == filters
    assert listing(filters) == (filters, None)


def test_a_topic_per_device_is_sent_as_one_filter_per_shape_that_matches_each_named_topic() -> None:
    named = [f"dev/{number}/status" for number in range(500)]
    filters = [*named, "$SYS/broker/load", "$SYS/broker/uptime", "site/7/alarms/#", "site/8/alarms/#", "+/x"]
    topics = [*named, "$SYS/broker/load", "$SYS/broker/uptime", "site/7/alarms", "site/8/alarms/a/b", "q/x"]

    cover = sent_filters(filters)

    assert cover == ("$SYS/broker/+", "+/x", "dev/+/status", "site/+/alarms/#")
    assert all(covered(cover, topic) for topic in topics)
    keep = TopicMatcher(filters)
    assert all(keep(topic) for topic in topics)
    assert not any(keep(topic) for topic in ("dev/x/other", "$SYS/other/x", "site/9/other", "dev/999/status"))


def test_a_hubs_site_filters_keep_their_dollar_level() -> None:
    filters = [f"$site/+/dev/{number}/status" for number in range(200)]
    assert sent_filters(filters) == ("$site/+/dev/+/status",)


def test_filters_no_few_cover_are_sent_as_none_and_listed_as_every_log() -> None:
    filters = [f"{'a/' * depth}leaf" for depth in range(MAX_SENT_FILTERS + 1)]
    assert sent_filters(filters) is None
    sent, keep = listing(filters)
    assert sent == (None,) and keep is not None and keep("a/a/leaf") and not keep("a/b/leaf")
