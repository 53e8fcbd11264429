"""The engine of a cluster member without its runtime: a real ``BrokerCore`` (router, PUBLISH path) on the
running event loop, with a log in memory that is durable at the end of each loop iteration. Cluster parts
are tested over it with peer links in memory: no socket, no etcd, no broker process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker_edge.config import load_dataclass
from broker_edge.engine.connection.inbound import Inbound
from broker_edge.engine.connection.states import CONNECTED
from broker_edge.engine.core import BrokerCore
from broker_edge.observe.metrics import BrokerMetrics
from broker_edge.settings.broker import BrokerConfig
from tests.unit.broker_edge.engine.stand_ins import MemoryLog


class EngineOnLoop(BrokerCore):
    """A ``BrokerCore`` whose primitives are the running loop's, logging into ``log``."""

    def __init__(self) -> None:
        super().__init__(load_dataclass(BrokerConfig, {}), BrokerMetrics())
        self.loop = asyncio.get_running_loop()
        self.log = MemoryLog(durable_soon=self.loop.call_soon)
        self.publish_path.attach_store(self.log, None)

    def now(self) -> float:
        return self.loop.time()

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.loop.call_soon(callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> None:
        self.loop.call_later(delay, callback)


class Answers:
    """A publisher the PUBLISH path answers (a device as it sees it): each answer by packet id."""

    def __init__(self, v5: bool = True) -> None:
        self.v5 = v5
        self.state = CONNECTED
        self.inbound: Inbound | None = None
        self.answers: dict[int, tuple[int, str | None]] = {}
        self.closed = False
        self.answered = asyncio.Event()

    @property
    def started_inbound(self) -> Inbound:
        if self.inbound is None:
            self.inbound = Inbound(None)
        return self.inbound

    def send_puback(self, packet_id: int, reason_code: int = 0, reason_string: str | None = None) -> None:
        self.answers[packet_id] = (reason_code, reason_string)
        self.answered.set()

    send_pubrec = send_puback

    def send_pubacks(self, packet_ids: list[int], reason_code: int = 0) -> None:
        for packet_id in packet_ids:
            self.send_puback(packet_id, reason_code)

    def release_qos2(self, packet_id: int) -> None:
        pass

    def close(self, reason_code: int | None = None, reason_string: str | None = None) -> None:
        self.closed = True
        self.answered.set()
