"""The subscription trie and the retained store on their own: matching rules, merging, cache invalidation."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from broker_edge.engine.routing.retained import RetainedBounds, RetainedStore
from broker_edge.engine.routing.subscriptions import SharedGroup, SubscriptionOptions, SubscriptionTrie


def subscribers(trie: SubscriptionTrie, topic: str) -> dict:
    return {s: (qos, sub_ids) for s, qos, _nl, _rap, sub_ids in trie.match(topic).subscribers}


def _picked(group: SharedGroup[str], prefer: Callable[[str], bool]) -> str:
    picked = group.pick(prefer)
    assert picked is not None
    return picked[0]


def test_wildcards_dollar_and_parent_match():
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("a/+/c", "plus", SubscriptionOptions(0))
    trie.add("a/#", "hash", SubscriptionOptions(0))
    trie.add("#", "all", SubscriptionOptions(0))
    trie.add("$SYS/#", "sys", SubscriptionOptions(0))
    assert set(subscribers(trie, "a/b/c")) == {"plus", "hash", "all"}
    assert set(subscribers(trie, "a")) == {"hash", "all"}
    assert set(subscribers(trie, "$SYS/broker/uptime")) == {"sys"}
    assert set(subscribers(trie, "a/b")) == {"hash", "all"}


@pytest.mark.mqtt311("MQTT-3.3.5-1")
def test_one_entry_per_subscriber_with_max_qos_and_all_identifiers():
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("x/+", "s", SubscriptionOptions(0, subscription_id=1))
    trie.add("x/#", "s", SubscriptionOptions(2, subscription_id=2))
    trie.add("x/y", "s", SubscriptionOptions(1))
    qos, sub_ids = subscribers(trie, "x/y")["s"]
    assert (qos, sorted(sub_ids)) == (2, [1, 2])


def test_cache_is_invalidated_by_changes_and_branches_pruned():
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    trie.add("k", "a", SubscriptionOptions(0))
    assert set(subscribers(trie, "k")) == {"a"}
    trie.add("k", "b", SubscriptionOptions(0))
    assert set(subscribers(trie, "k")) == {"a", "b"}
    assert trie.remove("k", "a") and trie.remove("k", "b")
    assert not trie.remove("k", "b")
    assert trie.match("k").subscribers == [] and trie.count == 0
    assert list(trie.subscriptions()) == []


def test_shared_group_round_robin_prefers_online():
    trie: SubscriptionTrie[str] = SubscriptionTrie()
    for member in ("m1", "m2", "m3"):
        trie.add("jobs/#", member, SubscriptionOptions(1), share_group="g")
    [group] = trie.match("jobs/1").groups
    online = {"m1", "m3"}
    picks = [_picked(group, lambda m: m in online) for _ in range(4)]
    assert picks == ["m1", "m3", "m1", "m3"]
    assert _picked(group, lambda m: False) in {"m1", "m2", "m3"}


@pytest.mark.mqtt311("MQTT-3.3.1-11")
@pytest.mark.mqtt5("MQTT-3.3.1-7")
def test_retained_store_matching_limits_and_expiry():
    store = RetainedStore(RetainedBounds(max_retained=3), is_expired=lambda message: message == "old")
    assert (
        store.set("a/b", "1") is None and store.set("a/c", "2") is None and store.set("$SYS/x", "3") is None
    )
    assert store.set("z", "4") == "retained_full"
    assert store.set("a/b", "1b") is None  # replacing is always allowed
    assert sorted(store.match("a/+")) == [("a/b", "1b"), ("a/c", "2")]
    assert sorted(t for t, _ in store.match("#")) == ["a/b", "a/c"]
    assert store.match("$SYS/#") == [("$SYS/x", "3")]
    assert store.clear("a/c") and store.count == 2
    store.set("a/old", "old")
    assert store.match("a/#") == [("a/b", "1b")]
    assert store.get("a/old") is None


def test_retained_bytes_are_bounded_in_all_and_per_publishing_client():
    store = RetainedStore(RetainedBounds(max_bytes=1000, max_bytes_per_client=600))
    assert store.set("site/1/state", "s1", size=500, owner="meter-1") is None
    assert store.set("site/1/config", "c1", size=200, owner="meter-1") == "retained_client_bytes"
    assert store.set("site/1/state", "s1b", size=550, owner="meter-1") is None  # a replacement frees its own
    assert (store.bytes, store.bytes_of("meter-1")) == (550, 550)
    assert store.set("site/2/state", "s2", size=500, owner="meter-2") == "retained_bytes"
    assert store.get("site/2/state") is None
    assert store.set("site/2/state", "s2", size=450, owner="meter-2") is None
    assert store.set("site/1/state", "taken", size=100, owner="meter-2") is None  # another client replaces it
    assert (store.bytes_of("meter-1"), store.bytes_of("meter-2"), store.bytes) == (0, 550, 550)
    assert store.clear("site/2/state")
    assert (store.bytes_of("meter-2"), store.bytes, store.count) == (100, 100, 1)


def test_without_subscriptions_topics_match_nothing_and_are_not_cached():
    trie: SubscriptionTrie[str] = SubscriptionTrie(cache_size=4)
    for number in range(10):
        assert trie.match(f"fleet/device-{number}").subscribers == []
    assert trie.cached_topics() == 0
    trie.add("fleet/+", "s", SubscriptionOptions(0))
    assert set(subscribers(trie, "fleet/device-1")) == {"s"}
    assert trie.remove("fleet/+", "s")
    assert trie.match("fleet/device-1").subscribers == []


def test_a_full_match_cache_keeps_its_topics_until_as_many_have_missed_it():
    trie: SubscriptionTrie[str] = SubscriptionTrie(cache_size=4)
    trie.add("fleet/+/telemetry", "consumer", SubscriptionOptions(1))
    topics = [f"fleet/device-{number}/telemetry" for number in range(5)]
    matches = [trie.match(topic) for topic in topics[:4]]
    assert all(match is matches[0] for match in matches)  # one Match for every topic of the same filters
    assert set(subscribers(trie, topics[4])) == {"consumer"}  # full: answered, not cached, nothing emptied
    assert trie.cached_topics() == 4
    for _ in range(2):  # a cycle of five topics: the first four stay cached, the fifth misses
        for topic in topics:
            assert set(subscribers(trie, topic)) == {"consumer"}
    assert trie.cached_topics() == 4
    trie.match(topics[4])  # the fourth miss since it was full: emptied, then this topic cached
    assert trie.cached_topics() == 1
    assert set(subscribers(trie, topics[0])) == {"consumer"}  # the cache fills again
    assert trie.cached_topics() == 2
