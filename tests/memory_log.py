"""A commitlog in memory for tests of the PUBLISH path: no files, durable when the test says so."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from broker_edge.storage.record import RecordFields


class MemoryLog:
    """A ``PublishStore`` in memory: appends at once, durable only when ``make_durable`` is called (or, given
    ``durable_soon``, at the end of the loop iteration it is asked in, as a store that keeps up)."""

    def __init__(self, durable_soon: Callable[[Callable[[], object]], object] | None = None) -> None:
        self.logs: dict[str, list[RecordFields]] = {}
        self.waiting: list[Callable[[], object]] = []
        self.durable_soon = durable_soon

    def should_persist(self, topic: str, qos: int) -> bool:
        return qos > 0

    def append_batch(self, topic: str, records: Sequence[RecordFields]) -> int:
        log = self.logs.setdefault(topic, [])
        first = len(log)
        log.extend(records)
        return first

    def when_durable(
        self, callback: Callable[[], object], on_error: Callable[[BaseException], object] | None = None
    ) -> None:
        if self.durable_soon is not None:
            self.durable_soon(callback)
        else:
            self.waiting.append(callback)

    def make_durable(self) -> None:
        waiting, self.waiting = self.waiting, []
        for callback in waiting:
            callback()

    def logs_created_by(self, client_id: str) -> int:
        return 0

    def __contains__(self, topic: object) -> bool:
        return topic in self.logs
