"""The retained snapshot a starting broker loads from a peer: what travels, what is kept local, and how a
snapshot meets the changes the broker made meanwhile."""

from __future__ import annotations

import asyncio

from broker_edge.cluster.features.retained_sync import (
    RetainedSync,
    decode_snapshot,
    encode_snapshot,
    snapshot_page,
)
from broker_edge.cluster.links.peer_link import PeerLinks
from broker_edge.cluster.view import ClusterView
from broker_edge.engine.message import Message
from broker_edge.engine.ports import ClusterPorts
from broker_edge.engine.routing.retained import RetainedStore
from broker_edge.engine.routing.router import Router
from broker_edge.protocol.properties import Properties
from broker_edge.security.limits import LimitsConfig


def test_a_snapshot_carries_every_field_and_offset_but_not_the_brokers_own_sys_topics():
    props = Properties(content_type="text/plain", user_properties=[("k", "v")])
    entries = [
        ("a/b", Message("a/b", b"one", 1, True, props, "dev-1", 41, 1000.0 + 30)),
        ("$SYS/broker/uptime", Message("$SYS/broker/uptime", b"9", 0, True)),
        ("c", Message("c", b"two", 2, True)),
    ]
    decoded = decode_snapshot(encode_snapshot(entries), now=2000.0)
    assert [(m.topic, m.payload, m.qos, m.retain, m.origin, m.offset) for m in decoded] == [
        ("a/b", b"one", 1, True, "dev-1", 41),
        ("c", b"two", 2, True, "", None),
    ]
    assert decoded[0].properties is not None
    assert decoded[0].properties.content_type == "text/plain"
    assert decoded[0].properties.user_properties == [("k", "v")]
    assert decoded[1].expires_at is None


def test_items_lists_every_retained_topic_dollar_topics_included_and_leaves_out_the_expired():
    store = RetainedStore(is_expired=Message.expired)
    store.set("a", Message("a", b"1", retain=True))
    store.set("a/b/c", Message("a/b/c", b"2", retain=True))
    store.set("$app/x", Message("$app/x", b"3", retain=True))
    store.set("gone", Message("gone", b"4", retain=True, expires_at=0.0))
    assert sorted(topic for topic, _ in store.items()) == ["$app/x", "a", "a/b/c"]


class _Receiver:
    def forwarded(self, link, batch, messages):  # pragma: no cover - not used
        raise AssertionError

    def unlogged(self, message):  # pragma: no cover - not used
        raise AssertionError


def test_changes_made_while_loading_win_over_the_snapshot_and_waiting_subscriptions_are_served_after():
    asyncio.run(_changes_made_while_loading_win())


async def _changes_made_while_loading_win():
    router = Router(LimitsConfig())
    view = ClusterView("b", 4)
    sync = RetainedSync(router, view, PeerLinks("b", None, _Receiver()), asyncio.get_running_loop(), 5.0)
    router.join_cluster(ClusterPorts(retained_sync=sync))
    served: list[str] = []
    assert sync.retained_gate(lambda: served.append("t/#")) is True  # not loaded: waits

    router.publish(Message("t/cleared", b"", 1, True))  # cleared here while the snapshot travels
    router.publish(Message("t/newer", b"new", 1, True))
    sync._apply(
        [
            Message("t/cleared", b"stale", 1, True),
            Message("t/newer", b"old", 1, True),
            Message("t/other", b"from the peer", 1, True),
        ]
    )
    sync._loaded("test")

    assert {topic: m.payload for topic, m in router.retained.items()} == {
        "t/newer": b"new",
        "t/other": b"from the peer",
    }
    assert served == ["t/#"]
    assert sync.retained_gate(lambda: served.append("again")) is False  # loaded: served at once
    router.publish(Message("t/later", b"set after loading", 1, True))
    assert router.retained.count == 3  # changes after loading are the router's alone


def test_a_large_retained_set_travels_in_pages_in_topic_order_each_going_on_after_the_last_topic():
    entries = sorted((f"t/{n:02}", Message(f"t/{n:02}", b"x" * 40, 1, True)) for n in range(10))
    pages: list[list[str]] = []
    after, more = "", True
    while more:
        page, more = snapshot_page(entries, after, page_bytes=100)
        pages.append([topic for topic, _ in page])
        after = page[-1][0]
    assert pages == [["t/00", "t/01"], ["t/02", "t/03"], ["t/04", "t/05"], ["t/06", "t/07"], ["t/08", "t/09"]]
    huge = [("big", Message("big", b"x" * 1000, 1, True))]
    assert snapshot_page(huge, "", page_bytes=100) == (huge, False)  # one message always fits
    assert snapshot_page(entries, "t/09", page_bytes=100) == ([], False)
