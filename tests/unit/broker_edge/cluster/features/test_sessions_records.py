"""The session registry's records as plain data: what a broker writes for a client id, what another broker
reads back to publish its will or to go on with its session."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from broker_edge.cluster.features.sessions_records import (
    SavedWill,
    SessionRecord,
    restore_saved_session,
    saved_session,
    will_message,
    will_to_save,
)
from broker_edge.engine.message import Message
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.engine.sessions.session import NEVER_EXPIRES, Inflight
from broker_edge.log_info import LogInfo
from broker_edge.protocol.packets import Will
from broker_edge.protocol.properties import Properties
from broker_edge.protocol.topics import topic_matches
from broker_edge.security.limits import LimitsConfig


def test_a_record_reads_back_as_written():
    will = SavedWill(b"\x02\x00\x00\x00\x00", 30, 1_700_000_000.5)
    record = SessionRecord("b2", 7, "alice", 3600, will, {"client_id": "dev"}, 1_700_000_001.0)

    assert SessionRecord.from_json(record.to_json()) == record
    assert record.persistent and record.held_by("b2", 7) and not record.held_by("b2", 6)
    assert SessionRecord.from_json(record.without_will().to_json()).will is None


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (b'{"node": 1, "generation": 1, "owner": null, "expiry_interval": 0}', "node"),
        (b'{"node": "a", "generation": true, "owner": null, "expiry_interval": 0}', "generation"),
        (b'{"node": "a", "generation": 1, "owner": 5, "expiry_interval": 0}', "owner"),
        (b'{"node": "a", "generation": 1, "owner": null, "expiry_interval": 0, "state": []}', "state"),
        (
            b'{"node": "a", "generation": 1, "owner": null, "expiry_interval": 0, "will": {"delay": 1}}',
            "publish",
        ),
        (b"[]", "record"),
    ],
)
def test_a_bad_record_is_refused_naming_its_field(text, field):
    with pytest.raises(ValueError, match=field):
        SessionRecord.from_json(text)


def test_a_will_keeps_its_publish_and_its_delay_never_outlasts_the_session():
    properties = Properties(will_delay_interval=60, message_expiry_interval=120, content_type="text/plain")
    properties.user_properties = [("site", "north")]
    will = Will("status/dev-1", b"offline", 1, True, properties)

    saved = will_to_save(will, "dev-1", 60, 3600, now=time.monotonic())
    read_back = SessionRecord.from_json(_record_with(saved).to_json()).will
    assert read_back is not None
    message = will_message(read_back, now=500.0)

    assert (message.topic, message.payload, message.qos, message.retain) == (
        "status/dev-1",
        b"offline",
        1,
        True,
    )
    assert message.origin == "dev-1"
    assert message.properties is not None and message.properties.content_type == "text/plain"
    assert message.properties.user_properties == [("site", "north")]
    assert message.expires_at == 500.0 + 120  # the whole Message Expiry Interval, from its publication
    assert saved.delay == 60
    assert will_to_save(will, "dev-1", 60, 10, 0.0).delay == 10  # the session ends first: sent then
    assert will_to_save(will, "dev-1", 60, 0, 0.0).delay == 0  # no session after the connection
    assert will_to_save(will, "dev-1", 60, NEVER_EXPIRES, 0.0).delay == 60
    assert saved.due(1000.0) == 1060.0 and SavedWill(saved.publish, 60, 5.0).due(1000.0) == 5.0


def _record_with(will: SavedWill) -> SessionRecord:
    return SessionRecord("a", 1, None, 60, will)


def _router_with_session() -> tuple[Router, Message]:
    router = Router(LimitsConfig())
    session, _ = router.open_session("dev-1", False, 3600, 0.0)
    session.username = "alice"
    session.log_offsets = True
    router.subscribe(session, "plant/#", "plant/#", None, SubscriptionOptions(1))
    router.subscribe(session, "news", "news", None, SubscriptionOptions(0))
    router.subscribe(session, "$share/g/jobs", "jobs", "g", SubscriptionOptions(1))
    in_flight = Message("plant/a", b"x", 1, offset=41)
    session.inflight = Inflight({5: (in_flight, 1, False, ())})
    return router, in_flight


def _logs_of(ends: dict[str, int]) -> Callable[[str], list[LogInfo]]:
    """``LogStore.logs(pattern=...)`` of a store whose logs end at ``ends``."""
    return lambda topic_filter: [
        LogInfo(topic, 0, end, 0, None) for topic, end in ends.items() if topic_matches(topic_filter, topic)
    ]


_logs = _logs_of({"plant/a": 50, "plant/b": 12, "news": 99, "jobs": 7})


def test_a_saved_session_reads_every_topic_after_its_last_acknowledgement():
    router, _ = _router_with_session()

    state = saved_session(router.sessions["dev-1"], _logs, now=0.0)

    # plant/a from the message still in flight, plant/b from its end; QoS 0 and shared ones are not read back
    assert state["cursors"] == {"plant/a": 41, "plant/b": 12}
    router.sessions["dev-1"].expires_at = 100.0  # offline, counting down: the document does not change
    assert saved_session(router.sessions["dev-1"], _logs, now=1.0) == state
    other = Router(LimitsConfig())
    now_there = {"plant/a": 60, "plant/b": 15, "plant/c": 3, "news": 120}
    assert restore_saved_session(other, state, _logs_of(now_there), 0.0, 86_400)
    restored = other.sessions["dev-1"]
    assert restored.username == "alice" and restored.log_offsets and not restored.online
    assert set(restored.subscriptions or {}) == {"plant/#", "news", "$share/g/jobs"}
    # a topic created after the save is read from its start
    assert restored.cursors == {"plant/a": 41, "plant/b": 12, "plant/c": 0}


def test_a_restored_session_keeps_only_what_the_acl_allows_now():
    router, _ = _router_with_session()
    state = saved_session(router.sessions["dev-1"], _logs, now=0.0)
    other = Router(LimitsConfig())

    restore_saved_session(
        other, state, _logs_of({}), 0.0, 86_400, lambda client, user, filter: filter != "news"
    )

    assert set(other.sessions["dev-1"].subscriptions or {}) == {"plant/#", "$share/g/jobs"}


def test_a_saved_session_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="missing"):
        restore_saved_session(Router(LimitsConfig()), {"username": None}, _logs_of({}), 0.0, 60)
