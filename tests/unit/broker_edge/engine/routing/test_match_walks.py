"""The subscription trie's count of what one match can cost (``walk``), against the walk itself."""

from __future__ import annotations

import itertools
import random

import pytest

from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions, SubscriptionTrie
from broker_edge.security.limits import LimitsConfig


def _visits(trie: SubscriptionTrie[int], topic: str) -> int:
    """The nodes ``SubscriptionTrie.match`` visits for ``topic`` (its walk, counted apart)."""
    levels = topic.split("/")

    def visit(node, index: int) -> int:
        count, children = 1, node.children
        if index == len(levels):
            return count + (1 if children and "#" in children else 0)
        if children is None:
            return count
        if not (topic.startswith("$") and index == 0):
            count += 1 if "#" in children else 0
            count += visit(children["+"], index + 1) if "+" in children else 0
        return count + (visit(children[levels[index]], index + 1) if levels[index] in children else 0)

    return visit(trie._root, 0)


def _walks(trie: SubscriptionTrie[int]) -> list[int]:
    found, stack = [], [trie._root]
    while stack:
        node = stack.pop()
        found.append(node.walk)
        if node.children:
            stack.extend(node.children.values())
    return found


def _random_filter(rng: random.Random) -> str:
    levels = [rng.choice("ab+") for _ in range(rng.randint(1, 5))]
    if rng.random() < 0.3:
        levels[-1] = "#"
    return "/".join(levels)


@pytest.mark.parametrize("seed", range(60))
def test_the_root_walk_bounds_every_match_and_is_exact_while_filters_are_only_added(seed: int) -> None:
    rng = random.Random(seed)
    trie: SubscriptionTrie[int] = SubscriptionTrie()
    held = []
    for subscriber in range(rng.randint(1, 40)):
        topic_filter = _random_filter(rng)
        predicted = trie.walk_with(topic_filter)
        trie.add(topic_filter, subscriber, SubscriptionOptions())
        assert trie._root.walk == predicted
        held.append((topic_filter, subscriber))
    counted = _walks(trie)
    trie.recount_walks()
    assert _walks(trie) == counted  # adding keeps every node's count exact
    topics = ["/".join(p) for n in range(1, 7) for p in itertools.product("ab", repeat=n)]
    assert max(_visits(trie, topic) for topic in topics) <= trie._root.walk
    for topic_filter, subscriber in rng.sample(held, max(1, len(held) // 2)):
        trie.remove(topic_filter, subscriber)
    assert not trie.walks_exact
    bound = trie._root.walk
    trie.recount_walks()
    assert trie.walks_exact and trie._root.walk <= bound
    assert max(_visits(trie, topic) for topic in topics) <= trie._root.walk


def test_filters_that_branch_at_every_level_make_the_walk_as_large_as_they_are_many() -> None:
    trie: SubscriptionTrie[int] = SubscriptionTrie()
    for number, levels in enumerate(itertools.product("a+", repeat=10)):
        trie.add("/".join(levels) + "/z", number // 100, SubscriptionOptions())
    topic = "a/a/a/a/a/a/a/a/a/a/new"
    assert _visits(trie, topic) == 2**11 - 1  # every filter's path but its last level
    assert _visits(trie, topic) <= trie._root.walk


def test_a_fleets_filters_keep_the_walk_short() -> None:
    trie: SubscriptionTrie[int] = SubscriptionTrie()
    for device in range(5_000):
        trie.add(f"devices/d-{device}/+/cmd", device, SubscriptionOptions())
        trie.add(f"actions/devices/d-{device}", device, SubscriptionOptions())
    for consumer, topic_filter in enumerate(
        [
            "fleet/+/telemetry",
            "fleet/#",
            "devices/+/status",
            "spBv1.0/+/NDATA/+",
            "$share/ingest/fleet/+/telemetry",
        ]
    ):
        trie.add(topic_filter, 10_000 + consumer, SubscriptionOptions())
    assert trie._root.walk <= 16


def test_a_trie_past_the_limit_takes_filters_that_cost_nothing_more() -> None:
    """Filters restored from sessions, or made under a higher limit, may hold the trie past the limit: a
    filter that adds nothing to the walk is still taken, one that adds is not."""
    router = Router(LimitsConfig(max_match_nodes=64))
    trie = router.trie
    session = router.session_type("restored")
    for levels in itertools.product("a+", repeat=6):
        trie.add("/".join(levels), session, SubscriptionOptions())  # as a restore adds them: unchecked
    assert trie.walk > 64
    assert router.match_cost_allows("a/a/a/a/a/a")  # held already: nothing more
    assert router.match_cost_allows("b/c")  # another branch, far shorter than the widest
    assert not router.match_cost_allows("a/a/a/a/a/a/+")  # one more level under every branch
