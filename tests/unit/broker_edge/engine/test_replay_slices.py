"""Replays positioned and cursors forgotten a slice per loop turn: the same deliveries as if done at once.

A filter matching many logs is positioned over several turns of the loop (``cursors.TURN_BUDGET_S``; 0 here:
one step per turn). Meanwhile live messages of the logs it matches are held back and read from the log
after the SUBACK, so nothing is delivered before it, twice, or not at all; dropping the cursors after
UNSUBSCRIBE takes turns too, and the UNSUBACK waits for it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker_edge.engine import cursors
from broker_edge.engine.cursors import ReplayManager
from broker_edge.engine.message import Message
from broker_edge.engine.routing.router import Router
from broker_edge.engine.routing.subscriptions import SubscriptionOptions
from broker_edge.protocol.topics import EARLIEST, LATEST, OffsetStart, OffsetStartKind
from broker_edge.security.limits import LimitsConfig
from broker_edge.storage import LogStore, StorageConfig
from tests.unit.broker_edge.engine.stand_ins import RecordingConnection

TOPICS = [f"t/{n:02}" for n in range(12)]
SUBACK = ("SUBACK",)


def _row(payload: bytes) -> tuple:
    return (payload, 0, False, "p", (), None, None, None, None, None)


class Stand:
    """A store whose logs ``TOPICS`` hold the records ``<topic>#0`` .. ``#2``, and a router reading it on the
    loop."""

    def __init__(self, path: Path) -> None:
        self.store = LogStore(path, StorageConfig(durability="none"))
        self.store.open()
        self.router = Router(LimitsConfig())
        self.replays = self.router.replays = ReplayManager(
            self.store, asyncio.get_running_loop(), self.router.count_drop
        )

    async def fill(self) -> None:
        for topic in TOPICS:
            self.store.append_batch(topic, [_row(f"{topic}#{n}".encode()) for n in range(3)])
        await self.store.wait_durable()

    async def live(self, topic: str) -> None:
        """The message ``<topic>#live`` appended, durable, then routed (the PUBLISH path's order)."""
        payload = f"{topic}#live".encode()
        self.store.append_batch(topic, [_row(payload)])
        await self.store.wait_durable()
        offset = self.store.log_info(topic).end_offset - 1
        self.router.publish(Message(topic, payload, 0, origin="p", offset=offset))

    def subscriber(self, name: str, start: OffsetStart) -> list[tuple]:
        """A session subscribing to ``t/#`` from ``start``: its SUBACK is recorded among its deliveries (then
        it is pumped, as the SUBSCRIBE handler does). Returns what it was sent."""
        session = self.router.restore_session(name, 300, None, None)
        connection = RecordingConnection()
        session.attach(connection)
        self.router.subscribe(session, "t/#", "t/#", None, SubscriptionOptions(qos=0))
        outside = self.replays.start(session, "t/#", start)

        def acknowledge() -> None:
            connection.sent.append(SUBACK)
            self.replays.pump(session)

        if not self.replays.when_started(session, outside, acknowledge):
            acknowledge()
        return connection.sent


def _by_topic(sent: list[tuple]) -> dict[str, list[str]]:
    """Deliveries after the SUBACK, by topic, in order (``<topic>#<what>`` → ``what``)."""
    out: dict[str, list[str]] = {}
    for entry in sent[1:]:
        topic, what = entry[0].decode().split("#")
        out.setdefault(topic, []).append(what)
    return out


async def _turns(count: int) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


def test_a_replay_positioned_over_many_turns_delivers_what_one_positioned_at_once_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        stand = Stand(tmp_path / "log")
        await stand.fill()
        at_once = stand.subscriber("at-once", EARLIEST)  # within a turn's budget: done at once
        assert at_once[0] == SUBACK and _by_topic(at_once) == {topic: ["0", "1", "2"] for topic in TOPICS}

        monkeypatch.setattr(cursors, "TURN_BUDGET_S", 0.0)  # one step per turn from here on
        sliced = stand.subscriber("sliced", EARLIEST)
        assert sliced == []  # being positioned: no SUBACK yet
        await _turns(3)  # the listing and the first logs are positioned, not the last ones
        assert sliced == []
        await stand.live("t/00")  # positioned already: read from the log after the SUBACK
        await stand.live("t/11")  # not positioned yet: held back, then read from the log
        await stand.live("t/05a")  # created meanwhile, not in the listing: read from its first message held
        await _turns(len(TOPICS) + 5)

        assert sliced[0] == SUBACK, "nothing is delivered before the SUBACK"
        expected = {topic: ["0", "1", "2"] for topic in TOPICS}
        expected["t/00"].append("live")
        expected["t/11"].append("live")
        expected["t/05a"] = ["live"]
        assert _by_topic(sliced) == expected, "every record once, in order, the live ones included"
        assert _by_topic(at_once) == expected  # the same as the replay positioned at once, then live
        stand.store.close()

    asyncio.run(scenario())


def test_live_messages_of_a_log_not_yet_positioned_are_not_lost_from_latest_or_a_later_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        stand = Stand(tmp_path / "log")
        await stand.fill()
        monkeypatch.setattr(cursors, "TURN_BUDGET_S", 0.0)
        latest = stand.subscriber("latest", LATEST)
        beyond = stand.subscriber("beyond", OffsetStart(OffsetStartKind.OFFSET, 9))
        await stand.live("t/11")  # before either replay reached t/11
        await _turns(2 * len(TOPICS) + 10)
        assert latest[0] == SUBACK and _by_topic(latest) == {"t/11": ["live"]}  # as if positioned at once
        assert beyond[0] == SUBACK and _by_topic(beyond) == {"t/11": ["live"]}  # 9 is past every end
        stand.store.close()

    asyncio.run(scenario())


def test_dropping_many_cursors_after_unsubscribe_takes_turns_and_the_unsuback_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        stand = Stand(tmp_path / "log")
        await stand.fill()
        session = stand.router.restore_session("offline", 300, None, None)  # nothing reads its cursors
        stand.router.subscribe(session, "t/#", "t/#", None, SubscriptionOptions(qos=1))
        assert stand.replays.start(session, "t/#", EARLIEST) == []
        assert session.cursors == dict.fromkeys(TOPICS, 0)

        monkeypatch.setattr(cursors, "TURN_BUDGET_S", 0.0)
        assert stand.router.unsubscribe(session, "t/#")
        done: list[bool] = []
        assert stand.replays.when_forgotten(session, lambda: done.append(True))
        await _turns(3)
        assert not done and session.cursors, "a cursor per turn"
        await _turns(len(TOPICS) + 2)
        assert done == [True] and session.cursors is None
        assert not stand.replays.when_forgotten(session, lambda: None)  # nothing left to wait for
        stand.store.close()

    asyncio.run(scenario())
